// The syncer process: Θ initialised from the run seed (or restored from disk), served on a transport, the merger.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <thread>

#include <spdlog/spdlog.h>

#include "monitor/dashboard.h"
#include "monitor/monitor_server.h"
#include "process/atomic_file.h"
#include "syncer/syncer.h"
#include "syncer/syncer_service.h"
#include "train/checkpoint.h"
#include "train/fragment_io.h"
#include "train/run.h"
#include "train/threads.h"
#include "transport/handshake.h"
#include "transport/status_json.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {
std::atomic<int> g_syncer_signal{0};
extern "C" void on_syncer_signal(int sig) { g_syncer_signal.store(sig); }

// A syncer started by hand: one console row per report interval (the launcher's row, from the same status).
void print_row(const wire::StatusReply& s, const Config& config) {
  int live = 0;
  for (const auto& l : s.learners) live += l.live ? 1 : 0;
  const int64_t slots = std::max<int64_t>(config.diloco.learners, static_cast<int64_t>(s.learners.size()));
  char val[32] = "  -  ";
  if (s.last_eval_step >= 0) std::snprintf(val, sizeof(val), "%.3f", s.last_val_loss);
  spdlog::info("[syncer] {:3.0f}% t {:5} | val {} | merges {:5} | quorum {} | live {}/{}",
               100.0 * static_cast<double>(s.tokens_trained) / std::max<int64_t>(1, config.train.total_tokens),
               static_cast<long long>(s.global_step), val, static_cast<long long>(s.merges),
               static_cast<long long>(s.last_quorum), live, static_cast<long long>(slots));
}

