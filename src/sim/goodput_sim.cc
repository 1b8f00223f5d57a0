// The goodput simulator's event loop and state transitions (model: goodput_sim.h and docs/sim.md).
//
// State: every slice is active (in its group's configuration), away (failed, until its return time) or pending
// (returned, waiting for its group's next reconfiguration). Every group is running, paused (detection +
// downscale, upscale, restart or rejoin) or down (no slice left). Between two events every group's progress x
// (steps) moves linearly, so work and uptime are integrated exactly, with no per-step events.
//
// Legal group transitions:
//   running -> paused   on a failure of one of its active slices (unplanned: the step in flight is lost; dp
//                       loses back to its checkpoint), or when a batched upscale is due (planned: nothing lost)
//   running -> down     when its last active slice fails
//   paused  -> running  at the end of the pause; pending slices join
//   paused  -> down     when its last active slice fails during the pause
//   down    -> paused   when one of its slices returns (rejoin)
// Failures during a pause join the reconfiguration in progress (the pause is not extended).
#include "sim/goodput_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <vector>

#include "core/check.h"
#include "core/rng.h"

namespace dloco::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kEps = 1e-7;  // steps: tolerance when comparing fluid progress

/// Max over a fixed array of slice multipliers (0 = slice not active). Bottom-up segment tree.
class MaxTree {
 public:
  MaxTree() = default;
  explicit MaxTree(size_t n) : n_(n), t_(2 * n, 0.0) {}
  void set(size_t i, double v) {
    i += n_;
    t_[i] = v;
    for (i >>= 1; i >= 1; i >>= 1) t_[i] = std::max(t_[2 * i], t_[2 * i + 1]);
  }
  double max() const { return n_ == 0 ? 0.0 : t_[1]; }

 private:
  size_t n_ = 0;
  std::vector<double> t_;
};

enum class SliceState : uint8_t { kActive, kAway, kPending };
enum class Status : uint8_t { kRunning, kPaused, kDown };

struct Group {
  int64_t first_slice = 0;  // the group owns slices [first_slice, end_slice)
  int64_t end_slice = 0;
  Status status = Status::kRunning;
  double pause_end = kInf;    // when paused
  double upscale_due = kInf;  // when running with pending slices
  uint64_t timer_version = 0; // invalidates superseded timer events
  int64_t active_chips = 0;
  std::vector<int64_t> pending;  // returned slices waiting for the next reconfiguration
  bool state_lost = false;       // decoupled: lost its state, rejoining from the syncer
  double mult = 1.0;             // step-time multiplier of the slowest active slice
  double x = 0.0;                // progress, steps
  double x_join = 0.0;           // progress when it last (re)joined with fresh state
  double own_rate = 0.0;         // steps/s it could make now
  double rate = 0.0;             // steps/s it makes now (≤ own_rate when held back by a sync barrier)
  MaxTree speed;
};

struct Event {
  enum Kind : uint8_t { kReturn, kGroupTimer, kSyncCheck };
  double t;
  uint64_t seq;
  Kind kind;
  int64_t id;
  uint64_t version;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

class Simulator {
 public:
  explicit Simulator(const GoodputConfig& c)
      : c_(c),
        fail_rng_(c.seed, 1),
        return_rng_(c.seed, 2),
        speed_rng_(c.seed, 3),
        fatal_rng_(c.seed, 4),
        elastic_(c.method != Method::kDp),
        coupled_(c.method == Method::kDiloco || c.method == Method::kStreaming),
        decoupled_(c.method == Method::kDecoupled) {
    const int64_t n = c.slice_count();
    const int64_t groups = (c.method == Method::kDp || c.method == Method::kElasticDp) ? 1 : c.learners;
    quorum_ = decoupled_ ? c.quorum : 1;
    // Lead a synchronous group may take over the slowest one, steps: the barrier every B steps with L steps
    // of slack, relaxed to its mean (B/2 + L). DiLoCo: B = H, L = 0. Streaming: B = H/P, L = τ.
    if (c.method == Method::kDiloco) lead_ = c.inner_steps / 2.0;
    if (c.method == Method::kStreaming) lead_ = (c.inner_steps / c.fragments) / 2.0 + c.overlap_steps;
    slice_state_.assign(n, SliceState::kActive);
    slice_group_.resize(n);
    slice_mult_.assign(n, 1.0);
    if (c.speed_cv > 0) {
      for (double& m : slice_mult_) m = std::exp(c.speed_cv * speed_rng_.normal());
    }
    groups_.resize(groups);
    for (int64_t g = 0; g < groups; ++g) {
      Group& gr = groups_[g];
      gr.first_slice = g * n / groups;
      gr.end_slice = (g + 1) * n / groups;
      if (c.speed_cv > 0) gr.speed = MaxTree(gr.end_slice - gr.first_slice);
      for (int64_t s = gr.first_slice; s < gr.end_slice; ++s) {
        slice_group_[s] = static_cast<int32_t>(g);
        gr.active_chips += slice_chips(s);
        if (c.speed_cv > 0) gr.speed.set(s - gr.first_slice, slice_mult_[s]);
      }
      gr.mult = c.speed_cv > 0 ? gr.speed.max() : 1.0;
    }
  }

