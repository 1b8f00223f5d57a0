// Analysis of a chaos run; see chaos_report.h.
#include "chaos/chaos_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "core/check.h"
#include "chaos/event_logs.h"
#include "data/stream_log.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

using namespace chaos_detail;

// Learner m's final copies (its last "stopped" event, null if none) against the syncer's final Θ: each of the P
// fragments is compared (version and hash) or reported in a.copy_mismatches with the reason it was not.
void compare_final_copies(int m, const nlohmann::json& stop, const std::vector<int64_t>& final_versions,
                          const std::vector<std::string>& final_hashes, int P, ChaosAnalysis& a) {
  const std::string who = "learner " + std::to_string(m);
  const auto versions = stop.is_object() ? stop.value("versions", std::vector<int64_t>{}) : std::vector<int64_t>{};
  const auto hashes = stop.is_object() ? stop.value("hashes", std::vector<std::string>{}) : std::vector<std::string>{};
  for (int p = 0; p < P; ++p) {
    const std::string what = who + " fragment " + std::to_string(p) + ": ";
    const size_t i = static_cast<size_t>(p);
    if (i >= final_versions.size() || i >= final_hashes.size()) {
      a.copy_mismatches.push_back(what + "not compared (the syncer logged no final_state for it)");
    } else if (!stop.is_object()) {
      a.copy_mismatches.push_back(what + "not compared (its last incarnation logged no \"stopped\")");
    } else if (i >= versions.size() || i >= hashes.size()) {
      a.copy_mismatches.push_back(what + "not compared (its \"stopped\" has no version or hash for it)");
    } else {
      ++a.fragments_checked;
      if (versions[i] == final_versions[i] && hashes[i] == final_hashes[i]) {
        ++a.fragments_equal;
      } else {
        a.copy_mismatches.push_back(what + "version " + std::to_string(versions[i]) + " hash " + hashes[i] +
                                    ", the syncer's Θ: version " + std::to_string(final_versions[i]) + " hash " +
                                    final_hashes[i]);
      }
    }
  }
}

}  // namespace

nlohmann::json ChaosAnalysis::to_json() const {
  nlohmann::json ls = nlohmann::json::array();
  for (const auto& l : learners) {
    ls.push_back({{"id", l.id}, {"steps_trained", l.steps_trained}, {"steps_kept", l.steps_kept},
                  {"steps_lost", l.steps_lost}, {"incarnations", l.incarnations}, {"kills", l.kills},
                  {"joined_at_s", l.joined_at_s}, {"left_at_s", l.left_at_s}, {"end", l.end}});
  }
  auto recs = [](const std::vector<Recovery>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : v) {
      a.push_back({{"learner", r.learner}, {"killed_at_s", r.killed_at_s}, {"restart_after_s", r.restart_after_s},
                   {"back_s", r.back_s},
                   {"contributing_s", r.contributing_s}});
    }
    return a;
  };
  nlohmann::json ps = nlohmann::json::array();
  for (const auto& p : pauses) {
    ps.push_back({{"generation", p.generation}, {"reason", p.reason}, {"stopped_at_s", p.stopped_at_s},
                  {"pause_s", p.pause_s}, {"rolled_back_steps", p.rolled_back_steps}, {"world_after", p.world_after}});
  }
  nlohmann::json lfs = nlohmann::json::array();
  for (const auto& l : link_faults) {
    lfs.push_back({{"learner", l.learner}, {"action", l.action}, {"at_s", l.at_s}, {"duration_s", l.duration_s},
                   {"steps_during", l.steps_during}, {"contributing_s", l.contributing_s}});
  }
  nlohmann::json out = {{"mode", mode},
          {"link_faults", lfs},
          {"window_s", window_s},
          {"nominal_step_s", nominal_step_s},
          {"goodput", goodput},
          {"uptime", uptime},
          {"slot_seconds", slot_seconds},
          {"learners_added", learners_added},
          {"learners_left", learners_left},
          {"learners", ls},
          {"recoveries", recs(recoveries)},
          {"syncer_downtime", recs(syncer_downtime)},
          {"faults", faults},
          {"exact_data", {{"batches", batches}, {"duplicates", duplicate_batches}, {"gaps", gaps},
                          {"skipped_tokens", skipped_tokens}}},
          {"consistency", {{"nan_free", nan_free}, {"version_regressions", version_regressions},
                           {"learners_finished", learners_finished}, {"learners_gone", learners_gone},
                           {"fragments_expected", fragments_expected}, {"fragments_checked", fragments_checked},
                           {"fragments_equal", fragments_equal}, {"copy_mismatches", copy_mismatches},
                           {"ok", consistent()}}},
          {"final_val_loss", final_val_loss},
          {"torn_event_lines", torn_event_lines}};
  if (mode == "dp") {
    out["generations"] = generations;
    out["pauses"] = ps;
    out["consistency"]["lineage_ok"] = lineage_ok;
  }
  return out;
}

