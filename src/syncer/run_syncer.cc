// The syncer process: Θ initialised from the run seed (or restored from disk), served on a transport, the merger.
#include <csignal>
#include <thread>

#include "core/atomic_file.h"
#include "syncer/syncer.h"
#include "syncer/syncer_service.h"
#include "train/checkpoint.h"
#include "train/fragment_io.h"
#include "train/threads.h"
#include "transport/handshake.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {
std::atomic<int> g_syncer_signal{0};
extern "C" void on_syncer_signal(int sig) { g_syncer_signal.store(sig); }

}  // namespace

int run_syncer(const Config& config, const SyncerOptions& options, wire::Transport& transport) {
  apply_thread_budget(ThreadBudget{1, 1});
  fs::create_directories(options.run_dir / "events");
  EventLog events(options.run_dir / "events" / "syncer.jsonl", Role::kSyncer, 0);

  // Θ at initialisation: the same seed gives every process the same model; the layout is derived from it.
  torch::manual_seed(config.run.seed);
  GPT model(config.model);
  FragmentLayout layout = model_layout(model, config.diloco);
  const auto params = layout_parameters(model, layout);
  std::vector<std::vector<float>> theta;
  for (int p = 0; p < static_cast<int>(layout.fragments.size()); ++p) {
    theta.emplace_back(static_cast<size_t>(layout.fragments[p].numel));
    gather_parameters(params, layout, p, theta.back());
  }
  auto state = std::make_unique<SyncerState>(config, layout, std::move(theta), &GPTImpl::is_embedding);
  const fs::path run_dir = options.run_dir;
  SyncerService service(config, std::move(state), make_handshake(config, layout), options.run_dir, &events,
                        [run_dir](const std::vector<SafetensorsEntry>& tensors, const nlohmann::json& manifest,
                                  int64_t step) { return save_checkpoint_files(run_dir, step, tensors, manifest); });
  std::unique_ptr<wire::Server> server = transport.serve_syncer(options.address, service);
  const std::string bound = server->address();
  events.emit("listening", {{"address", bound}, {"layout_hash", layout.hash}, {"fragments", layout.fragments.size()},
                            {"parameters", layout.total_numel}});
  std::printf("[syncer] listening on %s: P = %zu fragments, %lld parameters, layout %016llx\n", bound.c_str(),
              layout.fragments.size(), static_cast<long long>(layout.total_numel),
              static_cast<unsigned long long>(layout.hash));
  std::fflush(stdout);
  if (!options.address_file.empty()) write_file_atomically(options.address_file, bound + "\n");

  std::signal(SIGTERM, on_syncer_signal);
  std::signal(SIGINT, on_syncer_signal);
  service.start();
  while (!service.finished() && g_syncer_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (service.finished()) {
    // Let learners read their stop message, then close.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  } else {
    events.emit("stopping", {{"signal", g_syncer_signal.load()}});
  }
  service.stop();
  const auto ckpt = service.write_checkpoint();
  events.emit("checkpoint", {{"path", ckpt.string()}});
  server.reset();
  return 0;
}

}  // namespace dloco
