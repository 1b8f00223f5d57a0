// The leader's inner job and the other ranks' command loop; see group_inner_job.h.
#include "learner/group_inner_job.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "process/atomic_file.h"
#include "process/json_file.h"
#include "train/fragment_io.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

constexpr int kStateFormat = 2;  // of state.json: 1 is the one-process learner's (learner/gpt_inner_job.cc)

// What every rank of a group must agree on before the first command (its own build and config): a version of the
// command set, the fragment layout's hash and the window shape. The leader broadcasts it; a rank that differs stops.
constexpr int64_t kCommandsVersion = 3;  // 2: the replica check; 3: windows of B rows of T + 1 tokens
torch::Tensor agreement(const FragmentLayout& layout, const TrainConfig& train, const ModelConfig& model) {
  return torch::tensor({kCommandsVersion, static_cast<int64_t>(layout.hash), train.grad_accum,
                        window_tokens(train.batch_size, model.seq_len)},
                       torch::kLong);
}

// The commands; the header is a (4) double tensor [op, a, b, text bytes], then the op's payload.
enum Op : int { kStep = 1, kRead, kWrite, kSave, kRestore, kKeepAlive, kStop, kCheck };

std::atomic<bool> g_check_requested{false};  // request_replica_check(): lock-free, set from a signal handler

// Every rank's RankEngine::replica_mismatch() to every rank (one all-gather of a fixed-size record): the first
// non-empty one by rank, "rank r: …", the same text on every rank, or "".
std::string agree_on_mismatch(const std::string& mine, Collective& group) {
  constexpr int64_t kBytes = 320;
  auto record = torch::zeros({kBytes}, torch::kUInt8);  // the text, NUL-padded (truncated if longer)
  std::memcpy(record.data_ptr<uint8_t>(), mine.data(), std::min<size_t>(mine.size(), kBytes - 1));
  const auto all = group.all_gather(record);
  for (int r = 0; r < group.world(); ++r) {
    const auto* text = reinterpret_cast<const char*>(all[r].data_ptr<uint8_t>());
    if (text[0] != 0) return "rank " + std::to_string(r) + ": " + std::string(text, strnlen(text, kBytes));
  }
  return "";
}

// One engine step under the adaptive deadline (parallel/step_deadline.h): the group's and the engine's collectives
// get deadline.seconds() for the step, the cap again after it, and the step's time is recorded. Not in the dp
// baseline over groups: its steps wait for the slowest other learner (run.collective_timeout_s decides there).
EngineStep timed_step(RankEngine& engine, Collective& group, StepDeadline& deadline, const torch::Tensor& windows,
                      double lr) {
  if (engine.has_replicas()) return engine.step(windows, lr);
  const auto set = [&](double s) {
    group.set_timeout(s);
    engine.set_step_timeout(s);
  };
  set(deadline.seconds());
  const auto t0 = std::chrono::steady_clock::now();
  const EngineStep r = engine.step(windows, lr);
  deadline.record(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  set(deadline.cap());
  return r;
}

// The replica check on any rank: throws CollectiveError (the group stops; the launcher restarts it from Θ) when a
// replica differs, after every rank took part.
void check_replicas_on(RankEngine& engine, Collective& group) {
  const std::string found = agree_on_mismatch(engine.replica_mismatch(), group);
  if (!found.empty()) throw CollectiveError("learner group: replicas differ (" + found + ")");
}

// A tensor fragment p touches, and whether the fragment holds all of its rows (then a write needs no gather).
struct Touched {
  int tensor = 0;
  bool whole = false;
};

std::vector<Touched> touched_by(const FragmentLayout& layout, int p) {
  std::vector<Touched> out;
  std::vector<int64_t> rows;
  for (const auto& b : layout.fragments.at(static_cast<size_t>(p)).blocks) {
    if (out.empty() || out.back().tensor != b.tensor_index) {
      out.push_back({b.tensor_index, false});
      rows.push_back(0);
    }
    rows.back() += b.row_end - b.row_begin;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].whole = rows[i] == layout.tensors[static_cast<size_t>(out[i].tensor)].rows();
  }
  return out;
}

