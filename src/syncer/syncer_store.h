// What the syncer keeps on disk under run_dir/syncer (docs/protocol.md §4 "Durability"): one safetensors file per
// fragment (Θ_p, v_p; its version and the layout hash in the metadata), written atomically before the version is
// published, and state.json (format 1: the clock, versions, stream cursors and leases, tokens trained), written
// atomically about once a second and when the run ends. A file cut off mid-write, of another layout or of another
// format is skipped with the reason, never half-read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dloco {

class SyncerStore {
 public:
  static constexpr int kStateFormat = 1;

  /// Creates run_dir/syncer if needed. `layout_hash` tags every fragment file.
  SyncerStore(const std::filesystem::path& run_dir, uint64_t layout_hash);

  /// Writes fragment p at `version` (atomically). Throws InputError if the file cannot be written.
  void write_fragment(int p, int64_t version, std::span<const float> theta, std::span<const float> momentum) const;

  struct Fragment {
    int p = 0;
    int64_t version = 0;
    std::vector<float> theta, momentum;
  };
  /// Every usable fragment file among 0 … P−1; `skipped` gets "fragment p: reason" for each unusable one.
  std::vector<Fragment> read_fragments(int P, std::vector<std::string>* skipped) const;

  /// Writes state.json with "format" added (atomically).
  void write_state(nlohmann::json state) const;
  /// state.json, or nullopt when there is none or it is unusable (`why` says why; empty when there is none).
  std::optional<nlohmann::json> read_state(std::string* why) const;

 private:
  std::filesystem::path dir_;
  uint64_t layout_hash_;
};

}  // namespace dloco
