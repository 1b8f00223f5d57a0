// The compressed downlink of a merged fragment (docs/protocol.md §9): the outer update U = Θ_p − Θ_p^prev encoded
// with diloco.wire_down (with error feedback: plus what the codec dropped from the last U of p), and Θ_p replaced by
// the canonical Θ_p^prev + Û that every learner rebuilds. Pure (no SyncerState): the merge's step 5.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "transport/codec.h"

namespace dloco {

/// What encode_downlink did.
struct Downlink {
  bool whole = true;    // Θ_p goes whole (fp32, or an update the codec cannot carry): `update` is empty
  wire::Payload update; // !whole: Û, to apply to Θ_p^prev (version − 1)
  std::string reason;   // whole after a failed encoding: why (the event "downlink_whole" says it)
};

/// Encodes U = `theta` − `previous` as `codec` and, on success, sets `theta` to previous + Û. `feedback` (diloco's
/// error_feedback on) carries the residual between merges of this fragment, as `decay`·e (diloco.error_feedback_decay);
/// nullptr encodes U alone; topk keeps one value in `density` (diloco.topk_density). A non-finite
/// U (the integer codecs cannot carry it) or an update that does not apply leaves `theta` as it was, resets
/// `feedback` and returns whole with the reason. codec = fp32 or a non-finite `theta`: whole, no reason, nothing
/// changed. Sizes: `theta` and `previous` are fragment-sized (DLOCO_CHECK).
Downlink encode_downlink(std::span<const float> previous, std::vector<float>& theta, wire::Codec codec,
                         wire::ErrorFeedback* feedback, double decay = 1.0, int64_t density = 0);

}  // namespace dloco
