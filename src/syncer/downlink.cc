// The compressed downlink (docs/protocol.md §9); see downlink.h.
#include "syncer/downlink.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace dloco {

Downlink encode_downlink(std::span<const float> previous, std::vector<float>& theta, wire::Codec codec,
                         wire::ErrorFeedback* feedback, double decay, int64_t density) {
  DLOCO_CHECK_EQ(previous.size(), theta.size());
  Downlink out;
  const bool finite = std::all_of(theta.begin(), theta.end(), [](float v) { return std::isfinite(v); });
  if (codec == wire::Codec::kFp32 || !finite) return out;
  std::vector<float> update(theta.size());
  for (size_t i = 0; i < theta.size(); ++i) update[i] = theta[i] - previous[i];
  try {
    out.update = feedback ? feedback->encode(update, codec, 0, nullptr, decay, density)
                          : wire::encode(update, codec, 0, density);
    std::vector<float> rebuilt;
    const std::string bad = wire::apply_update(previous, out.update, rebuilt);
    if (!bad.empty()) throw InputError(bad);
    theta = std::move(rebuilt);
    out.whole = false;
  } catch (const InputError& e) {  // a non-finite update: the integer codecs cannot carry it, Θ_p goes whole
    if (feedback) feedback->reset();
    out.update = {};
    out.reason = e.what();
  }
  return out;
}

}  // namespace dloco
