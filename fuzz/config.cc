// Fuzz target: TOML configs (core/config.h parse_config, what `dloco train/syncer/learner --config` reads).
// Input: the TOML text. A config is refused with InputError or parsed; anything else (another exception, a
// crash, UB) is a finding. A parsed config is also written as JSON (the run folder's config.json).
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/config.h"
#include "fuzz/fuzz_support.h"

using namespace dloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16 * 1024) return 0;
  try {
    const Config config = parse_config(std::string(fuzz::as_text(data, size)), {}, "fuzz");
    (void)to_json(config).dump();
  } catch (const InputError&) {
  }
  return 0;
}
