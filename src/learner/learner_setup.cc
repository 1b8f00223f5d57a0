// The learner process's set-up steps; see learner_setup.h.
#include "learner/learner_setup.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <spdlog/spdlog.h>

#include "core/json_read.h"
#include "core/lr_schedule.h"
#include "learner/gpt_inner_job.h"
#include "learner/group_engine.h"
#include "learner/group_inner_job.h"
#include "learner/group_ranks.h"
#include "process/atomic_file.h"
#include "train/fragment_io.h"
#include "train/run.h"
#include "transport/handshake.h"
#include "transport/local_address.h"

namespace dloco {

namespace fs = std::filesystem;

DataStream resume_stream(const Config& config, const wire::JoinReply& joined, const StreamLog& log, bool* from_log) {
  StreamCursor cursor{joined.stream_index, 0, 0, 0};
  if (!joined.stream_cursor_json.empty()) cursor = StreamCursor::from_json(parse_json(joined.stream_cursor_json, "the syncer's stream cursor"));
  const auto& taken = log.last_taken();
  *from_log = taken && taken->stream == joined.stream_index && taken->tokens_served >= cursor.tokens_served;
  if (*from_log) cursor = *taken;
  // The data is cut into the syncer's S streams (it leases them), whatever this learner's config says.
  const int64_t S = joined.streams > 0 ? joined.streams
                                       : (config.data.streams > 0 ? config.data.streams : config.diloco.learners);
  if (joined.stream_index < 0 || joined.stream_index >= S) {
    throw InputError("the syncer leased stream " + std::to_string(joined.stream_index) + " of S = " +
                     std::to_string(S) + " streams");
  }
  auto split = std::make_shared<TokenSplit>(split_shards(fs::path(config.data.dir), "train"));
  DataStream stream = config_stream(split, joined.stream_index, S, config, cursor);
  for (int64_t i = 0; *from_log && i < config.train.grad_accum; ++i) stream.skip();  // a step reads accum batches
  return stream;
}

OuterSyncConfig outer_sync_config(const Config& config, int id, const FragmentLayout& layout) {
  OuterSyncConfig c;
  c.learner_id = id;
  c.fragments = static_cast<int>(layout.fragments.size());
  for (const auto& f : layout.fragments) c.fragment_numel.push_back(f.numel);
  c.inner_steps = config.diloco.inner_steps;
  c.overlap = config.diloco.overlap;
  c.alpha = config.diloco.alpha;
  c.reanchor = config.diloco.stale_policy == StalePolicy::kReanchor;
  c.blocking = config.diloco.blocking;
  c.codec = wire::parse_codec(to_string(config.diloco.wire_up));
  c.error_feedback = config.diloco.error_feedback;
  c.error_feedback_decay = config.diloco.error_feedback_decay;
  c.topk_density = config.diloco.topk_density;
  return c;
}

std::unique_ptr<InnerJob> make_inner_job(const Config& config, int id, const fs::path& run_dir, GroupRanks* ranks,
                                         GPT model, const FragmentLayout& layout, torch::Device device,
                                         DataStream stream, EventLog& events) {
  if (!ranks) {
    auto job =
        std::make_unique<GptInnerJob>(model, layout, config.train, make_schedule(config), device, std::move(stream));
    job->trainer().set_skip(config.skippipe, skip_path_seed(config.run.seed, id));
    return job;
  }
  const ParallelConfig& parallel = config.parallel_for(id);
  auto group = ranks->join();
  auto engine = make_group_engine(config.model, config.run.seed + 1 + static_cast<uint64_t>(id),  // the ranks' Θ₀
                                  parallel, config.train, *group,
                                  run_dir / "offload" / ("learner_" + std::to_string(id) + "_rank_0"));
  events.emit("group_formed", {{"ranks", parallel.ranks()}, {"group", engine->describe()},
                               {"store", ranks->store()}, {"pids", ranks->pids()}});
  spdlog::info("[learner {}] a group of {} ranks: {}", id, static_cast<long long>(parallel.ranks()),
               engine->describe());
  return std::make_unique<GroupInnerJob>(model, layout, config.train, make_schedule(config), std::move(stream),
                                         std::move(engine), std::move(group), group_timeout_s(config, id));
}

int64_t restore_inner_state(InnerJob& job, const fs::path& run_dir, int id, int64_t global_step,
                            EventLog& events) {
  std::string why;
  const int64_t saved_at = job.restore_state(run_dir / "learners" / ("learner_" + std::to_string(id)), &why);
  if (saved_at >= 0) {
    events.emit("optimizer_restored", {{"saved_at_step", saved_at}, {"global_step", global_step}});
    return saved_at;
  }
  if (!why.empty()) {
    events.emit("optimizer_not_restored", {{"reason", why}});
    spdlog::info("[learner {}] its saved AdamW state is unusable ({}): starting with fresh moments", id, why);
  }
  return -1;
}

namespace {

// learners/learner_<id>/rewarm.json: the global step this learner's moments started fresh at (its re-warm's origin).
fs::path rewarm_file(const fs::path& run_dir, int id) {
  return run_dir / "learners" / ("learner_" + std::to_string(id)) / "rewarm.json";
}

// The recorded origin, or −1 when there is none or it is unreadable (then the moments are taken as warm).
int64_t read_rewarm_origin(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return -1;
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json_integer(parse_json(text.str(), file.string()).at("from_step"), file.string() + ": from_step");
  } catch (const std::exception&) {
    return -1;
  }
}

void rewarm_from(const Config& config, InnerJob& job, const fs::path& run_dir, int id, int64_t from,
                 int64_t own_steps, EventLog& events) {
  job.rewarm(from);
  fs::create_directories(rewarm_file(run_dir, id).parent_path());
  write_file_atomically(rewarm_file(run_dir, id), nlohmann::json{{"from_step", from}}.dump() + "\n");
  events.emit("lr_rewarmed", {{"from_step", from}, {"steps", config.train.warmup_steps}, {"own_steps", own_steps}});
}

}  // namespace

