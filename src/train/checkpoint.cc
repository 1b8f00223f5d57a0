// Checkpoint writing and loading; see checkpoint.h.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/hash.h"
#include "core/json_read.h"
#include "core/safetensors.h"
#include "process/atomic_file.h"
#include "process/safetensors_file.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

fs::path step_dir(const fs::path& run_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(step));
  return run_dir / "checkpoints" / name;
}

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A checkpoint folder is valid if its manifest parses and its files match their recorded sizes and hashes;
// otherwise `why` says what is wrong.
std::optional<CheckpointInfo> inspect(const fs::path& dir, std::string* why) {
  std::error_code ec;
  auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (!fs::is_regular_file(dir / "manifest.json", ec)) return fail("no manifest.json (an unfinished write?)");
  try {
    auto manifest = parse_json(read_all(dir / "manifest.json"), "manifest.json");
    if (manifest.value("format", "") != "dloco-checkpoint") return fail("manifest.json is not a dloco checkpoint");
    for (const char* kind : {"model", "optimizer"}) {
      const std::string key = std::string(kind) + "_file";
      if (!manifest.contains(key)) continue;
      const std::string bytes = read_all(dir / manifest[key].get<std::string>());
      if (static_cast<int64_t>(bytes.size()) != manifest.at(std::string(kind) + "_bytes").get<int64_t>() ||
          fnv1a64(bytes) != manifest.at(std::string(kind) + "_hash").get<uint64_t>()) {
        return fail(manifest[key].get<std::string>() + " does not match its recorded size and hash (truncated?)");
      }
    }
    // Every other file (a learner group's group_state/rank_<r> files), recorded by its path in the folder.
    if (manifest.contains("files")) {
      for (const auto& [name, entry] : manifest.at("files").items()) {
        if (name.empty() || name.find("..") != std::string::npos || name.front() == '/') {
          return fail("manifest.json names a file outside the checkpoint: '" + name + "'");
        }
        if (!fs::is_regular_file(dir / name, ec)) return fail(name + " is missing");
        const std::string bytes = read_all(dir / name);
        if (static_cast<int64_t>(bytes.size()) != entry.at("bytes").get<int64_t>() ||
            fnv1a64(bytes) != entry.at("hash").get<uint64_t>()) {
          return fail(name + " does not match its recorded size and hash (truncated?)");
        }
      }
    }
    return CheckpointInfo{dir, manifest.at("step").get<int64_t>(), manifest};
  } catch (const std::exception& e) {
    return fail(std::string("unreadable manifest: ") + e.what());
  }
}

}  // namespace

fs::path save_checkpoint(const fs::path& run_dir, int64_t step, GPT& model, torch::optim::Optimizer* optimizer,
                         nlohmann::json manifest, int keep,
                         const std::function<void(const fs::path&, nlohmann::json&)>& extra) {
  // Every parameter as F32, names as in GPT's named_parameters().
  std::vector<torch::Tensor> keep_alive;
  std::vector<SafetensorsEntry> entries;
  for (const auto& p : model->named_parameters()) {
    auto t = p.value().detach().to(torch::kCPU, torch::kFloat).contiguous();
    keep_alive.push_back(t);
    entries.push_back(f32_entry(p.key(), t.sizes().vec(),
                                std::span<const float>(t.data_ptr<float>(), static_cast<size_t>(t.numel()))));
  }
  auto write_optimizer = [optimizer, &extra](const fs::path& dir, nlohmann::json& m) {
    if (extra) extra(dir, m);
    if (optimizer == nullptr) return;
    torch::save(*optimizer, (dir / "optimizer.pt").string());
    fsync_path(dir / "optimizer.pt");
    const std::string bytes = read_all(dir / "optimizer.pt");
    m["optimizer_file"] = "optimizer.pt";
    m["optimizer_bytes"] = bytes.size();
    m["optimizer_hash"] = fnv1a64(bytes);
  };
  return save_checkpoint_files(run_dir, step, entries, std::move(manifest), write_optimizer, keep);
}

