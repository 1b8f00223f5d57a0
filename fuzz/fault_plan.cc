// Fuzz target: fault plans (chaos/fault_plan.h, the TOML files under plans/ that `dloco chaos` and the launcher
// read). Input: the TOML text. Refused with InputError or parsed; a parsed plan is then resolved for 4 learners
// (its random faults drawn) and written as JSON, as a chaos run does.
#include <cstdint>

#include "chaos/fault_plan.h"
#include "core/check.h"
#include "fuzz/fuzz_support.h"

using namespace dloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16 * 1024) return 0;
  try {
    const FaultPlan plan = parse_fault_plan(fuzz::as_text(data, size), "fuzz");
    (void)plan.resolve(4);
    (void)plan.to_json(4).dump();
  } catch (const InputError&) {
  }
  return 0;
}
