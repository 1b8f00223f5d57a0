// The norm screen of a round's answers (docs/protocol.md §10): pure, no SyncerState, table-tested
// (tests/syncer/screening_test.cc). The syncer's merge (syncer_merge.cc, step 2) calls it with each answer's size
// per unit of inner learning rate and acts on the verdicts: refuse, scale down (clip), or keep.
//
// The rule: an answer whose ‖Δ‖ per unit of lr is ≥ screen_ratio × the lower median of the round's other answers
// and the fragment's recent merged answers is refused; above clip_ratio × that median it is scaled down to it. With
// fewer than two reference values there is nothing to compare with. A raw θ (a learner re-anchoring after the
// syncer came back with an older history) honestly carries the merges it lost besides its own steps: it is scaled
// down to screen_ratio × the median, never refused, and it is never a reference for the others.
//
// Deliberately not here: computing the norms (they depend on the lr schedule and the error-feedback allowance, which
// the syncer's records hold), counting refusals, events.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

namespace dloco {

/// One answer as the screen sees it.
struct ScreenEntry {
  int64_t steps = 0;      // inner steps it trained; ≤ 0: no weight and no norm, never screened or a reference
  double per_step = -1;   // its size screened: ‖Δ‖ (less the error-feedback allowance) / Σ lr(t) over its steps;
                          // < 0: not comparable (lr 0, non-finite)
  double reference = -1;  // its size as others' reference (without the allowance); < 0: kept out (a joiner
                          // re-warming its lr, non-finite)
  bool raw = false;       // a raw θ (re-anchoring): clipped at screen_ratio, never refused, never a reference
};

enum class ScreenAction { kKeep, kRefuse, kClip };

/// The screen's verdict on one answer. For kClip the caller multiplies the outer gradient by `scale`.
struct ScreenVerdict {
  ScreenAction action = ScreenAction::kKeep;
  double ratio = -1;   // per_step / median; −1 when it was not compared (no steps, not comparable, < 2 references)
  double median = -1;  // the reference median it was compared with
  double scale = 1;    // kClip: clip_to / ratio
  double clip_to = 0;  // kClip: the ratio it was scaled down to
};

struct ScreenResult {
  std::vector<ScreenVerdict> verdicts;  // one per entry, in order
  double largest_ratio = 0;  // of the answers kept, after clipping: how close an honest round comes to the screen
};

/// Screens `entries` in order against each other and `recent_norms` (the fragment's last merged answers'
/// references). A clipped entry's per_step and reference are scaled in `entries` before the next entry is screened
/// (the later ones are compared with its clipped size); a refused one stays a reference for the later ones.
/// screen_ratio ≤ 0 turns refusal off, clip_ratio ≤ 0 clipping; both off (or `enabled` false: diloco.blocking)
/// keeps every answer. Never throws.
ScreenResult screen_answers(std::vector<ScreenEntry>& entries, const std::deque<double>& recent_norms,
                            double screen_ratio, double clip_ratio, bool enabled = true);

}  // namespace dloco