namespace {

using namespace chaos_detail;

// What every part of a decoupled run's analysis reads: the launcher's and the syncer's events and the window.
struct DecoupledLogs {
  std::vector<nlohmann::json> launcher, syncer;
  double t0 = -1;     // the learners' start (the last "started": a resumed run counts from its own start)
  double t_end = -1;  // the final flush (or the end)
};

struct Kill {
  double t;
  int learner;
  double restart_after_s;
};

DecoupledLogs read_decoupled_logs(const fs::path& run_dir, ChaosAnalysis& a) {
  DecoupledLogs logs;
  logs.launcher = read_log(run_dir / "events" / "launcher.jsonl", true, &a.torn_event_lines);
  logs.syncer = read_log(run_dir / "events" / "syncer.jsonl", true, &a.torn_event_lines);
  double t_finished = -1;
  for (const auto& e : logs.launcher) {
    if (name(e) == "started") logs.t0 = time_of(e);
  }
  if (logs.t0 < 0) throw InputError("chaos analysis: " + run_dir.string() + "/events/launcher.jsonl has no 'started' event");
  for (const auto& e : logs.syncer) {
    if (time_of(e) < logs.t0) continue;
    if (name(e) == "final_flush" && logs.t_end < 0) logs.t_end = time_of(e);
    if (name(e) == "finished") t_finished = time_of(e);
  }
  if (logs.t_end < 0) logs.t_end = t_finished;
  if (logs.t_end < 0) throw InputError("chaos analysis: the syncer of " + run_dir.string() + " never finished the run");
  a.window_s = logs.t_end - logs.t0;
  return logs;
}

// The faults, in time order, with the measured length of each lasting one (from its "fault" to the first
// "fault_ended" after it for the same action and learner; it replaces the planned duration_s, and the simulator
// replays this one).
void collect_faults(const DecoupledLogs& logs, ChaosAnalysis& a, std::vector<Kill>& learner_kills,
                    std::vector<Kill>& syncer_kills) {
  const double t0 = logs.t0;
  for (const auto& e : logs.launcher) {
    if (name(e) != "fault" || time_of(e) < t0) continue;
    nlohmann::json f = e;
    f["t"] = time_of(e) - t0;
    a.faults.push_back(f);
    const std::string action = e.value("action", "");
    if (action == "cut_link" || action == "delay_link") {
      a.link_faults.push_back({e.value("learner", -1), action, time_of(e) - t0, e.value("duration_s", 0.0), 0, -1});
    }
    double restart_after_s = e.value("restart_after_s", 0.0);
    if (action == "kill_learner" && e.contains("restart_at_step")) {
      // Restarted at a global step: its delay is when the launcher restarted it (the wait for the step is not
      // rejoin cost); without that event (dp's launcher re-forms groups instead) the planned minimum stays.
      for (const auto& r : logs.launcher) {
        if (name(r) == "learner_restarted" && r.value("learner", -2) == e.value("learner", -1) &&
            time_of(r) > time_of(e)) {
          restart_after_s = time_of(r) - time_of(e);
          break;
        }
      }
      a.faults.back()["restart_after_s"] = restart_after_s;
    }
    const Kill kill{time_of(e), e.value("learner", -1), restart_after_s};
    if (action == "kill_learner") learner_kills.push_back(kill);
    if (action == "kill_syncer") syncer_kills.push_back(kill);
  }
  for (auto& f : a.faults) {
    for (const auto& e : logs.launcher) {
      if (name(e) != "fault_ended" || e.value("action", "") != f.value("action", "") ||
          e.value("learner", -1) != f.value("learner", -1) || time_of(e) - t0 < f.value("t", 0.0)) {
        continue;
      }
      f["duration_s"] = time_of(e) - t0 - f.value("t", 0.0);
      for (auto& lf : a.link_faults) {
        if (lf.learner == f.value("learner", -1) && lf.action == f.value("action", "") && lf.at_s == f.value("t", 0.0)) {
          lf.duration_s = f["duration_s"];
        }
      }
      break;
    }
  }
}

// The learners: the M slots the launcher started, then those the plan added (scavenging), with when each joined
// and left. Allocated slot-seconds: each slot from its start (or its join) to the end of the window or its leave.
std::vector<int> collect_learners(const DecoupledLogs& logs, const ChaosRunShape& shape, ChaosAnalysis& a,
                                  std::map<int, double>& joined_at, std::map<int, double>& left_at) {
  std::vector<int> ids;
  for (int m = 0; m < shape.learners; ++m) ids.push_back(m);
  for (const auto& e : logs.launcher) {
    if (time_of(e) < logs.t0) continue;
    if (name(e) == "learner_added") {
      const int id = e.value("learner", -1);
      if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
      joined_at[id] = time_of(e) - logs.t0;
    }
    if (name(e) == "fault" && e.value("action", "") == "leave_learner") {
      left_at[e.value("learner", -1)] = time_of(e) - logs.t0;
    }
  }
  a.slot_seconds = 0;
  for (int id : ids) {
    const double from = joined_at.count(id) ? joined_at[id] : 0.0;
    const double to = left_at.count(id) ? std::min(left_at[id], a.window_s) : a.window_s;
    a.slot_seconds += std::max(0.0, to - from);
  }
  a.learners_added = static_cast<int>(joined_at.size());
  a.learners_left = static_cast<int>(left_at.size());
  return ids;
}

// What one learner's events say: its steps (and their intervals, for the nominal step), kept work, incarnations,
// versions held, and its last "stopped" event (its final copies).
struct LearnerEvents {
  std::vector<double> bootstraps, kept_times;
  nlohmann::json last_stop;
};

LearnerEvents read_learner(const fs::path& run_dir, int m, const DecoupledLogs& logs, const ChaosRunShape& shape,
                           LearnerTally& tally, std::vector<double>& intervals, ChaosAnalysis& a) {
  LearnerEvents out;
  const auto events = read_log(run_dir / "events" / ("learner_" + std::to_string(m) + ".jsonl"), false, &a.torn_event_lines);
  std::vector<int64_t> held(static_cast<size_t>(shape.fragments), -1);
  double last_step_t = -1;
  const double t0 = logs.t0;
  for (const auto& e : events) {
    if (time_of(e) < t0) continue;
    const std::string n = name(e);
    if (n == "bootstrapped") {
      ++tally.incarnations;
      last_step_t = -1;
      out.bootstraps.push_back(time_of(e));
      const auto versions = e.value("versions", std::vector<int64_t>{});
      for (size_t p = 0; p < versions.size() && p < held.size(); ++p) {
        if (versions[p] < held[p]) ++a.version_regressions;
        held[p] = std::max(held[p], versions[p]);
      }
      out.last_stop = nullptr;  // a later incarnation: its own stop is the final one
    } else if (n == "step") {
      ++tally.steps_trained;
      for (auto& lf : a.link_faults) {
        const double t = time_of(e) - t0;
        if (lf.learner == m && t >= lf.at_s && t < lf.at_s + lf.duration_s) ++lf.steps_during;
      }
      const auto loss = e.find("loss");  // a non-finite loss is written as null
      if (e.value("skipped", false) || (loss != e.end() && loss->is_null())) a.nan_free = false;
      if (last_step_t >= 0 && time_of(e) <= logs.t_end) intervals.push_back(time_of(e) - last_step_t);
      last_step_t = time_of(e);
    } else if (n == "kept") {
      tally.steps_kept += e.value("steps", 0.0) / shape.fragments;
      out.kept_times.push_back(time_of(e));
    } else if (n == "applied") {
      const int p = e.value("fragment", -1);
      const int64_t v = e.value("version", int64_t{-1});
      if (p >= 0 && p < shape.fragments) {
        if (v <= held[p]) ++a.version_regressions;
        held[p] = std::max(held[p], v);
      }
    } else if (n == "stopped") {
      out.last_stop = e;
    }
  }
  return out;
}

// Kill -> bootstrapped again -> first kept answer, for each kill of learner m; and the same after its link faults.
void measure_recoveries(int m, const LearnerEvents& ev, const std::vector<Kill>& learner_kills, double t0,
                        LearnerTally& tally, ChaosAnalysis& a) {
  for (const auto& [t, who, restart_after_s] : learner_kills) {
    if (who != m) continue;
    ++tally.kills;
    Recovery r{m, t - t0, restart_after_s, -1, -1};
    auto b = std::upper_bound(ev.bootstraps.begin(), ev.bootstraps.end(), t);
    if (b != ev.bootstraps.end()) {
      r.back_s = *b - t;
      auto k = std::upper_bound(ev.kept_times.begin(), ev.kept_times.end(), *b);
      if (k != ev.kept_times.end()) r.contributing_s = *k - t;
    }
    a.recoveries.push_back(r);
  }
  for (auto& lf : a.link_faults) {
    if (lf.learner != m) continue;
    auto k = std::upper_bound(ev.kept_times.begin(), ev.kept_times.end(), t0 + lf.at_s + lf.duration_s);
    if (k != ev.kept_times.end()) lf.contributing_s = *k - (t0 + lf.at_s + lf.duration_s);
  }
}

// Syncer downtime: kill -> listening again -> first merge. Returns the merge times (for the uptime).
std::vector<double> measure_syncer_downtime(const DecoupledLogs& logs, const std::vector<Kill>& syncer_kills,
                                            ChaosAnalysis& a) {
  std::vector<double> listening, merges;
  for (const auto& e : logs.syncer) {
    if (time_of(e) < logs.t0) continue;
    if (name(e) == "listening") listening.push_back(time_of(e));
    if (name(e) == "merged") merges.push_back(time_of(e));
  }
  for (const auto& [t, who, restart_after_s] : syncer_kills) {
    Recovery r{-1, t - logs.t0, restart_after_s, -1, -1};
    if (auto l = std::upper_bound(listening.begin(), listening.end(), t); l != listening.end()) r.back_s = *l - t;
    if (auto mg = std::upper_bound(merges.begin(), merges.end(), t); mg != merges.end()) r.contributing_s = *mg - t;
    a.syncer_downtime.push_back(r);
  }
  return merges;
}

// Goodput (kept steps × nominal step / allocated slot-seconds) and uptime (bins with at least half the expected
// merges).
void measure_goodput(const std::vector<double>& intervals, const std::vector<double>& merges, double kept_total,
                     double t0, const ChaosRunShape& shape, ChaosAnalysis& a) {
  a.nominal_step_s = trimmed_mean(intervals);
  if (a.window_s <= 0 || a.nominal_step_s <= 0) return;
  a.goodput = a.slot_seconds > 0 ? kept_total * a.nominal_step_s / a.slot_seconds : 0.0;
  const double expected = shape.fragments / (shape.inner_steps * a.nominal_step_s) * shape.bin_s;
  const int bins = std::max(1, static_cast<int>(std::floor(a.window_s / shape.bin_s)));
  std::vector<int> count(static_cast<size_t>(bins), 0);
  for (double t : merges) {
    const int b = static_cast<int>((t - t0) / shape.bin_s);
    if (b >= 0 && b < bins) ++count[static_cast<size_t>(b)];
  }
  int up = 0;
  for (int c : count) up += c >= 0.5 * expected ? 1 : 0;
  a.uptime = static_cast<double>(up) / bins;
}

// Exact data: every stream's log.
void check_exact_data(const fs::path& run_dir, const ChaosRunShape& shape, ChaosAnalysis& a) {
  if (!fs::exists(run_dir / "streams")) return;
  for (const auto& entry : fs::directory_iterator(run_dir / "streams")) {
    if (entry.path().extension() != ".jsonl") continue;
    const auto check = check_stream_log(read_stream_log(entry.path()), shape.tokens_per_batch);
    a.batches += check.batches;
    a.duplicate_batches += check.duplicates;
    a.gaps += check.gaps;
    a.skipped_tokens += check.skipped_tokens;
  }
}

}  // namespace