  GoodputResult run() {
    const double mean_gap = c_.chip_mtbf_s / static_cast<double>(c_.chips);
    // A replayed trace (sim replay of a chaos run) or the Poisson process.
    size_t traced = 0;
    auto draw_failure = [&](double after) {
      if (c_.trace.empty()) return after + fail_rng_.exponential(mean_gap);
      return traced < c_.trace.size() ? c_.trace[traced].t_s : kInf;
    };
    double next_failure = draw_failure(0.0);
    refresh_rates();
    while (true) {
      const double t_queue = queue_.empty() ? kInf : queue_.top().t;
      const double t_next = std::min(next_failure, t_queue);
      if (t_next >= c_.horizon_s) {
        advance_to(c_.horizon_s);
        break;
      }
      advance_to(t_next);
      if (next_failure <= t_queue) {
        if (c_.trace.empty()) {
          on_failure(static_cast<int64_t>(fail_rng_.below(static_cast<uint64_t>(c_.chips))), -1);
        } else {
          on_failure(c_.trace[traced].chip, c_.trace[traced].away_s, c_.trace[traced].keeps_state);
          ++traced;
        }
        next_failure = draw_failure(next_failure);
      } else {
        const Event e = queue_.top();
        queue_.pop();
        if (stale(e)) continue;  // superseded timer or barrier check: nothing changes
        dispatch(e);
      }
      ++result_.events;
      refresh_rates();
    }
    result_.allocated_chip_s = static_cast<double>(c_.chips) * c_.horizon_s;
    result_.goodput = result_.kept_chip_s / result_.allocated_chip_s;
    result_.uptime = uptime_s_ / c_.horizon_s;
    result_.mean_slices_away = away_slice_s_ / c_.horizon_s;
    return result_;
  }

 private:
  int64_t slice_chips(int64_t s) const { return std::min(c_.slice_chips, c_.chips - s * c_.slice_chips); }

  void push(double t, Event::Kind kind, int64_t id, uint64_t version) {
    queue_.push(Event{t, seq_++, kind, id, version});
  }

  // Integrates work, uptime and slices away from now_ to t; every rate is constant in between.
  void advance_to(double t) {
    const double dt = t - now_;
    DLOCO_CHECK_GE(dt, 0.0);
    if (dt > 0) {
      for (Group& g : groups_) {
        if (g.rate <= 0) continue;
        const double steps = g.rate * dt;
        g.x += steps;
        result_.kept_chip_s += steps * static_cast<double>(g.active_chips) * c_.step_s;
      }
      if (advancing_) uptime_s_ += dt;
      away_slice_s_ += static_cast<double>(away_slices_) * dt;
    }
    now_ = t;
  }

  // Discards `steps` of group g's progress, done on `chips` chips.
  void discard(Group& g, double steps, int64_t chips) {
    if (steps <= 0) return;
    const double chip_s = steps * static_cast<double>(chips) * c_.step_s;
    g.x -= steps;
    result_.kept_chip_s -= chip_s;
    result_.lost_chip_s += chip_s;
  }

  // Decoupled: the learner lost its state, so its progress not yet merged is lost. On average a fragment was
  // last captured H/2 steps ago (fragments are staggered over H steps), never more than since it joined.
  void lose_unmerged(Group& g, int64_t chips) {
    if (g.state_lost) return;
    g.state_lost = true;
    ++result_.learner_losses;
    discard(g, std::min(g.x - g.x_join, c_.inner_steps / 2.0), chips);
  }

  void set_timer(int64_t gi, double t) {
    Group& g = groups_[gi];
    ++g.timer_version;
    push(t, Event::kGroupTimer, gi, g.timer_version);
  }

  void pause(int64_t gi, double duration) {
    Group& g = groups_[gi];
    g.status = Status::kPaused;
    g.pause_end = now_ + duration;
    g.upscale_due = kInf;
    ++result_.pauses;
    set_timer(gi, g.pause_end);
  }

  void go_down(Group& g) {
    g.status = Status::kDown;
    g.pause_end = kInf;
    g.upscale_due = kInf;
    ++g.timer_version;  // drop any pending timer
  }

