// Fuzz target: stream logs (data/stream_log.h, run_dir/streams/stream_<s>.jsonl: what a restarted learner and a
// chaos report read). Input: the file's bytes. Read as a chaos report does (read_stream_log, then the exactly-once
// check) and as a restarted learner does (StreamLog: drop a torn line, find the last batch taken, append one):
// each refuses with InputError or takes the file.
#include <cstdint>

#include "core/check.h"
#include "data/stream_log.h"
#include "fuzz/fuzz_support.h"

using namespace dloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "stream_0.jsonl";
  fuzz::write_bytes(path, fuzz::as_text(data, size));
  try {
    int version = -1;
    const auto records = read_stream_log(path, &version);
    (void)check_stream_log(records, 64);
  } catch (const InputError&) {
  }
  try {
    StreamLog log(path);
    StreamCursor next = log.last_taken().value_or(StreamCursor{});
    if (next.tokens_served < (int64_t{1} << 62)) next.tokens_served += 64;
    log.take(next, 0, 1);
  } catch (const InputError&) {
  }
  return 0;
}
