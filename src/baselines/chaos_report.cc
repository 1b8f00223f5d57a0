// Analysis of a data-parallel run under a fault plan (run.recovery = restart | elastic); see baselines/chaos_report.h.
// Read from events/launcher.jsonl (group formations and stops, faults) and every worker's events: which steps
// survived (a later generation resumed from a checkpoint before them: rolled back), goodput, uptime, the pauses
// between generations, and the recoveries of killed workers.
#include <algorithm>
#include <cmath>
#include <map>

#include "baselines/chaos_report.h"
#include "chaos/event_logs.h"
#include "core/check.h"

namespace dloco {

namespace fs = std::filesystem;
using namespace chaos_detail;

namespace {

struct Generation {
  int64_t from_step = 0;
  int world = 0;
  std::string stop_reason;
  double first_t = -1, last_t = -1;
  int64_t last_step = -1;
};

struct Kill {
  double t;
  int slot;
  double restart_after_s;
};

// Every step of every slot, with its generation (from the "joined" before it).
struct StepRec {
  int slot;
  int64_t gen, step;
  double t;
};

struct DpLogs {
  double t0 = -1;
  std::map<int64_t, Generation> gens;
  std::vector<Kill> kills;
  std::vector<StepRec> steps;
  std::vector<std::vector<double>> joins;  // per slot: when each incarnation joined
  std::vector<double> intervals;           // between steps of full-world generations
};

// The launcher's log: the window's start, the group's generations and the faults.
void read_launcher(const fs::path& run_dir, DpLogs& logs, ChaosAnalysis& a) {
  const auto launcher = read_log(run_dir / "events" / "launcher.jsonl", true, &a.torn_event_lines);
  for (const auto& e : launcher) {
    if (name(e) == "started") logs.t0 = time_of(e);
  }
  if (logs.t0 < 0) throw InputError("chaos analysis: " + run_dir.string() + "/events/launcher.jsonl has no 'started' event");
  for (const auto& e : launcher) {
    const std::string n = name(e);
    if (n == "group_formed") {
      Generation& g = logs.gens[e.value("generation", int64_t{0})];
      g.from_step = e.value("from_step", int64_t{0});
      g.world = e.value("world", 0);
    } else if (n == "group_stopped") {
      logs.gens[e.value("generation", int64_t{0})].stop_reason = e.value("reason", "");
    } else if (n == "fault" && time_of(e) >= logs.t0) {
      nlohmann::json f = e;
      f["t"] = time_of(e) - logs.t0;
      a.faults.push_back(f);
      if (e.value("action", "") == "kill_learner") {
        logs.kills.push_back({time_of(e), e.value("learner", -1), e.value("restart_after_s", 0.0)});
      }
    }
  }
  a.generations = static_cast<int>(logs.gens.size());
}

// Every worker's log: its steps (each slot counts up one by one from the checkpoint it joined from), NaNs and
// incarnations.
void read_workers(const fs::path& run_dir, int M, DpLogs& logs, ChaosAnalysis& a) {
  logs.joins.assign(static_cast<size_t>(M), {});
  for (int s = 0; s < M; ++s) {
    LearnerTally tally;
    tally.id = s;
    const auto events = read_log(run_dir / "events" / ("worker_" + std::to_string(s) + ".jsonl"), false,
                                 &a.torn_event_lines);
    int64_t gen = -1, expected = -1;
    double last_t = -1;
    for (const auto& e : events) {
      if (time_of(e) < logs.t0) continue;
      const std::string n = name(e);
      if (n == "joined") {
        gen = e.value("generation", int64_t{0});
        expected = e.value("from_step", int64_t{0}) + 1;
        last_t = -1;
        ++tally.incarnations;
        logs.joins[s].push_back(time_of(e));
      } else if (n == "step" && gen >= 0) {
        const int64_t step = e.value("step", int64_t{0});
        if (step != expected) a.lineage_ok = false;
        expected = step + 1;
        const auto loss = e.find("loss");
        if (e.value("skipped", false) || (loss != e.end() && loss->is_null())) a.nan_free = false;
        if (last_t >= 0 && logs.gens.count(gen) && logs.gens[gen].world == M) logs.intervals.push_back(time_of(e) - last_t);
        last_t = time_of(e);
        logs.steps.push_back({s, gen, step, time_of(e)});
        ++tally.steps_trained;
      }
    }
    a.learners.push_back(tally);
  }
  if (logs.steps.empty()) throw InputError("chaos analysis: no worker of " + run_dir.string() + " trained a step");
}

// Which steps survived, goodput and uptime; the generations' spans and the lineage (a generation resumes from a
// step already reached).
void measure_kept_steps(int M, const ChaosRunShape& shape, DpLogs& logs, ChaosAnalysis& a,
                        std::vector<std::vector<double>>& slot_steps) {
  double t_end = logs.t0;
  for (const auto& r : logs.steps) {
    Generation& g = logs.gens[r.gen];
    t_end = std::max(t_end, r.t);
    g.first_t = g.first_t < 0 ? r.t : std::min(g.first_t, r.t);
    g.last_t = std::max(g.last_t, r.t);
    g.last_step = std::max(g.last_step, r.step);
  }
  a.window_s = t_end - logs.t0;
  // A step n of generation g survives unless a later generation resumed from a checkpoint before n.
  std::map<int64_t, int64_t> resumed_after;  // g -> min from_step of the generations after g
  int64_t min_from = INT64_MAX, reached = 0;
  for (auto it = logs.gens.rbegin(); it != logs.gens.rend(); ++it) {
    resumed_after[it->first] = min_from;
    min_from = std::min(min_from, it->second.from_step);
  }
  for (const auto& [g, gen] : logs.gens) {
    if (gen.from_step > reached) a.lineage_ok = false;
    reached = std::max(reached, gen.last_step);
  }
  a.nominal_step_s = trimmed_mean(logs.intervals);
  const int bins = std::max(1, static_cast<int>(std::floor(a.window_s / shape.bin_s)));
  std::vector<double> group_steps(static_cast<size_t>(bins), 0.0);
  double kept_total = 0;
  slot_steps.assign(static_cast<size_t>(M), {});
  for (const auto& r : logs.steps) {
    slot_steps[r.slot].push_back(r.t);
    if (r.step > resumed_after[r.gen]) continue;  // rolled back
    a.learners[r.slot].steps_kept += 1;
    kept_total += 1;
    const int b = static_cast<int>((r.t - logs.t0) / shape.bin_s);
    if (b >= 0 && b < bins) group_steps[static_cast<size_t>(b)] += 1.0 / std::max(1, logs.gens[r.gen].world);
  }
  for (auto& l : a.learners) l.steps_lost = static_cast<double>(l.steps_trained) - l.steps_kept;
  if (a.window_s > 0 && a.nominal_step_s > 0) {
    a.slot_seconds = M * a.window_s;
    a.goodput = kept_total * a.nominal_step_s / a.slot_seconds;
    int up = 0;
    for (double c : group_steps) up += c >= 0.5 * shape.bin_s / a.nominal_step_s ? 1 : 0;
    a.uptime = static_cast<double>(up) / bins;
  }
}

// Pauses between two generations that trained steps (one stopped during its start-up belongs to the pause it
// sits in; its stop reason is the one that ended the pause's first generation).
void measure_pauses(const DpLogs& logs, ChaosAnalysis& a) {
  const Generation* prev = nullptr;
  int64_t prev_id = -1;
  for (const auto& [id, g] : logs.gens) {
    if (g.first_t < 0) continue;
    if (prev != nullptr) {
      GroupPause p;
      p.generation = prev_id;
      p.reason = prev->stop_reason.empty() ? "failure" : prev->stop_reason;
      p.stopped_at_s = prev->last_t - logs.t0;
      p.pause_s = g.first_t - prev->last_t;
      p.rolled_back_steps = std::max<int64_t>(0, prev->last_step - g.from_step);
      p.world_after = g.world;
      a.pauses.push_back(p);
    }
    prev = &g;
    prev_id = id;
  }
}

// Kill -> the slot joined again -> its first step after that.
void measure_recoveries(int M, const DpLogs& logs, const std::vector<std::vector<double>>& slot_steps,
                        ChaosAnalysis& a) {
  for (const auto& [t, slot, restart_after_s] : logs.kills) {
    if (slot < 0 || slot >= M) continue;
    ++a.learners[slot].kills;
    Recovery r{slot, t - logs.t0, restart_after_s, -1, -1};
    const auto& j = logs.joins[slot];
    if (auto b = std::upper_bound(j.begin(), j.end(), t); b != j.end()) {
      r.back_s = *b - t;
      const auto& st = slot_steps[slot];
      if (auto k = std::upper_bound(st.begin(), st.end(), *b); k != st.end()) r.contributing_s = *k - t;
    }
    a.recoveries.push_back(r);
  }
}

}  // namespace

ChaosAnalysis analyze_dp_chaos_run(const fs::path& run_dir, const ChaosRunShape& shape) {
  DLOCO_CHECK(shape.learners > 0 && shape.bin_s > 0);
  ChaosAnalysis a;
  a.mode = "dp";
  const int M = shape.learners;
  DpLogs logs;
  read_launcher(run_dir, logs, a);
  read_workers(run_dir, M, logs, a);
  std::vector<std::vector<double>> slot_steps;
  measure_kept_steps(M, shape, logs, a, slot_steps);
  measure_pauses(logs, a);
  measure_recoveries(M, logs, slot_steps, a);
  read_final_loss(run_dir, a);
  return a;
}

}  // namespace dloco
