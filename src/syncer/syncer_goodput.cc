// The syncer's account of work kept and lost, for goodput (docs/monitoring.md "status.json": goodput, tokens_lost):
// a learner's per-fragment token counters, seen in its reports, against the merges that took its answers. Pure
// bookkeeping of SyncerState; the ratio itself is SyncerService::goodput (syncer_status.cc).
#include <algorithm>

#include "syncer/syncer_state.h"

namespace dloco {

// Work thrown away: a counter that went back (the learner applied a merge of that fragment) although no merge took
// this learner's answer of it since its last reset. After a merge with it, the steps between its capture and the
// apply (τ) are overwritten by design: kept, as the paper counts them. The merge that took its answer is consumed by
// the reset it explains.
void SyncerState::count_lost_work(LearnerRecord& rec, const LearnerReport& report) {
  for (size_t p = 0; p < report.tokens.size() && p < rec.last.tokens.size(); ++p) {
    if (report.tokens[p] >= rec.last.tokens[p]) continue;
    if (rec.merged_unapplied.erase(static_cast<int>(p)) == 0) tokens_lost_ += rec.last.tokens[p];
  }
}

int64_t SyncerState::unmerged_tokens(const LearnerRecord& rec, size_t p) {
  if (p >= rec.last.tokens.size()) return 0;
  const auto merged = rec.merged_unapplied.find(static_cast<int>(p));
  return std::max<int64_t>(0, rec.last.tokens[p] - (merged == rec.merged_unapplied.end() ? 0 : merged->second));
}

void SyncerState::on_new_process(int learner) {
  auto it = learners_.find(learner);
  if (it == learners_.end()) return;
  LearnerRecord& rec = it->second;
  for (size_t p = 0; p < rec.last.tokens.size(); ++p) tokens_lost_ += unmerged_tokens(rec, p);
  rec.last.tokens.assign(rec.last.tokens.size(), 0);  // its counters start again: no reset to see
  rec.merged_unapplied.clear();
}

}  // namespace dloco
