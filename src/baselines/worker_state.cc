// A diloco or streaming worker's resumable state on disk; see worker_state.h.
#include "baselines/worker_state.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json_read.h"
#include "core/safetensors.h"
#include "process/safetensors_file.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

constexpr int kWorkerStateFormat = 1;

fs::path step_dir(const fs::path& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return run_dir / "worker_state" / name;
}

// The steps with a folder under run_dir/worker_state, ascending.
std::vector<int64_t> saved_steps(const fs::path& run_dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir / "worker_state", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 13 || name.rfind("step_", 0) != 0) continue;
    try {
      out.push_back(std::stoll(name.substr(5)));
    } catch (const std::exception&) {
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A count in the state's metadata: a non-negative integer below `limit`, else InputError.
size_t count_of(const nlohmann::json& meta, const char* key, int64_t limit) {
  const int64_t n = json_integer(meta.at(key), std::string("the worker state's ") + key);
  if (n < 0 || n > limit) throw InputError(std::string(key) + " = " + std::to_string(n) + " is out of range");
  return static_cast<size_t>(n);
}

std::string part_name(const char* what, size_t i) { return std::string(what) + "." + std::to_string(i); }

std::vector<std::vector<float>> read_parts(const SafetensorsFile& file, const char* what, size_t n) {
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < n; ++i) out.push_back(file.at(part_name(what, i)).to_floats());
  return out;
}

std::vector<int64_t> int_list(const nlohmann::json& j, const char* key) {
  return j.at(key).get<std::vector<int64_t>>();
}

}  // namespace

WorkerState capture_worker_state(int64_t step, const StreamCursor& cursor, const FragmentLayout& layout,
                                 FragmentReplica& replica, OuterSync& outer) {
  WorkerState state;
  state.step = step;
  state.cursor = cursor;
  for (int p = 0; p < static_cast<int>(layout.fragments.size()); ++p) {
    state.theta_m.emplace_back(static_cast<size_t>(layout.fragments[p].numel));
    replica.read_fragment(p, state.theta_m.back());
  }
  state.outer = outer.state();
  return state;
}

void write_theta_m(const WorkerState& state, const FragmentLayout& layout, FragmentReplica& replica) {
  if (state.theta_m.size() != layout.fragments.size()) {
    throw InputError("the worker state has θ_m in " + std::to_string(state.theta_m.size()) +
                     " fragments, this run's layout " + std::to_string(layout.fragments.size()));
  }
  for (int p = 0; p < static_cast<int>(layout.fragments.size()); ++p) {
    if (static_cast<int64_t>(state.theta_m[p].size()) != layout.fragments[p].numel) {
      throw InputError("the worker state's fragment " + std::to_string(p) + " has " +
                       std::to_string(state.theta_m[p].size()) + " values, this run's layout " +
                       std::to_string(layout.fragments[p].numel));
    }
  }
  for (int p = 0; p < static_cast<int>(layout.fragments.size()); ++p) replica.write_fragment(p, state.theta_m[p]);
}

fs::path worker_state_dir(const fs::path& run_dir, int64_t step, int slot) {
  return step_dir(run_dir, step) / ("slot_" + std::to_string(slot));
}

void save_worker_state(const fs::path& run_dir, int slot, const WorkerState& state, InnerJob& job, int M) {
  const fs::path dir = worker_state_dir(run_dir, state.step, slot);
  const fs::path tmp = dir.string() + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw InputError("cannot write the worker state '" + tmp.string() + "': " + ec.message());
  const OuterState& o = state.outer;
  std::vector<SafetensorsEntry> tensors;
  auto add = [&](const char* what, const std::vector<std::vector<float>>& parts) {
    for (size_t i = 0; i < parts.size(); ++i) {
      tensors.push_back(f32_entry(part_name(what, i), {static_cast<int64_t>(parts[i].size())}, parts[i]));
    }
  };
  add("theta_m", state.theta_m);
  add("theta", o.theta);
  add("momentum", o.momentum);
  nlohmann::json in_flight = nlohmann::json::array();
  std::vector<std::vector<float>> deltas;
  for (const auto& l : o.in_flight) {
    in_flight.push_back({{"fragment", l.fragment}, {"round", l.round}, {"apply_at", l.apply_at}, {"merged", l.merged}});
    deltas.push_back(l.delta);
  }
  add("in_flight", deltas);
  const nlohmann::json meta = {{"format", kWorkerStateFormat}, {"step", state.step}, {"slot", slot},
                               {"cursor", state.cursor.to_json()}, {"fragments", state.theta_m.size()},
                               {"parts", o.theta.size()}, {"versions", o.versions},
                               {"steps_since", o.steps_since}, {"tokens_since", o.tokens_since},
                               {"in_flight", in_flight}};
  write_safetensors(tmp / "state.safetensors", tensors, {{"state", meta.dump()}});
  job.save_state(tmp / "inner", state.step);
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec) throw InputError("cannot put the worker state in place at '" + dir.string() + "': " + ec.message());
  // This slot's states (and a .tmp a kill left) before the newest step every slot has completed: the workers drift
  // apart by up to H + τ steps between merges, so a state this worker is past may be the newest complete one.
  const auto steps = saved_steps(run_dir);
  const auto complete = std::find_if(steps.rbegin(), steps.rend(),
                                     [&](int64_t x) { return worker_states_complete(run_dir, x, M); });
  if (complete == steps.rend()) return;
  for (int64_t x : steps) {
    if (x >= *complete) break;
    std::error_code ignored;
    const fs::path own = worker_state_dir(run_dir, x, slot);
    fs::remove_all(own, ignored);
    fs::remove_all(own.string() + ".tmp", ignored);
    fs::remove(step_dir(run_dir, x), ignored);  // only once empty: the other slots remove theirs
  }
}