ChaosAnalysis analyze_chaos_run(const fs::path& run_dir, const ChaosRunShape& shape) {
  DLOCO_CHECK(shape.learners > 0 && shape.fragments > 0 && shape.inner_steps > 0 && shape.tokens_per_batch > 0);
  ChaosAnalysis a;
  const DecoupledLogs logs = read_decoupled_logs(run_dir, a);
  std::vector<Kill> learner_kills, syncer_kills;
  collect_faults(logs, a, learner_kills, syncer_kills);
  std::vector<int64_t> final_versions;  // the syncer's final_state: Θ_p's version and hash, p = 0..P−1
  std::vector<std::string> final_hashes;
  for (const auto& e : logs.syncer) {
    if (name(e) == "final_state" && time_of(e) >= logs.t0) {
      final_versions = e.value("versions", std::vector<int64_t>{});
      final_hashes = e.value("hashes", std::vector<std::string>{});
    }
  }
  std::map<int, double> joined_at, left_at;
  const std::vector<int> ids = collect_learners(logs, shape, a, joined_at, left_at);
  std::vector<double> intervals;
  double kept_total = 0;
  for (int m : ids) {
    LearnerTally tally;
    tally.id = m;
    tally.joined_at_s = joined_at.count(m) ? joined_at[m] : -1;
    tally.left_at_s = left_at.count(m) ? left_at[m] : -1;
    const LearnerEvents ev = read_learner(run_dir, m, logs, shape, tally, intervals, a);
    // The final copies: every fragment of a learner whose last incarnation ran to the end, against final Θ.
    bool killed_for_good = false;
    for (const auto& k : learner_kills) {
      if (k.learner == m) killed_for_good = k.restart_after_s < 0;  // its last kill decides
    }
    if (left_at.count(m)) tally.end = "left";
    else if (killed_for_good) tally.end = "killed";
    if (tally.end != "finished") {
      ++a.learners_gone;
    } else {
      ++a.learners_finished;
      a.fragments_expected += shape.fragments;
      compare_final_copies(m, ev.last_stop, final_versions, final_hashes, shape.fragments, a);
    }
    tally.steps_lost = static_cast<double>(tally.steps_trained) - tally.steps_kept;
    measure_recoveries(m, ev, learner_kills, logs.t0, tally, a);
    kept_total += tally.steps_kept;
    a.learners.push_back(tally);
  }
  std::sort(a.recoveries.begin(), a.recoveries.end(),
            [](const Recovery& x, const Recovery& y) { return x.killed_at_s < y.killed_at_s; });
  const std::vector<double> merges = measure_syncer_downtime(logs, syncer_kills, a);
  measure_goodput(intervals, merges, kept_total, logs.t0, shape, a);
  check_exact_data(run_dir, shape, a);
  read_final_loss(run_dir, a);
  return a;
}

}  // namespace dloco
