// The syncer's files; see syncer_store.h.
#include "syncer/syncer_store.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/json_read.h"
#include "core/safetensors.h"
#include "process/atomic_file.h"
#include "process/safetensors_file.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {
fs::path fragment_file(const fs::path& dir, int p) {
  char name[48];
  std::snprintf(name, sizeof(name), "fragment_%04d.safetensors", p);
  return dir / name;
}
}  // namespace

SyncerStore::SyncerStore(const fs::path& run_dir, uint64_t layout_hash)
    : dir_(run_dir / "syncer"), layout_hash_(layout_hash) {
  fs::create_directories(dir_);
}

void SyncerStore::write_fragment(int p, int64_t version, std::span<const float> theta,
                                 std::span<const float> momentum) const {
  const auto n = static_cast<int64_t>(theta.size());
  std::vector<SafetensorsEntry> entries = {f32_entry("theta", {n}, theta), f32_entry("momentum", {n}, momentum)};
  write_safetensors(fragment_file(dir_, p), entries,
                    {{"version", std::to_string(version)},
                     {"fragment", std::to_string(p)},
                     {"layout_hash", std::to_string(layout_hash_)}});
}

std::vector<SyncerStore::Fragment> SyncerStore::read_fragments(int P, std::vector<std::string>* skipped) const {
  std::vector<Fragment> out;
  for (int p = 0; p < P; ++p) {
    const fs::path path = fragment_file(dir_, p);
    if (!fs::exists(path)) continue;
    try {
      const auto file = read_safetensors(path);
      if (file.metadata.at("layout_hash") != std::to_string(layout_hash_)) {
        skipped->push_back("fragment " + std::to_string(p) + ": written for another fragment layout");
        continue;
      }
      Fragment f{p, std::stoll(file.metadata.at("version")), file.at("theta").to_floats(),
                 file.at("momentum").to_floats()};
      // A file whose checksum-free bytes went bad (a disk, a hand edit) must not become Θ: found by
      // fuzz/syncer_restore.cc, a non-finite value restored here was handed to every learner.
      if (f.version < 0) throw InputError("negative version " + std::to_string(f.version));
      for (const auto* values : {&f.theta, &f.momentum}) {
        if (!std::all_of(values->begin(), values->end(), [](float v) { return std::isfinite(v); })) {
          throw InputError(std::string("a non-finite value in ") + (values == &f.theta ? "theta" : "momentum"));
        }
      }
      out.push_back(std::move(f));
    } catch (const std::exception& e) {
      skipped->push_back("fragment " + std::to_string(p) + ": " + e.what());
    }
  }
  return out;
}

void SyncerStore::write_state(nlohmann::json state) const {
  state["format"] = kStateFormat;
  write_file_atomically(dir_ / "state.json", state.dump(2) + "\n");
}

std::optional<nlohmann::json> SyncerStore::read_state(std::string* why) const {
  std::ifstream in(dir_ / "state.json");
  if (!in) return std::nullopt;
  try {
    std::stringstream text;
    text << in.rdbuf();
    auto j = parse_json(text.str(), "state.json");
    if (const int format = j.value("format", kStateFormat); format != kStateFormat) {  // none: written before 1
      *why = "state.json has format " + std::to_string(format) + ", this build reads " + std::to_string(kStateFormat);
      return std::nullopt;
    }
    return j;
  } catch (const std::exception& e) {
    *why = std::string("state.json: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace dloco