  // `away_s` ≥ 0: a replayed failure's time away; < 0: drawn from the return distribution.
  void send_away(int64_t s, double away_s) {
    slice_state_[s] = SliceState::kAway;
    ++away_slices_;
    double away = away_s >= 0 ? away_s : c_.return_mean_s;
    if (away_s < 0) switch (c_.return_dist) {
      case ReturnDist::kFixed: break;
      case ReturnDist::kExponential: away = return_rng_.exponential(c_.return_mean_s); break;
      case ReturnDist::kLognormal: {
        const double sigma2 = std::log1p(c_.return_cv * c_.return_cv);
        away = c_.return_mean_s * std::exp(std::sqrt(sigma2) * return_rng_.normal() - sigma2 / 2);
        break;
      }
    }
    push(now_ + away, Event::kReturn, s, 0);
  }

  void deactivate(Group& g, int64_t s, double away_s) {
    g.active_chips -= slice_chips(s);
    if (c_.speed_cv > 0) {
      g.speed.set(s - g.first_slice, 0.0);
      if (g.active_chips > 0) g.mult = g.speed.max();
    }
    send_away(s, away_s);
  }

  void join_pending(Group& g) {
    for (int64_t s : g.pending) {
      slice_state_[s] = SliceState::kActive;
      g.active_chips += slice_chips(s);
      if (c_.speed_cv > 0) g.speed.set(s - g.first_slice, slice_mult_[s]);
    }
    g.pending.clear();
    if (c_.speed_cv > 0 && g.active_chips > 0) g.mult = g.speed.max();
  }

  // `away_s` ≥ 0 and `keeps_state`: a replayed failure (GoodputConfig::trace); a paused slice loses nothing.
  void on_failure(int64_t chip, double away_s, bool keeps_state = false) {
    const int64_t s = chip / c_.slice_chips;
    const int64_t gi = slice_group_[s];
    Group& g = groups_[gi];
    if (!elastic_) {
      // DP without elasticity: a spare replaces the slice; the job restarts from its last checkpoint.
      ++result_.failures;
      if (g.status != Status::kRunning) return;  // failures during a restart join it
      const double ckpt_steps = c_.checkpoint_interval_s / c_.step_s;
      discard(g, g.x - std::floor(g.x / ckpt_steps + kEps) * ckpt_steps, g.active_chips);
      pause(gi, c_.detect_s + c_.restart_s);
      return;
    }
    switch (slice_state_[s]) {
      case SliceState::kAway:
        return;  // that chip is already out for repair: no failure of a chip in use (thinning)
      case SliceState::kPending: {
        ++result_.failures;
        g.pending.erase(std::find(g.pending.begin(), g.pending.end(), s));
        send_away(s, away_s);
        return;  // a waiting slice failed: no pause; an upscale due with nothing left to add is skipped
      }
      case SliceState::kActive: break;
    }
    ++result_.failures;
    const int64_t chips_before = g.active_chips;
    deactivate(g, s, away_s);
    const bool fatal = decoupled_ && c_.learner_fatal_fraction > 0 &&
                       fatal_rng_.uniform() < c_.learner_fatal_fraction;
    if (g.status == Status::kRunning) {
      if (keeps_state) {
        // paused: the step in flight finishes when it resumes
      } else if (fatal || (decoupled_ && g.active_chips == 0)) {
        lose_unmerged(g, chips_before);
      } else {
        discard(g, g.x - std::floor(g.x + kEps), chips_before);  // the step in flight
      }
      if (g.active_chips == 0) {
        go_down(g);
      } else {
        pause(gi, c_.detect_s + (g.state_lost ? c_.rejoin_s : c_.downscale_s));
      }
      return;
    }
    if (g.status == Status::kPaused) {
      if (!keeps_state && (fatal || (decoupled_ && g.active_chips == 0))) {
        lose_unmerged(g, chips_before);
        if (g.pause_end < now_ + c_.detect_s + c_.rejoin_s) {
          g.pause_end = now_ + c_.detect_s + c_.rejoin_s;
          set_timer(gi, g.pause_end);
        }
      }
      if (g.active_chips == 0) go_down(g);
    }
  }

  void on_return(int64_t s) {
    const int64_t gi = slice_group_[s];
    Group& g = groups_[gi];
    DLOCO_CHECK(slice_state_[s] == SliceState::kAway);
    --away_slices_;
    slice_state_[s] = SliceState::kPending;
    g.pending.push_back(s);
    switch (g.status) {
      case Status::kRunning:
        if (g.upscale_due == kInf) {
          g.upscale_due = now_ + c_.upscale_batch_s;
          set_timer(gi, g.upscale_due);
        }
        break;
      case Status::kPaused: break;  // joins at the end of the reconfiguration in progress
      case Status::kDown:
        pause(gi, g.state_lost ? c_.rejoin_s : c_.upscale_s);
        break;
    }
  }