void discard_states_after(const fs::path& run_dir, int64_t step) {
  std::error_code ec;
  for (int64_t x : saved_steps(run_dir)) {
    if (x > step) fs::remove_all(step_dir(run_dir, x), ec);
  }
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints", ec)) {
    const std::string name = e.path().filename().string();  // step_<08d>[_rNNN][.tmp]
    if (name.rfind("step_", 0) != 0) continue;
    try {
      if (std::stoll(name.substr(5, 8)) > step) fs::remove_all(e.path(), ec);
    } catch (const std::exception&) {
    }
  }
}

WorkerState load_worker_state(const fs::path& run_dir, int64_t step, int slot) {
  const fs::path dir = worker_state_dir(run_dir, step, slot);
  try {
    if (!fs::exists(dir / "state.safetensors")) throw InputError("it is missing");
    const SafetensorsFile file = read_safetensors(dir / "state.safetensors");
    const auto meta = parse_json(file.metadata.at("state"), "the worker state's metadata");
    if (meta.value("format", 0) != kWorkerStateFormat) {
      throw InputError("format " + meta.value("format", nlohmann::json(0)).dump() + ", this build reads " +
                       std::to_string(kWorkerStateFormat));
    }
    if (json_integer(meta.at("step"), "step") != step || json_integer(meta.at("slot"), "slot") != slot) {
      throw InputError("written for step " + meta.at("step").dump() + ", slot " + meta.at("slot").dump());
    }
    WorkerState s;
    s.step = step;
    s.cursor = StreamCursor::from_json(meta.at("cursor"));
    s.theta_m = read_parts(file, "theta_m", count_of(meta, "fragments", 1 << 20));
    const auto parts = count_of(meta, "parts", 1 << 20);
    s.outer.theta = read_parts(file, "theta", parts);
    s.outer.momentum = read_parts(file, "momentum", parts);
    s.outer.versions = int_list(meta, "versions");
    s.outer.steps_since = int_list(meta, "steps_since");
    s.outer.tokens_since = int_list(meta, "tokens_since");
    const auto& in_flight = meta.at("in_flight");
    const auto deltas = read_parts(file, "in_flight", in_flight.size());
    for (size_t k = 0; k < in_flight.size(); ++k) {
      const auto& f = in_flight[k];
      OuterState::Landed l{static_cast<int>(count_of(f, "fragment", 1 << 20)), json_integer(f.at("round"), "round"),
                           json_integer(f.at("apply_at"), "apply_at"), f.at("merged").get<bool>(), deltas[k]};
      // a merge started at its round u ≤ step lands at u + τ > step, in due order
      if (l.round > step || l.apply_at <= step || (k > 0 && l.apply_at < s.outer.in_flight.back().apply_at)) {
        throw InputError("a merge in flight started at step " + std::to_string(l.round) + " to land at step " +
                         std::to_string(l.apply_at) + " cannot be in flight at step " + std::to_string(step));
      }
      s.outer.in_flight.push_back(std::move(l));
    }
    return s;
  } catch (const std::out_of_range& e) {
    throw InputError("worker state '" + dir.string() + "' is damaged: " + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw InputError("worker state '" + dir.string() + "' is damaged: " + e.what());
  } catch (const InputError& e) {
    throw InputError("cannot resume slot " + std::to_string(slot) + " from '" + dir.string() + "': " + e.what());
  }
}

void restore_inner_state(const fs::path& run_dir, int64_t step, int slot, InnerJob& job) {
  const fs::path dir = worker_state_dir(run_dir, step, slot) / "inner";
  std::string why = "it has none";
  if (job.restore_state(dir, &why) != step) {
    throw InputError("cannot resume slot " + std::to_string(slot) + ": no usable inner optimizer state in '" +
                     dir.string() + "' (" + why + ")");
  }
}

bool worker_states_complete(const fs::path& run_dir, int64_t step, int M) {
  for (int s = 0; s < M; ++s) {
    std::error_code ec;
    if (!fs::exists(worker_state_dir(run_dir, step, s) / "state.safetensors", ec)) return false;
    if (!fs::exists(worker_state_dir(run_dir, step, s) / "inner" / "state.json", ec)) return false;
  }
  return true;
}

std::optional<CheckpointInfo> resumable_checkpoint(const Config& config) {
  const fs::path run_dir = config.run_dir();
  if (config.diloco.mode == Mode::kDp) return latest_checkpoint(run_dir);
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && name.find(".tmp") == std::string::npos) {
      dirs.push_back(e.path());
    }
  }
  std::sort(dirs.rbegin(), dirs.rend());
  for (const auto& dir : dirs) {
    try {
      CheckpointInfo c = resolve_checkpoint(dir);
      if (worker_states_complete(run_dir, c.step, static_cast<int>(config.diloco.learners))) return c;
    } catch (const InputError&) {
    }
  }
  return std::nullopt;
}

}  // namespace dloco
