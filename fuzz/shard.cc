// Fuzz target: token shards (data/shards.h, the files `dloco data prepare` writes and every learner maps).
// Input: the file's bytes. The header is refused with InputError or read; a split over the file then maps it, and
// its first, middle and last tokens are read and must be below the vocabulary size it declares (a token past it
// would index past the embedding table).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/check.h"
#include "data/shards.h"
#include "fuzz/fuzz_support.h"

using namespace dloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::scratch_dir() / "shard.bin";
  fuzz::write_bytes(path, fuzz::as_text(data, size));
  try {
    (void)read_shard_header(path);
    TokenSplit split({path});
    for (int64_t i : {int64_t{0}, split.size() / 2, split.size() - 1}) {
      if (i < 0 || i >= split.size()) continue;
      if (split.token(i) < 0 || split.token(i) >= static_cast<int64_t>(split.vocab_size())) {
        std::fprintf(stderr, "token %lld of a shard is %lld, past its vocabulary of %u\n", static_cast<long long>(i),
                     static_cast<long long>(split.token(i)), split.vocab_size());
        std::abort();
      }
    }
  } catch (const InputError&) {
  }
  return 0;
}
