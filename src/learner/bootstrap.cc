// The learner's bootstrap; see bootstrap.h. Unreachable syncers and peers are recoverable faults (statuses,
// retried until the deadline); only a refused handshake and the deadline itself end the learner (InputError).
#include "learner/bootstrap.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/backoff.h"

namespace dloco {

std::optional<Bootstrapped> bootstrap(LearnerLink& link, wire::Transport& transport, const wire::Handshake& handshake,
                                      const std::filesystem::path& run_dir, int P, double timeout_s,
                                      EventLog& events, const std::atomic<int>& signal, const std::string& who) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  const auto deadline = started + std::chrono::duration<double>(timeout_s);
  auto said = started - std::chrono::hours(1);
  // The syncer did not answer: said at once, then every 10 s, so a learner started before (or without) its syncer
  // is never silent.
  auto say_unreachable = [&](const std::string& why) {
    if (Clock::now() - said < std::chrono::seconds(10)) return;
    const bool first = said < started;
    said = Clock::now();
    const double waited = std::chrono::duration<double>(said - started).count();
    const double left = std::chrono::duration<double>(deadline - said).count();
    const std::string what = first ? "no answer from the syncer at"
                                   : "still no syncer after " + std::to_string(static_cast<int>(waited)) + " s at";
    spdlog::info("{} {} {} ({}); retrying for {:.0f} s more", who, what, link.address(),
                 why, left);
  };
  Bootstrapped out;
  int64_t locked_stream = -1;
  std::string last_error = "no attempt";
  Backoff backoff(link.backoff_config());  // jittered and seeded per learner: restarted learners do not retry in step
  auto retry = [&](const std::string& why) {
    last_error = why;
    events.emit("bootstrap_retry", {{"reason", why}});
    std::this_thread::sleep_for(backoff.next_delay());
  };
  while (signal.load() == 0) {
    if (Clock::now() >= deadline) {
      throw InputError("cannot bootstrap from the syncer within " + std::to_string(timeout_s) + " s (last error: " +
                       last_error + ")");
    }
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    // In slices (a SIGTERM is seen within seconds); the first one short, so a missing syncer is said at once.
    auto joined = link.try_join(std::max(1.0, std::min(said < started ? 1.0 : 5.0, left)));
    if (!joined.ok()) {
      if (!joined.status.retryable()) throw HandshakeRefused(joined.status.message);
      last_error = joined.status.message;
      say_unreachable(last_error);
      continue;
    }
    out.joined = std::move(joined.value);
    if (!out.stream_log || locked_stream != out.joined.stream_index) {
      out.stream_log.reset();
      try {
        out.stream_log = std::make_unique<StreamLog>(stream_log_path(run_dir, out.joined.stream_index));
        locked_stream = out.joined.stream_index;
      } catch (const StreamBusy& e) {  // its previous holder still lives (e.g. a cut link outlived its lease)
        link.add_busy_stream(out.joined.stream_index);
        retry(e.what());
        continue;
      }
    }
    // Each fragment from a live peer holding at least the syncer's version at this join, else the syncer.
    std::vector<FragmentSource> sources;
    for (const auto& peer : out.joined.peers) {
      sources.push_back(peer_source(transport, "peer " + std::to_string(peer.learner) + " (" + peer.address + ")",
                                    peer.address, handshake, 15.0));
    }
    sources.push_back({"syncer", [&link](int p) { return link.fetch_fragment(p); }});
    const auto& at_join = out.joined.fragment_versions;
    auto fetched = fetch_fragments(sources, at_join.size() == static_cast<size_t>(P) ? at_join
                                                                                     : std::vector<int64_t>(P, 0));
    if (!fetched.ok()) {  // the syncer died halfway (chaos plans kill it): join again
      retry(fetched.status.message);
      continue;
    }
    out.fetched = std::move(fetched.value);
    return out;
  }
  return std::nullopt;
}

}  // namespace dloco
