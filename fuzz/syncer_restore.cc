// Fuzz target: what a restarted syncer reads back (syncer/syncer_store.h, docs/protocol.md §4 "Durability"):
// run_dir/syncer/state.json and a fragment file (safetensors: Θ_p, v_p, version and layout hash in its metadata).
// Input: the state.json text, the line "--fragment--", then fragment 0's file bytes (fragment 1 is written by the
// store itself, as a run leaves it). The syncer then starts over them: it may refuse with InputError, or skip what is
// unusable; when it starts, Θ as it hands it out is finite and of the layout's size, and its status and dashboard
// JSON can be made.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "core/check.h"
#include "core/fragments.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/fuzz_syncer.h"
#include "process/events.h"
#include "syncer/syncer_service.h"
#include "syncer/syncer_store.h"
#include "transport/codec.h"

using namespace dloco;
namespace fs = std::filesystem;

namespace {

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  const fs::path dir = fuzz::scratch_dir() / "syncer_restore";
  fs::remove_all(dir);
  fs::create_directories(dir / "syncer");
  const Config config = fuzz::syncer_config();
  const FragmentLayout layout = fuzz::syncer_layout();
  const wire::Handshake handshake = fuzz::syncer_handshake(layout);

  std::string_view in = fuzz::as_text(data, size);
  fuzz::write_bytes(dir / "syncer" / "state.json", fuzz::take_until(in, "\n--fragment--\n"));
  {
    SyncerStore store(dir, layout.hash);
    const std::vector<float> theta(static_cast<size_t>(layout.fragments[1].numel), 0.25f), momentum(theta.size(), 0.0f);
    store.write_fragment(1, 3, theta, momentum);
  }
  char name[64];
  std::snprintf(name, sizeof(name), "fragment_%04d.safetensors", 0);
  fuzz::write_bytes(dir / "syncer" / name, in);

  std::vector<std::vector<float>> theta;
  for (const auto& f : layout.fragments) theta.emplace_back(static_cast<size_t>(f.numel), 0.5f);
  auto state = std::make_unique<SyncerState>(config, layout, std::move(theta), [](const std::string&) { return false; });
  EventLog events(dir / "syncer.jsonl", Role::kSyncer, 0);
  std::unique_ptr<SyncerService> service;
  try {
    service = std::make_unique<SyncerService>(
        config, std::move(state), handshake, dir, &events,
        [&](const std::vector<SafetensorsEntry>&, const nlohmann::json&, int64_t) { return dir / "ckpt"; });
  } catch (const InputError&) {
    return 0;
  }
  wire::JoinRequest evaluator;
  evaluator.handshake = handshake;
  evaluator.learner_id = -1;
  const auto joined = service->join(evaluator);
  if (joined.ok()) {
    const auto snap = service->snapshot(joined.value.session_id);
    fuzz::require(snap.ok(), "the snapshot was refused");
    fuzz::require(snap.value.fragments.size() == layout.fragments.size(), "a snapshot of another fragment count");
    for (size_t p = 0; p < snap.value.fragments.size(); ++p) {
      const std::vector<float> values = wire::fragment_values(snap.value.fragments[p]);
      fuzz::require(static_cast<int64_t>(values.size()) == layout.fragments[p].numel, "a fragment of another size");
      for (float v : values) fuzz::require(std::isfinite(v), "a restored syncer hands out a non-finite Θ");
    }
  }
  (void)service->status();
  (void)service->monitor_status().dump();
  (void)service->metrics_text();
  return 0;
}