fs::path save_checkpoint_files(const fs::path& run_dir, int64_t step, std::span<const SafetensorsEntry> tensors,
                               nlohmann::json manifest,
                               const std::function<void(const fs::path&, nlohmann::json&)>& extra, int keep) {
  // A folder once written is never replaced: another Θ at the same step (a resumed syncer's final flush merges
  // without moving the clock) goes to the revision after the highest there, step_N_r001 …, which sorts after step_N
  // and before step_N+1, so "newest" stays the name order (the first free name could be one pruning just freed,
  // and sort first: pruned at once).
  const fs::path base = step_dir(run_dir, step);
  const std::string base_name = base.filename().string();
  int highest = -1;  // −1: no folder of this step; 0: step_N; r: step_N_r<r>
  std::error_code list_ec;
  for (const auto& e : fs::directory_iterator(base.parent_path(), list_ec)) {
    const std::string name = e.path().filename().string();
    if (name == base_name) {
      highest = std::max(highest, 0);
    } else if (name.size() == base_name.size() + 5 && name.compare(0, base_name.size(), base_name) == 0 &&
               name.compare(base_name.size(), 2, "_r") == 0 &&
               std::all_of(name.end() - 3, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      highest = std::max(highest, std::stoi(name.substr(base_name.size() + 2)));
    }
  }
  if (highest >= 999) {
    throw InputError("cannot write a checkpoint at step " + std::to_string(step) + ": its revisions up to _r999 " +
                     "exist under '" + base.parent_path().string() + "'");
  }
  fs::path final_dir = base;
  if (highest >= 0) {
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "_r%03d", highest + 1);
    final_dir += suffix;
  }
  fs::path tmp_dir = final_dir;
  tmp_dir += ".tmp";
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) throw InputError("cannot create checkpoint folder '" + tmp_dir.string() + "': " + ec.message());

  // 1) model.safetensors, 2) extra files (optimizer state), each fsynced.
  const auto image = encode_safetensors(tensors, {{"format", "pt"}, {"producer", "dloco"}});
  write_file_atomically(tmp_dir / "model.safetensors", image);
  if (extra) extra(tmp_dir, manifest);

  // 3) the size and hash of every file the extra step wrote besides the optimizer (a learner group's group_state
  // rank files), so a torn or altered one makes the checkpoint invalid like a torn model file.
  nlohmann::json files = nlohmann::json::object();
  for (const auto& e : fs::recursive_directory_iterator(tmp_dir)) {
    if (!e.is_regular_file()) continue;
    const std::string name = fs::relative(e.path(), tmp_dir).generic_string();
    if (name == "model.safetensors" || name == manifest.value("optimizer_file", "")) continue;  // hashed above
    const std::string bytes = read_all(e.path());
    files[name] = {{"bytes", bytes.size()}, {"hash", fnv1a64(bytes)}};
  }
  if (!files.empty()) manifest["files"] = files;

  // 4) manifest last, then the folder rename makes the checkpoint visible at once.
  manifest["format"] = "dloco-checkpoint";
  manifest["version"] = kCheckpointVersion;
  manifest["step"] = step;
  manifest["model_file"] = "model.safetensors";
  manifest["model_bytes"] = image.size();
  manifest["model_hash"] = fnv1a64(std::string_view(reinterpret_cast<const char*>(image.data()), image.size()));
  write_file_atomically(tmp_dir / "manifest.json", manifest.dump(2) + "\n");
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) throw InputError("cannot move checkpoint into '" + final_dir.string() + "': " + ec.message());
  fsync_path(final_dir.parent_path());

  // 5) prune: keep the newest `keep` checkpoints.
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(final_dir.parent_path())) {
    const auto name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step_", 0) == 0 && e.path().extension() != ".tmp") dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; i + static_cast<size_t>(std::max(keep, 1)) < dirs.size(); ++i) {
    if (dirs[i] != final_dir) fs::remove_all(dirs[i], ec);  // the one just written is never pruned
  }
  return final_dir;
}

std::optional<CheckpointInfo> latest_checkpoint(const fs::path& run_dir) {
  const fs::path root = run_dir / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory() && e.path().extension() != ".tmp") dirs.push_back(e.path());
  }
  std::sort(dirs.rbegin(), dirs.rend());
  for (const auto& d : dirs) {
    std::string why;
    if (auto info = inspect(d, &why)) return info;
    spdlog::warn("[checkpoint] skipping {}: {}", d.string(), why);
  }
  return std::nullopt;
}

CheckpointInfo resolve_checkpoint(const fs::path& path) {
  std::string why;
  if (auto direct = inspect(path, &why)) return *direct;
  if (fs::exists(path / "manifest.json")) throw InputError("checkpoint '" + path.string() + "' is invalid: " + why);
  if (auto latest = latest_checkpoint(path)) return *latest;
  throw InputError("no valid checkpoint at '" + path.string() +
                   "' (give a run folder such as runs/demo, or one of its checkpoints/step_* folders)");
}

Config checkpoint_config(const CheckpointInfo& checkpoint) {
  if (!checkpoint.manifest.contains("config")) {
    throw InputError("checkpoint '" + checkpoint.dir.string() + "' has no config in its manifest");
  }
  // JSON scalars are valid TOML values, so the saved config goes through the same parser and validation.
  std::string text;
  for (const auto& [section, fields] : checkpoint.manifest["config"].items()) {
    text += "[" + section + "]\n";
    for (const auto& [key, value] : fields.items()) {
      if (!value.is_array()) text += key + " = " + value.dump() + "\n";
    }
    for (const auto& [key, value] : fields.items()) {  // [[parallel.learner]]: an array of tables
      if (!value.is_array()) continue;
      for (const auto& table : value) {
        text += "[[" + section + "." + key + "]]\n";
        for (const auto& [k, v] : table.items()) text += k + " = " + v.dump() + "\n";
      }
    }
  }
  return parse_config(text, {}, (checkpoint.dir / "manifest.json").string());
}

void load_model_weights(const CheckpointInfo& checkpoint, GPT& model) {
  const auto file = read_safetensors(checkpoint.dir / checkpoint.manifest.at("model_file").get<std::string>());
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    const auto* t = file.find(p.key());
    if (t == nullptr) {
      throw InputError("checkpoint '" + checkpoint.dir.string() + "' has no tensor '" + p.key() +
                       "': it was written for another model shape");
    }
    if (t->shape != p.value().sizes().vec()) {
      throw InputError("checkpoint tensor '" + p.key() + "' has another shape than the model's: the checkpoint was "
                       "written for another model config");
    }
    auto values = t->to_floats();
    auto src = torch::from_blob(values.data(), {static_cast<int64_t>(values.size())}, torch::kFloat);
    p.value().view({-1}).copy_(src);  // in place: optimizer state stays attached
  }
}

bool load_optimizer_state(const CheckpointInfo& checkpoint, torch::optim::Optimizer& optimizer) {
  if (!checkpoint.manifest.contains("optimizer_file")) return false;
  torch::load(optimizer, (checkpoint.dir / checkpoint.manifest["optimizer_file"].get<std::string>()).string());
  return true;
}

}  // namespace dloco