// The text a command carries (a folder path), broadcast from the leader after the header.
std::string receive_text(Collective& group, int64_t bytes) {
  auto buf = torch::empty({bytes}, torch::kUInt8);
  group.broadcast(buf, 0);
  return std::string(reinterpret_cast<const char*>(buf.data_ptr<uint8_t>()), static_cast<size_t>(bytes));
}

fs::path rank_file(const fs::path& folder, int rank) { return folder / ("rank_" + std::to_string(rank) + ".pt"); }

// Every rank: its optimizer state into folder/rank_<r>.pt (written under a temporary name, then renamed).
void save_rank(RankEngine& engine, const Collective& group, const fs::path& folder) {
  fs::create_directories(folder);
  const fs::path file = rank_file(folder, group.rank());
  fs::path tmp = file;
  tmp += ".tmp";
  engine.save_state(tmp);
  fs::rename(tmp, file);
}

// Every rank: loads its file; if any rank failed, every rank resets. Returns the first error of this rank ("" if
// it loaded) and the number of ranks that failed.
std::pair<std::string, int64_t> restore_ranks(RankEngine& engine, Collective& group, const fs::path& folder) {
  std::string error;
  try {
    engine.load_state(rank_file(folder, group.rank()));
  } catch (const std::exception& e) {  // a foreign or corrupt file: this rank starts fresh, and so does every rank
    error = e.what();
  }
  auto failed = torch::tensor({error.empty() ? int64_t{0} : int64_t{1}});
  group.allreduce_sum(failed);
  const int64_t n = failed.item<int64_t>();
  if (n > 0) engine.reset_state();
  return {error, n};
}

}  // namespace

GroupInnerJob::GroupInnerJob(GPT mirror, const FragmentLayout& layout, const TrainConfig& train,
                             LrSchedule schedule, DataStream stream, std::unique_ptr<RankEngine> engine,
                             std::unique_ptr<Collective> group, double timeout_s)
    : layout_(layout),
      mirror_(std::move(mirror)),
      mirror_params_(layout_parameters(mirror_, layout_)),
      train_(train),
      schedule_(std::move(schedule)),
      stream_(std::move(stream)),
      engine_(std::move(engine)),
      group_(std::move(group)),
      last_command_(std::chrono::steady_clock::now()),
      keep_alive_s_(timeout_s / 4),
      deadline_(timeout_s, std::min(5.0, timeout_s)) {
  DLOCO_CHECK_EQ(group_->rank(), 0);
  guarded([&] { group_->broadcast(agreement(layout_, train_, mirror_->config()), 0); });
}

GroupInnerJob::~GroupInnerJob() {
  if (failed_) return;
  try {
    command(kStop);
  } catch (const std::exception&) {
    // the ranks stop at their deadline
  }
}

template <class F>
auto GroupInnerJob::guarded(F&& f) -> decltype(f()) {
  if (failed_) throw CollectiveError("the learner group failed earlier; it must be restarted as a whole");
  try {
    return f();
  } catch (...) {  // mid-command: the ranks may be inside a collective, so the group cannot go on
    failed_ = true;
    throw;
  }
}

void GroupInnerJob::command(int op, double a, double b, const std::string& text) {
  auto header = torch::tensor({static_cast<double>(op), a, b, static_cast<double>(text.size())}, torch::kDouble);
  group_->broadcast(header, 0);
  if (!text.empty()) {
    auto buf = torch::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())}, torch::kUInt8);
    group_->broadcast(buf.clone(), 0);
  }
  last_command_ = std::chrono::steady_clock::now();
}

void request_replica_check() { g_check_requested.store(true); }

void GroupInnerJob::check_replicas() {
  guarded([&] {
    command(kCheck);
    check_replicas_on(*engine_, *group_);
  });
}

