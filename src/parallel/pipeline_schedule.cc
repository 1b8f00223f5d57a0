// Pipeline schedules and their simulated timeline; see pipeline_schedule.h. Symbols: p, m, v, k (virtual stage).
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <sstream>

#include "core/check.h"

namespace dloco {

namespace {

using Op = PipelineAction::Op;

PipelineAction fwd(int micro_batch, int chunk = 0) { return {Op::kForward, micro_batch, chunk}; }
PipelineAction bwd(int micro_batch, int chunk = 0) { return {Op::kBackward, micro_batch, chunk}; }

void check_spec(const PipelineScheduleSpec& s) {
  const std::string what = to_string(s.kind) + " schedule with p = " + std::to_string(s.stages) +
                           ", m = " + std::to_string(s.micro_batches) + ", v = " + std::to_string(s.chunks);
  if (s.stages < 1) throw InputError(what + ": needs at least one stage (p ≥ 1)");
  if (s.micro_batches < 1) throw InputError(what + ": needs at least one micro-batch (m ≥ 1)");
  if (s.chunks < 1) throw InputError(what + ": needs at least one model chunk per stage (v ≥ 1)");
  if (s.kind != PipelineScheduleKind::kInterleaved && s.chunks != 1) {
    throw InputError(what + ": only the interleaved schedule has more than one chunk per stage; set v = 1");
  }
  if (s.kind == PipelineScheduleKind::kInterleaved && s.micro_batches % s.stages != 0) {
    throw InputError(what + ": the interleaved schedule runs micro-batches in groups of p; make m a multiple of p");
  }
}

// GPipe (picotron's all-forward-all-backward): F0 … F(m−1), then B0 … B(m−1).
std::vector<PipelineAction> gpipe(int m) {
  std::vector<PipelineAction> list;
  for (int i = 0; i < m; ++i) list.push_back(fwd(i));
  for (int i = 0; i < m; ++i) list.push_back(bwd(i));
  return list;
}

// 1F1B (picotron's train_step_pipeline_1f1b, DeepSpeed's TrainSchedule): warm-up w = min(p − rank − 1, m)
// forwards; steady state m − w pairs (forward w + i, backward i); cool-down: the last w backwards.
std::vector<PipelineAction> one_f_one_b(int p, int m, int rank) {
  const int warmup = std::min(p - rank - 1, m), steady = m - warmup;
  std::vector<PipelineAction> list;
  for (int i = 0; i < warmup; ++i) list.push_back(fwd(i));
  for (int i = 0; i < steady; ++i) {
    list.push_back(fwd(warmup + i));
    list.push_back(bwd(i));
  }
  for (int i = steady; i < m; ++i) list.push_back(bwd(i));
  return list;
}

// Megatron's forward_backward_pipelining_with_interleaving: the k-th forward (of m·v) runs chunk
// (k mod p·v) / p on micro-batch ⌊k / p·v⌋·p + k mod p; the k-th backward the same with the chunks reversed.
// Warm-up: 2(p − rank − 1) + (v − 1)·p forwards, all m·v when m = p (Megatron's all-warm-up case).
PipelineAction interleaved_action(int p, int v, int k, bool forward) {
  const int in_group = k % (p * v);
  const int chunk = forward ? in_group / p : v - 1 - in_group / p;
  const int micro_batch = (k / (p * v)) * p + k % p;
  return forward ? fwd(micro_batch, chunk) : bwd(micro_batch, chunk);
}

std::vector<PipelineAction> interleaved(int p, int m, int v, int rank) {
  const int total = m * v;
  const int warmup = m == p ? total : std::min(2 * (p - rank - 1) + (v - 1) * p, total);
  const int steady = total - warmup;
  std::vector<PipelineAction> list;
  for (int k = 0; k < warmup; ++k) list.push_back(interleaved_action(p, v, k, true));
  for (int k = 0; k < steady; ++k) {
    list.push_back(interleaved_action(p, v, warmup + k, true));
    list.push_back(interleaved_action(p, v, k, false));
  }
  for (int k = steady; k < total; ++k) list.push_back(interleaved_action(p, v, k, false));
  return list;
}

}  // namespace

PipelineScheduleKind parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineScheduleKind::kGPipe;
  if (name == "1f1b") return PipelineScheduleKind::k1F1B;
  if (name == "interleaved") return PipelineScheduleKind::kInterleaved;
  throw InputError("unknown pipeline schedule '" + name + "': use \"gpipe\", \"1f1b\" or \"interleaved\"");
}

std::string to_string(PipelineScheduleKind kind) {
  switch (kind) {
    case PipelineScheduleKind::kGPipe: return "gpipe";
    case PipelineScheduleKind::k1F1B: return "1f1b";
    case PipelineScheduleKind::kInterleaved: return "interleaved";
  }
  return "?";
}

std::string to_string(const PipelineAction& action, int chunks) {
  std::string s(1, action.forward() ? 'F' : 'B');
  s += std::to_string(action.micro_batch);
  if (chunks > 1) {
    s += '.';
    s += std::to_string(action.chunk);
  }
  return s;
}