void restore_or_rewarm(const Config& config, InnerJob& job, const fs::path& run_dir, int id, int64_t global_step,
                       EventLog& events) {
  const int64_t warmup = config.train.warmup_steps;
  const int64_t saved_at =
      config.train.learner_state_interval > 0 ? restore_inner_state(job, run_dir, id, global_step, events) : -1;
  const int64_t origin = read_rewarm_origin(rewarm_file(run_dir, id));
  if (saved_at >= 0) {  // warm moments, unless they were saved amid their own re-warm
    if (warmup > 0 && origin > 0 && saved_at >= origin && saved_at < origin + warmup) {
      const int64_t own = saved_at - origin;  // the steps the moments have seen since they were fresh
      rewarm_from(config, job, run_dir, id, std::max<int64_t>(1, global_step - own), own, events);
    }
    return;
  }
  std::error_code ec;
  fs::remove(rewarm_file(run_dir, id), ec);  // fresh moments: an older incarnation's origin says nothing of them
  if (global_step > 0 && warmup > 0) rewarm_from(config, job, run_dir, id, global_step, 0, events);
}

std::unique_ptr<PeerServer> start_peer_server(const Config& config, const std::string& syncer,
                                              wire::Transport& transport, const wire::Handshake& handshake,
                                              FragmentBoard& board, LearnerLink& link, EventLog& events) {
  if (config.diloco.bootstrap != Bootstrap::kPeers) return nullptr;
  const std::string towards = local_address_towards(syncer);
  const std::string listen = config.run.peer_host.empty() ? (towards.empty() ? "127.0.0.1" : towards)
                                                          : config.run.peer_host;
  std::string advertise = config.run.peer_advertise;
  if (advertise.empty()) advertise = is_wildcard_host(listen) ? (towards.empty() ? "127.0.0.1" : towards) : listen;
  auto peer_server = std::make_unique<PeerServer>(transport, listen, handshake, board);
  const std::string& bound = peer_server->address();
  const std::string advertised = advertise + bound.substr(bound.rfind(':'));
  link.set_peer_address(advertised);
  events.emit("peer_server", {{"listening", peer_server->listen_address()}, {"advertised", advertised}});
  return peer_server;
}

void announce_bootstrapped(int id, const std::string& syncer, const Bootstrapped& boot, bool from_log,
                           const OuterSync& sync, InnerJob& job, const PeerServer* peer_server, EventLog& events) {
  const wire::JoinReply& joined = boot.joined;
  std::map<std::string, int> from_source;
  for (const auto& name : boot.fetched.source) ++from_source[name];
  events.emit("bootstrapped", {{"pid", ::getpid()}, {"global_step", joined.global_step}, {"versions", sync.versions()},
                               {"cursor", job.cursor().to_json()}, {"cursor_from_stream_log", from_log},
                               {"syncer_generation", joined.syncer_generation}, {"stream", joined.stream_index},
                               {"sources", from_source}, {"source_failures", boot.fetched.failures},
                               {"peer_address", peer_server ? peer_server->address() : ""}});
  spdlog::info("[learner {} step {}] joined {}: stream {}, {}/{} tokens done", id,
               static_cast<long long>(joined.global_step), syncer,
               static_cast<long long>(joined.stream_index), static_cast<long long>(job.cursor().tokens_served),
               static_cast<long long>(joined.tokens_budget));
}

std::unique_ptr<MonitorServer> start_learner_monitor(const Config& config, int id, LearnerGauges& gauges,
                                                     EventLog& events) {
  if (config.run.learner_monitor.empty()) return nullptr;
  auto monitor = std::make_unique<MonitorServer>(config.run.learner_monitor,
                                                 MonitorServer::Routes{[&gauges] { return gauges.text(); }, {}, ""},
                                                 transport_security(config));
  events.emit("monitor", {{"url", monitor->url()}, {"address", monitor->address()}});
  spdlog::info("[learner {}] metrics {}metrics", id, monitor->url());
  return monitor;
}

}  // namespace dloco