InnerStep GroupInnerJob::step(int64_t step) {
  if (g_check_requested.exchange(false)) check_replicas();
  return guarded([&] {
    const int64_t W = train_.grad_accum, n = window_tokens(train_.batch_size, mirror_->config().seq_len);
    auto windows = torch::empty({W, n}, torch::kLong);  // (W, B·(T + 1))
    for (int64_t w = 0; w < W; ++w) {
      stream_.next(std::span<int64_t>(windows[w].data_ptr<int64_t>(), static_cast<size_t>(n)));
    }
    const double lr = schedule_.at(step);
    command(kStep, static_cast<double>(W), lr);
    group_->broadcast(windows, 0);
    const EngineStep r = timed_step(*engine_, *group_, deadline_, windows, lr);
    return InnerStep{r.loss, W * train_.batch_size * mirror_->config().seq_len, r.skipped, r.grad_norm};
  });
}

void GroupInnerJob::read_fragment(int p, std::span<float> out) {
  guarded([&] {
    command(kRead, p);
    torch::NoGradGuard no_grad;
    for (const auto& t : touched_by(layout_, p)) {
      mirror_params_[static_cast<size_t>(t.tensor)].copy_(engine_->gather_parameter(layout_.tensors[t.tensor].name));
    }
    gather_parameters(mirror_params_, layout_, p, out);
  });
}

void GroupInnerJob::write_fragment(int p, std::span<const float> values) {
  guarded([&] {
    command(kWrite, p);
    torch::NoGradGuard no_grad;
    const auto touched = touched_by(layout_, p);
    for (const auto& t : touched) {  // rows outside the fragment must be the group's current ones
      if (!t.whole) {
        mirror_params_[static_cast<size_t>(t.tensor)].copy_(engine_->gather_parameter(layout_.tensors[t.tensor].name));
      }
    }
    scatter_parameters(mirror_params_, layout_, p, values);
    for (const auto& t : touched) {
      auto full = mirror_params_[static_cast<size_t>(t.tensor)].detach();
      group_->broadcast(full, 0);
      engine_->set_parameter(layout_.tensors[t.tensor].name, full);
    }
  });
}

void GroupInnerJob::save_state(const fs::path& dir, int64_t step) {
  check_replicas();  // a diverged replica's state is never saved
  guarded([&] {
    // A folder never written before (the step and a counter): the one state.json names is never touched, even
    // when a restarted learner saves at the same global step again.
    int64_t counter = 0;
    std::error_code ec;
    for (; fs::exists(dir / ("group_" + std::to_string(step) + "_" + std::to_string(counter)), ec); ++counter) {
    }
    const std::string name = "group_" + std::to_string(step) + "_" + std::to_string(counter);
    command(kSave, static_cast<double>(step), 0, (dir / name).string());
    save_rank(*engine_, *group_, dir / name);
    group_->barrier();  // every rank's file is in place
    write_file_atomically(dir / "state.json", nlohmann::json{{"format", kStateFormat},
                                                             {"step", step},
                                                             {"ranks", group_->world()},
                                                             {"group", engine_->describe()},
                                                             {"layout", layout_.hash},
                                                             {"folder", name}}.dump() + "\n");
    for (const auto& entry : fs::directory_iterator(dir)) {  // the previous saves
      const auto file = entry.path().filename().string();
      if (entry.is_directory() && file.rfind("group_", 0) == 0 && file != name) fs::remove_all(entry.path());
    }
  });
}

int64_t GroupInnerJob::restore_state(const fs::path& dir, std::string* why) {
  std::error_code ec;
  if (!fs::exists(dir / "state.json", ec)) return -1;
  std::string folder;
  int64_t step = -1;
  try {
    const auto state = read_json_file(dir / "state.json");
    if (state.at("format").get<int>() != kStateFormat || state.at("ranks").get<int>() != group_->world() ||
        state.at("group").get<std::string>() != engine_->describe() ||
        state.at("layout").get<uint64_t>() != layout_.hash) {
      *why = "state.json was written by another learner group or model (" + state.dump() + "; this one is " +
             engine_->describe() + ")";
      return -1;
    }
    folder = state.at("folder").get<std::string>();
    step = state.at("step").get<int64_t>();
  } catch (const std::exception& e) {
    *why = std::string("state.json is unusable: ") + e.what();
    return -1;
  }
  if (folder.rfind("group_", 0) != 0 || folder.find('/') != std::string::npos || folder.find("..") != std::string::npos) {
    *why = "state.json names the folder '" + folder + "', not a group_* folder beside it";
    return -1;
  }
  return guarded([&]() -> int64_t {
    command(kRestore, 0, 0, (dir / folder).string());
    const auto [error, failed] = restore_ranks(*engine_, *group_, dir / folder);
    if (failed > 0) {
      *why = std::to_string(failed) + " of " + std::to_string(group_->world()) +
             " ranks could not load their state (every rank starts fresh)" + (error.empty() ? "" : ": " + error);
      return -1;
    }
    return step;
  });
}