// A syncer started by hand writes the run's report itself: the final checkpoint evaluated on the whole validation
// split (1 thread), the run's counters and every learner's bytes.
void write_report(const Config& config, const fs::path& run_dir, const wire::StatusReply& s, const fs::path& ckpt,
                  double wall, int signal) {
  nlohmann::json eval = {{"val_loss", nullptr}, {"val_perplexity", nullptr}};
  try {
    eval = evaluate_checkpoint(ckpt, std::nullopt, 0, 1);
  } catch (const InputError& e) {
    spdlog::info("[syncer] no final evaluation: {}", e.what());
  }
  nlohmann::json bytes = {{"syncer", {{"sent", s.bytes_sent}, {"received", s.bytes_received}}}};
  nlohmann::json learners = nlohmann::json::array();
  for (const auto& l : s.learners) {
    bytes["learner_" + std::to_string(l.id)] = {{"sent", l.bytes_sent}, {"received", l.bytes_received}};
    learners.push_back({{"id", l.id}, {"tokens_trained", l.tokens_trained}, {"steps", l.step}});
  }
  const std::string status = signal != 0 || !s.finished ? "stopped"
                             : s.tokens_trained < config.complete_tokens() ? "incomplete"
                                                                           : "finished";
  const nlohmann::json report = {
      {"run", config.run.name}, {"mode", "decoupled"}, {"status", status}, {"written_by", "syncer"},
      {"final_val_loss", eval["val_loss"]}, {"final_val_perplexity", eval["val_perplexity"]},
      {"global_step", s.global_step}, {"steps", s.global_step}, {"merges", s.merges},
      {"tokens_trained", s.tokens_trained}, {"tokens_budget", config.train.total_tokens},
      {"tokens_complete", config.complete_tokens()}, {"wall_seconds", wall},
      {"tokens_per_second", s.tokens_trained / std::max(wall, 1e-9)}, {"learners", learners},
      {"answers_dropped", s.answers_dropped}, {"answers_refused", s.answers_refused},
      {"screening", wire::screening_json(s)},
      {"checkpoint", ckpt.string()}, {"bytes", bytes}, {"signal", signal}};
  write_file_atomically(run_dir / "report.json", report.dump(2) + "\n");
  if (eval["val_loss"].is_number()) {
    spdlog::info("[syncer] final validation loss {:.4f} nats/token (perplexity {:.1f}); report {}",
                 eval["val_loss"].get<double>(), eval["val_perplexity"].get<double>(),
                 (run_dir / "report.json").string());
  }
  if (status == "incomplete") {
    spdlog::info("[syncer] INCOMPLETE: {} tokens trained where a run that trains its budget reaches {} (learners "
                 "that never started or left for good)", static_cast<long long>(s.tokens_trained),
                 static_cast<long long>(config.complete_tokens()));
  }
}

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
  events.emit("listening", {{"address", server->listen_address()}, {"dial", bound}, {"layout_hash", layout.hash},
                            {"fragments", layout.fragments.size()},
                            {"parameters", layout.total_numel}});
  const std::string listening = server->listen_address();
  spdlog::info("[syncer] listening on {}{}: P = {} fragments, {} parameters, layout {:016x}", listening,
               listening == bound ? "" : (" (every interface; on this machine " + bound + ")"),
               layout.fragments.size(), static_cast<long long>(layout.total_numel),
               static_cast<unsigned long long>(layout.hash));
  // The monitoring endpoint (docs/monitoring.md): /metrics, /status.json and the dashboard.
  std::unique_ptr<MonitorServer> monitor;
  if (!config.run.monitor.empty()) {
    monitor = std::make_unique<MonitorServer>(
        config.run.monitor, MonitorServer::Routes{[&service] { return service.metrics_text(); },
                                                  [&service] { return service.monitor_status().dump(); },
                                                  dashboard_page()},
        transport_security(config));
    write_file_atomically(options.run_dir / "monitor.url", monitor->url() + "\n");
    events.emit("monitor", {{"url", monitor->url()}, {"address", monitor->address()}});
    spdlog::info("[syncer] dashboard {} (metrics: {}metrics)", monitor->url(), monitor->url());
  }

  // Last: a launcher reading the address file finds the monitoring URL already written.
  if (!options.address_file.empty()) write_file_atomically(options.address_file, bound + "\n");
  std::signal(SIGTERM, on_syncer_signal);
  std::signal(SIGINT, on_syncer_signal);
  const auto started = std::chrono::steady_clock::now();
  auto last_row = started;
  service.start();
  while (!service.finished() && g_syncer_signal.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (options.by_hand && std::chrono::steady_clock::now() - last_row >=
                               std::chrono::duration<double>(config.run.report_interval_s)) {
      last_row = std::chrono::steady_clock::now();
      print_row(service.status(), config);
    }
  }
  if (service.finished()) {
    // Let learners read their stop message, then close.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  } else {
    events.emit("stopping", {{"signal", g_syncer_signal.load()}});
  }
  monitor.reset();
  service.stop();
  const wire::StatusReply last = service.status();  // after the merger stopped: nothing moves any more
  service.persist_final_state();  // state.json, the checkpoint below and the report name the same step and tokens
  // A resumed run stopped before any merge keeps the checkpoint it resumed from when that holds this Θ (same step and
  // fragment versions: a syncer killed in its final flush persisted fragments newer than its last checkpoint).
  const auto newest = latest_checkpoint(options.run_dir);
  const bool unchanged = !service.merged_since_start() && newest && newest->step == last.global_step &&
                         newest->manifest.value("fragment_versions", nlohmann::json()) ==
                             nlohmann::json(service.published_versions());
  const fs::path ckpt = unchanged ? newest->dir : service.write_checkpoint();
  events.emit("checkpoint", {{"path", ckpt.string()}, {"written", !unchanged}});
  server.reset();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  spdlog::info("[syncer] {} at global step {}: {} merges, {} of {} tokens trained, {:.0f} s; Θ checkpointed "
               "to {}", last.finished ? "finished" : "stopped", static_cast<long long>(last.global_step),
               static_cast<long long>(last.merges), static_cast<long long>(last.tokens_trained),
               static_cast<long long>(config.train.total_tokens), wall, ckpt.string());
  if (options.by_hand) write_report(config, options.run_dir, last, ckpt, wall, g_syncer_signal.load());
  return 0;
}

}  // namespace dloco