PipelineSchedule make_pipeline_schedule(const PipelineScheduleSpec& spec) {
  check_spec(spec);
  PipelineSchedule schedule{spec, {}};
  for (int rank = 0; rank < spec.stages; ++rank) {
    switch (spec.kind) {
      case PipelineScheduleKind::kGPipe: schedule.actions.push_back(gpipe(spec.micro_batches)); break;
      case PipelineScheduleKind::k1F1B:
        schedule.actions.push_back(one_f_one_b(spec.stages, spec.micro_batches, rank));
        break;
      case PipelineScheduleKind::kInterleaved:
        schedule.actions.push_back(interleaved(spec.stages, spec.micro_batches, spec.chunks, rank));
        break;
    }
  }
  return schedule;
}

void validate_pipeline_schedule(const PipelineSchedule& schedule) {
  const auto& spec = schedule.spec;
  check_spec(spec);
  if (static_cast<int>(schedule.actions.size()) != spec.stages) {
    throw InputError("schedule has " + std::to_string(schedule.actions.size()) + " stage lists for p = " +
                     std::to_string(spec.stages));
  }
  const int m = spec.micro_batches, v = spec.chunks;
  for (int s = 0; s < spec.stages; ++s) {
    std::vector<int> forwards(m * v, 0), backwards(m * v, 0);  // (m·v) counts per (micro-batch, chunk)
    for (const auto& a : schedule.actions[s]) {
      const std::string where = "stage " + std::to_string(s) + " action " + to_string(a, v);
      if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= v) {
        throw InputError(where + ": micro-batch or chunk out of range");
      }
      const int slot = a.micro_batch * v + a.chunk;
      if (a.forward()) {
        if (forwards[slot]++ > 0) throw InputError(where + " runs twice");
      } else {
        if (forwards[slot] == 0) throw InputError(where + " comes before its forward");
        if (backwards[slot]++ > 0) throw InputError(where + " runs twice");
      }
    }
    for (int slot = 0; slot < m * v; ++slot) {
      if (forwards[slot] != 1 || backwards[slot] != 1) {
        throw InputError("stage " + std::to_string(s) + " never runs micro-batch " + std::to_string(slot / v) +
                         " chunk " + std::to_string(slot % v) + " forward and backward");
      }
    }
  }
}

PipelineTimeline simulate_pipeline(const PipelineSchedule& schedule, const PipelineTimes& times) {
  validate_pipeline_schedule(schedule);
  if (times.t_forward < 0 || times.t_backward < 0 || times.t_transfer < 0) {
    throw InputError("pipeline simulation times must be ≥ 0 seconds");
  }
  const int p = schedule.spec.stages, m = schedule.spec.micro_batches, v = schedule.spec.chunks, K = p * v;
  const double t_f = times.t_forward / v, t_b = times.t_backward / v;  // one chunk, s
  const double link = p > 1 ? times.t_transfer : 0.0;                  // chunks of one rank talk for free
  constexpr double kNotYet = -1;
  std::vector<double> forward_end(K * m, kNotYet), backward_end(K * m, kNotYet);  // (K·m) by virtual stage
  std::vector<double> free_at(p, 0);
  std::vector<size_t> next(p, 0);
  PipelineTimeline out;
  out.busy_s.assign(p, 0);
  out.start_s.assign(p, {});
  size_t remaining = 0;
  for (const auto& list : schedule.actions) remaining += list.size();
  // Each pass starts, on every stage, the actions whose inputs exist; start times depend only on the finish
  // times of the inputs and of the stage's previous action, so the visiting order changes nothing.
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < schedule.actions[s].size()) {
        const auto& a = schedule.actions[s][next[s]];
        const int k = a.chunk * p + s, i = a.micro_batch;
        double ready = 0;
        if (a.forward() && k > 0) {
          if (forward_end[(k - 1) * m + i] == kNotYet) break;
          ready = forward_end[(k - 1) * m + i] + link;
        } else if (!a.forward() && k < K - 1) {
          if (backward_end[(k + 1) * m + i] == kNotYet) break;
          ready = backward_end[(k + 1) * m + i] + link;
        }
        const double start = std::max(free_at[s], ready), dur = a.forward() ? t_f : t_b;
        free_at[s] = start + dur;
        (a.forward() ? forward_end : backward_end)[k * m + i] = free_at[s];
        out.busy_s[s] += dur;
        out.start_s[s].push_back(start);
        ++next[s];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      std::ostringstream os;
      os << "pipeline schedule deadlocks: every stage waits (";
      for (int s = 0; s < p; ++s) {
        os << (s ? ", " : "") << "stage " << s << " at "
           << (next[s] < schedule.actions[s].size() ? to_string(schedule.actions[s][next[s]], v) : "end");
      }
      throw InputError(os.str() + ")");
    }
  }
  out.iteration_s = *std::max_element(free_at.begin(), free_at.end());
  double busy = 0;
  for (double b : out.busy_s) busy += b;
  out.bubble_fraction = out.iteration_s > 0 ? 1.0 - busy / (p * out.iteration_s) : 0.0;
  // Stored activations: one per (micro-batch, chunk) from its forward to its backward; a stage is sequential,
  // so walking its list in order visits the same states as walking time.
  for (int s = 0; s < p; ++s) {
    int stored = 0, peak = 0;
    for (const auto& a : schedule.actions[s]) {
      stored += a.forward() ? 1 : -1;
      peak = std::max(peak, stored);
    }
    DLOCO_CHECK_EQ(stored, 0);
    out.peak_stored_activations.push_back(peak);
  }
  return out;
}

}  // namespace dloco
