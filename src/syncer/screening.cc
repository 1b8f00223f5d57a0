// The norm screen (docs/protocol.md §10); see screening.h.
#include "syncer/screening.h"

#include <algorithm>

namespace dloco {

namespace {

// The lower median (the smaller middle value of an even count): one large outlier among two values cannot raise it.
double lower_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

ScreenResult screen_answers(std::vector<ScreenEntry>& entries, const std::deque<double>& recent_norms,
                            double screen_ratio, double clip_ratio, bool enabled) {
  ScreenResult result;
  result.verdicts.resize(entries.size());
  if (!enabled || (screen_ratio <= 0 && clip_ratio <= 0)) return result;
  for (size_t i = 0; i < entries.size(); ++i) {
    ScreenEntry& e = entries[i];
    if (e.steps <= 0 || e.per_step < 0) continue;
    std::vector<double> ref(recent_norms.begin(), recent_norms.end());
    for (size_t j = 0; j < entries.size(); ++j) {
      const ScreenEntry& o = entries[j];
      if (j != i && o.steps > 0 && o.reference >= 0 && !o.raw) ref.push_back(o.reference);
    }
    if (ref.size() < 2) continue;
    const double median = lower_median(ref);
    if (!(median > 0)) continue;
    ScreenVerdict& v = result.verdicts[i];
    v.ratio = e.per_step / median;
    v.median = median;
    const bool over_screen = screen_ratio > 0 && v.ratio >= screen_ratio;
    if (!over_screen) {
      result.largest_ratio = std::max(result.largest_ratio, std::min(v.ratio, clip_ratio > 0 ? clip_ratio : v.ratio));
    }
    const double clip_at = e.raw && over_screen ? screen_ratio : clip_ratio;
    if (over_screen && !e.raw) {
      v.action = ScreenAction::kRefuse;
    } else if (clip_at > 0 && v.ratio > clip_at) {
      v.action = ScreenAction::kClip;
      v.clip_to = clip_at;
      v.scale = static_cast<double>(static_cast<float>(clip_at / v.ratio));
      e.per_step *= v.scale;
      e.reference *= v.scale;
    }
  }
  return result;
}

}  // namespace dloco