  void on_timer(int64_t gi) {
    Group& g = groups_[gi];
    if (g.status == Status::kPaused) {
      join_pending(g);
      g.pause_end = kInf;
      if (g.active_chips == 0) {
        go_down(g);
        return;
      }
      g.status = Status::kRunning;
      if (g.state_lost) {
        g.state_lost = false;
        g.x_join = g.x;
      }
      return;
    }
    if (g.status == Status::kRunning) {
      g.upscale_due = kInf;
      if (!g.pending.empty()) pause(gi, c_.upscale_s);
    }
  }

  bool stale(const Event& e) const {
    if (e.kind == Event::kGroupTimer) return e.version != groups_[e.id].timer_version;
    if (e.kind == Event::kSyncCheck) return e.version != sync_version_;
    return false;
  }

  void dispatch(const Event& e) {
    switch (e.kind) {
      case Event::kReturn: on_return(e.id); break;
      case Event::kGroupTimer: on_timer(e.id); break;
      case Event::kSyncCheck: break;  // only re-evaluates the barrier (refresh_rates)
    }
  }

  // Sets every group's rate for the interval that starts now, and whether the global model advances.
  void refresh_rates() {
    int64_t stepping = 0;
    for (Group& g : groups_) {
      g.own_rate = (g.status == Status::kRunning && g.active_chips > 0) ? 1.0 / (c_.step_s * g.mult) : 0.0;
      g.rate = g.own_rate;
      if (g.rate > 0) ++stepping;
    }
    if (!coupled_) {
      advancing_ = stepping >= quorum_;
      return;
    }
    // Synchronous groups: nobody may lead the slowest group by more than lead_ steps. A group at that lead
    // is held to the slowest group's pace (fluid barrier); the next time a free group reaches the lead, or
    // the slowest group overtakes a slower one, is an event.
    double m = kInf;
    for (const Group& g : groups_) m = std::min(m, g.x);
    double r_min = kInf;
    for (const Group& g : groups_) {
      if (g.x <= m + kEps) r_min = std::min(r_min, g.own_rate);
    }
    double next = kInf;
    for (Group& g : groups_) {
      if (g.x >= m + lead_ - kEps && g.own_rate > r_min) {
        g.rate = r_min;
        continue;
      }
      if (g.own_rate > r_min) next = std::min(next, (m + lead_ - g.x) / (g.own_rate - r_min));
      if (g.own_rate < r_min && g.x > m + kEps) next = std::min(next, (g.x - m) / (r_min - g.own_rate));
    }
    advancing_ = r_min > 0;
    ++sync_version_;
    if (next < kInf) push(now_ + std::max(next, 0.0), Event::kSyncCheck, 0, sync_version_);
  }

  const GoodputConfig& c_;
  Rng fail_rng_, return_rng_, speed_rng_, fatal_rng_;
  bool elastic_, coupled_, decoupled_;
  int64_t quorum_ = 1;
  double lead_ = kInf;
  std::vector<SliceState> slice_state_;
  std::vector<int32_t> slice_group_;
  std::vector<double> slice_mult_;
  std::vector<Group> groups_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  uint64_t seq_ = 0;
  uint64_t sync_version_ = 0;
  double now_ = 0.0;
  bool advancing_ = true;
  double uptime_s_ = 0.0;
  double away_slice_s_ = 0.0;
  int64_t away_slices_ = 0;
  GoodputResult result_;
};

}  // namespace

GoodputResult simulate_goodput(const GoodputConfig& config) {
  config.validate();
  return Simulator(config).run();
}

nlohmann::json to_json(const GoodputResult& r, const GoodputConfig& c) {
  return {{"method", to_string(c.method)},
          {"chips", c.chips},
          {"learners", c.learners},
          {"quorum", c.quorum},
          {"chip_mtbf_s", c.chip_mtbf_s},
          {"seed", c.seed},
          {"horizon_s", c.horizon_s},
          {"goodput", r.goodput},
          {"uptime", r.uptime},
          {"kept_chip_s", r.kept_chip_s},
          {"lost_chip_s", r.lost_chip_s},
          {"allocated_chip_s", r.allocated_chip_s},
          {"mean_slices_away", r.mean_slices_away},
          {"failures", r.failures},
          {"pauses", r.pauses},
          {"learner_losses", r.learner_losses},
          {"events", r.events}};
}

}  // namespace dloco::sim
