// Jittered exponential backoff, deterministic for a seed.
#include "core/backoff.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "core/check.h"
#include "core/splitmix.h"

namespace dloco {

uint64_t mix_backoff_seed(uint64_t pid, uint64_t time_ns, uint64_t counter) {
  // Chained, not xor-ed: (pid, time) and (pid ^ d, time ^ d) must not collide.
  return splitmix64(splitmix64(splitmix64(pid) ^ time_ns) ^ counter);
}

uint64_t process_backoff_seed() {
  static std::atomic<uint64_t> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return mix_backoff_seed(static_cast<uint64_t>(::getpid()),
                          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()),
                          counter.fetch_add(1, std::memory_order_relaxed));
}

uint64_t backoff_seed_for(uint64_t id, uint64_t salt) { return splitmix64(splitmix64(id) ^ splitmix64(~salt)); }

Backoff::Backoff(const BackoffConfig& config) : config_(config), rng_(config.seed) {
  if (config.initial.count() <= 0) {
    throw InputError("backoff initial delay must be > 0 us, got " + std::to_string(config.initial.count()));
  }
  if (config.max < config.initial) {
    throw InputError("backoff max delay (" + std::to_string(config.max.count()) + " us) must be >= initial (" +
                     std::to_string(config.initial.count()) + " us)");
  }
  if (!(config.multiplier >= 1.0) || !std::isfinite(config.multiplier)) {
    throw InputError("backoff multiplier must be >= 1, got " + std::to_string(config.multiplier));
  }
  if (!(config.jitter >= 0.0 && config.jitter < 1.0)) {
    throw InputError("backoff jitter must be in [0, 1), got " + std::to_string(config.jitter));
  }
}

std::chrono::microseconds Backoff::next_delay() {
  const double max_us = static_cast<double>(config_.max.count());
  const double base_us =
      std::min(max_us, static_cast<double>(config_.initial.count()) * std::pow(config_.multiplier, attempt_));
  // u in [0, 1) from the top 53 bits: the same on every platform for a seed.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  const double jittered = base_us * (1.0 + config_.jitter * (2.0 * u - 1.0));
  ++attempt_;
  return std::chrono::microseconds(static_cast<int64_t>(std::clamp(jittered, 0.0, max_us)));
}

}  // namespace dloco
