// The syncer's pure decisions: global clock, liveness, quorum and grace window (docs/protocol.md §4, §5).
#include "core/decisions.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/check.h"
#include "core/fragments.h"

namespace dloco {
namespace {

std::string ordinal(int k) {
  const int mod100 = k % 100, mod10 = k % 10;
  const char* suffix = (mod100 >= 11 && mod100 <= 13) ? "th" : mod10 == 1 ? "st" : mod10 == 2 ? "nd" : mod10 == 3 ? "rd" : "th";
  return std::to_string(k) + suffix;
}

std::string plural(int n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

void check_quorum_size(int K) {
  if (K < 1) throw InputError("minimum quorum K must be >= 1, got " + std::to_string(K));
}

}  // namespace

double lease_s(const LearnerState& learner, const LeaseConfig& lease) {
  return std::max(lease.step_multiple * learner.step_time_s, lease.min_lease_s);
}

bool is_live(const LearnerState& learner, double now_s, const LeaseConfig& lease) {
  return learner.joined && now_s - learner.last_seen_s < lease_s(learner, lease);
}

ClockDecision advance_global_clock(int64_t previous, std::span<const LearnerState> learners, double now_s, int K,
                                   const LeaseConfig& lease) {
  check_quorum_size(K);
  if (previous < 0) throw InputError("global step must be >= 0, got " + std::to_string(previous));
  std::vector<int64_t> steps;
  for (const LearnerState& l : learners) {
    if (is_live(l, now_s, lease)) steps.push_back(l.step);
  }
  ClockDecision d;
  d.live = static_cast<int>(steps.size());
  d.global_step = previous;
  if (d.live < K) {
    d.reason = "t stays " + std::to_string(previous) + ": " + plural(d.live, "live learner") + ", quorum K = " +
               std::to_string(K);
    return d;
  }
  std::nth_element(steps.begin(), steps.begin() + (K - 1), steps.end(), std::greater<int64_t>());
  const int64_t kth = steps[K - 1];
  const std::string which = ordinal(K) + " largest step of " + plural(d.live, "live learner") + " is " +
                            std::to_string(kth);
  if (kth > previous) {
    d.global_step = kth;
    d.advanced = true;
    d.reason = "t " + std::to_string(previous) + " -> " + std::to_string(kth) + ": " + which;
  } else {
    d.reason = "t stays " + std::to_string(previous) + ": " + which;
  }
  return d;
}

std::vector<int64_t> due_steps_crossed(int p, int64_t from_exclusive, int64_t to_inclusive, int H, int P) {
  validate_schedule(H, P);
  const int64_t offset = fragment_offset(p, H, P);
  std::vector<int64_t> due;
  if (to_inclusive <= from_exclusive) return due;
  // First u > from_exclusive with u ≡ offset (mod H).
  const int64_t r = ((from_exclusive - offset) % H + H) % H;  // (from − S_p) mod H
  for (int64_t u = from_exclusive + (H - r); u <= to_inclusive; u += H) due.push_back(u);
  return due;
}

std::vector<DueRound> due_rounds_crossed(int64_t from_exclusive, int64_t to_inclusive, int H, int P) {
  validate_schedule(H, P);
  std::vector<DueRound> rounds;
  for (int p = 0; p < P; ++p) {
    for (int64_t u : due_steps_crossed(p, from_exclusive, to_inclusive, H, P)) rounds.push_back({u, p});
  }
  std::sort(rounds.begin(), rounds.end(), [](const DueRound& a, const DueRound& b) {
    return a.step != b.step ? a.step < b.step : a.fragment < b.fragment;
  });
  return rounds;
}

Ema::Ema(double decay) : decay_(decay) {
  if (!(decay >= 0.0 && decay < 1.0)) throw InputError("EMA decay must be in [0, 1), got " + std::to_string(decay));
}

void Ema::update(double x) {
  value_ = has_value_ ? decay_ * value_ + (1.0 - decay_) * x : x;
  has_value_ = true;
}

double grace_window_s(double tau_steps, double slowest_step_s, double quorum_s, double sync_s, double gamma) {
  if (!(tau_steps >= 0 && slowest_step_s >= 0 && quorum_s >= 0 && sync_s >= 0)) {
    throw InputError("grace window inputs must be >= 0 (tau " + std::to_string(tau_steps) + ", step " +
                     std::to_string(slowest_step_s) + " s, quorum " + std::to_string(quorum_s) + " s, sync " +
                     std::to_string(sync_s) + " s)");
  }
  if (!(gamma >= 0.0 && gamma <= 1.0)) throw InputError("grace gamma must be in [0, 1], got " + std::to_string(gamma));
  const double slack = tau_steps * slowest_step_s - (quorum_s + sync_s);  // ξ_slack
  return std::max(0.0, gamma * slack);
}

const char* to_string(MergeAction action) {
  switch (action) {
    case MergeAction::kWaitQuorum: return "wait_quorum";
    case MergeAction::kWaitGrace: return "wait_grace";
    case MergeAction::kPullNow: return "pull_now";
  }
  return "unknown";
}

MergeDecision decide_merge(const RoundState& round, std::span<const LearnerState> learners, double now_s,
                           const QuorumConfig& config, const Timings& timings) {
  check_quorum_size(config.K);
  MergeDecision d;
  const std::string at = "fragment " + std::to_string(round.fragment) + " step " + std::to_string(round.due_step);

  // 1. Participants: live learners that reached u. The slowest live step time sizes the grace window.
  double slowest_step_s = 0.0;
  int absent = 0;
  for (const LearnerState& l : learners) {
    if (!is_live(l, now_s, config.lease)) {
      ++absent;
      continue;
    }
    ++d.live;
    slowest_step_s = std::max(slowest_step_s, l.step_time_s);
    if (l.step >= round.due_step) d.participants.push_back(l.id);
  }
  std::sort(d.participants.begin(), d.participants.end());
  const int ready = static_cast<int>(d.participants.size());
  const int lagging = d.live - ready;
  const std::string quorum = "quorum " + std::to_string(ready) + "/" + std::to_string(config.K);

  if (ready < config.K) {
    d.action = MergeAction::kWaitQuorum;
    d.reason = quorum + " at " + at + ": " + std::to_string(ready) + " of " + plural(d.live, "live learner") +
               " reached it" + (absent ? ", " + std::to_string(absent) + " absent" : "");
    return d;
  }
  // 2. Nobody left to wait for.
  if (lagging == 0) {
    d.action = MergeAction::kPullNow;
    d.reason = quorum + " reached at " + at + "; all " + plural(d.live, "live learner") + " ready, pull now";
    return d;
  }
  // 3. Grace window, counted from the moment the quorum was first reached.
  if (!config.grace) {
    d.action = MergeAction::kPullNow;
    d.reason = quorum + " reached at " + at + "; grace off, pull now without " + plural(lagging, "lagging learner");
    return d;
  }
  d.grace_s = grace_window_s(config.tau_steps, slowest_step_s, timings.quorum_s, timings.sync_s, config.gamma);
  const double start_s = round.quorum_since_s >= 0.0 ? round.quorum_since_s : now_s;
  d.grace_deadline_s = start_s + d.grace_s;
  const double left_s = d.grace_deadline_s - now_s;
  if (left_s > 0.0) {
    d.action = MergeAction::kWaitGrace;
    d.reason = quorum + " reached at " + at + "; grace " + seconds_text(left_s) + " left for " +
               std::to_string(lagging) + " more live learner" + (lagging == 1 ? "" : "s");
    return d;
  }
  d.action = MergeAction::kPullNow;
  d.reason = quorum + " reached at " + at + "; grace window of " + seconds_text(d.grace_s) + " closed, pull " +
             std::to_string(ready) + " of " + plural(d.live, "live learner");
  return d;
}

}  // namespace dloco
