// The syncer process: Θ initialised from the run seed (or restored from disk), the gRPC server, the merger.
#include <csignal>
#include <cstdlib>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "core/atomic_file.h"
#include "data/tokenizer.h"
#include "launcher/roles.h"
#include "syncer/handshake.h"
#include "syncer/syncer_service.h"
#include "train/fragment_io.h"
#include "train/threads.h"
#include "transport/grpc_options.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {
std::atomic<int> g_syncer_signal{0};
extern "C" void on_syncer_signal(int sig) { g_syncer_signal.store(sig); }

std::string secret_of(const Config& config) {
  const char* env = std::getenv("DLOCO_SECRET");
  return env && *env ? std::string(env) : config.run.secret;
}
}  // namespace

v1::Handshake make_handshake(const Config& config, const FragmentLayout& layout) {
  v1::Handshake h;
  h.set_run_id(config.run.name);
  h.set_protocol_version(kProtocolVersion);
  h.set_secret(secret_of(config));
  h.set_layout_hash(layout.hash);
  h.set_model_hash(model_config_hash(config.model));
  h.set_tokenizer_hash(tokenizer_file_hash(fs::path(config.data.dir) / "tokenizer.model"));
  return h;
}

HandshakeExpectation expected_handshake(const Config& config, const FragmentLayout& layout) {
  const auto h = make_handshake(config, layout);
  return {h.run_id(), h.secret(), h.layout_hash(), h.model_hash(), h.tokenizer_hash()};
}

int run_syncer(const Config& config, const SyncerOptions& options) {
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
  const HandshakeExpectation expect = expected_handshake(config, layout);
  auto state = std::make_unique<SyncerState>(config, layout, std::move(theta), &GPTImpl::is_embedding);
  SyncerService service(config, std::move(state), expect, options.run_dir, &events);

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &port);
  configure_server(builder);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    throw InputError("the syncer cannot listen on '" + options.address + "' (address in use or invalid)");
  }
  const std::string host = options.address.substr(0, options.address.rfind(':'));
  const std::string bound = (host == "0.0.0.0" || host.empty() ? "127.0.0.1" : host) + ":" + std::to_string(port);
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
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace dloco