void GroupInnerJob::idle() {
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last_command_).count() < keep_alive_s_) return;
  guarded([&] { command(kKeepAlive); });
}

int64_t serve_group_rank(RankEngine& engine, Collective& group, const FragmentLayout& layout,
                         const TrainConfig& train, const ModelConfig& model) {
  torch::NoGradGuard no_grad_outside_steps;  // the engines enable grad inside their steps
  const auto mine = agreement(layout, train, model), leaders = torch::empty_like(mine);
  group.broadcast(leaders, 0);
  if (!torch::equal(mine, leaders)) {
    throw InputError("learner group: this rank's build or config differs from its leader's (command set version, "
                     "layout hash, grad_accum, window: leader " + c10::str(leaders) + ", this rank " + c10::str(mine) +
                     "); start every rank with the same dloco and the same config");
  }
  int64_t steps = 0;
  StepDeadline deadline(group.timeout_s(), std::min(5.0, group.timeout_s()));  // as the leader's
  for (;;) {
    auto header = torch::empty({4}, torch::kDouble);
    group.broadcast(header, 0);
    const auto* h = header.data_ptr<double>();
    const int op = static_cast<int>(h[0]);
    // The header comes from the group's leader; a value outside what that leader can send is refused, not used
    // as an allocation size or an index.
    const bool fragment_op = op == kRead || op == kWrite;
    if (!(h[3] >= 0 && h[3] <= 4096) || (op == kStep && !(h[1] >= 1 && h[1] <= train.grad_accum)) ||
        (fragment_op && !(h[1] >= 0 && h[1] < layout.num_fragments()))) {
      throw InputError("learner group: the leader sent a malformed command (op " + std::to_string(op) + ", " +
                       std::to_string(h[1]) + ", text of " + std::to_string(h[3]) + " bytes)");
    }
    const std::string text = h[3] > 0 ? receive_text(group, static_cast<int64_t>(h[3])) : "";
    switch (op) {
      case kStep: {
        auto windows = torch::empty({static_cast<int64_t>(h[1]), window_tokens(train.batch_size, model.seq_len)},
                                    torch::kLong);
        group.broadcast(windows, 0);
        torch::AutoGradMode with_grad(true);
        (void)timed_step(engine, group, deadline, windows, h[2]);
        ++steps;
        break;
      }
      case kRead:
      case kWrite: {
        const auto touched = touched_by(layout, static_cast<int>(h[1]));
        for (const auto& t : touched) {
          if (op == kRead || !t.whole) (void)engine.gather_parameter(layout.tensors[t.tensor].name);
        }
        if (op == kRead) break;
        for (const auto& t : touched) {
          const auto& spec = layout.tensors[static_cast<size_t>(t.tensor)];
          auto full = torch::empty(spec.shape);
          group.broadcast(full, 0);
          engine.set_parameter(spec.name, full);
        }
        break;
      }
      case kSave:
        save_rank(engine, group, text);
        group.barrier();
        break;
      case kRestore:
        (void)restore_ranks(engine, group, text);
        break;
      case kKeepAlive:
        break;
      case kCheck:
        check_replicas_on(engine, group);
        break;
      case kStop:
        return steps;
      default:
        throw InputError("learner group: the leader sent command " + std::to_string(op) +
                         ", which this build does not know (run the same dloco build on every rank)");
    }
  }
}

}  // namespace dloco
