// The one check that a floating-point number from outside (a TOML or JSON float such as 2e6) names an int64: casting
// one that is not finite, not whole, or outside int64's range is undefined behaviour (found by the fuzzers of
// fuzz/stream_log.cc and fuzz/fault_plan.cc). Used by core/json_read.cc, core/config_fields.h, chaos/fault_plan.cc.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

namespace dloco {

/// `d` as an int64 when it is finite, has no fractional part and lies in the open interval (−2^63, 2^63) (2^63 is
/// exact in a double, so the bound is exact); nullopt otherwise.
inline std::optional<int64_t> whole_int64(double d) {
  if (std::isfinite(d) && d == std::trunc(d) && d > -9223372036854775808.0 && d < 9223372036854775808.0) {
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

}  // namespace dloco
