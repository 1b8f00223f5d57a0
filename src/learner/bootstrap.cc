// The learner's bootstrap; see bootstrap.h.
#include "learner/bootstrap.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace dloco {

std::optional<Bootstrapped> bootstrap(LearnerLink& link, wire::Transport& transport, const wire::Handshake& handshake,
                                      const std::filesystem::path& run_dir, int P, double timeout_s,
                                      EventLog& events, const std::atomic<int>& signal) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  Bootstrapped out;
  int64_t locked_stream = -1;
  for (;;) {
    if (signal.load() != 0) return std::nullopt;
    try {
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      out.joined = link.join(std::max(1.0, std::min(5.0, left)));  // in slices: a SIGTERM is seen within seconds
      if (!out.stream_log || locked_stream != out.joined.stream_index) {
        out.stream_log.reset();
        try {
          out.stream_log = std::make_unique<StreamLog>(stream_log_path(run_dir, out.joined.stream_index));
          locked_stream = out.joined.stream_index;
        } catch (const StreamBusy&) {  // its previous holder still lives (e.g. a cut link outlived its lease)
          link.add_busy_stream(out.joined.stream_index);
          throw;
        }
      }
      std::vector<FragmentSource> sources;
      for (const auto& peer : out.joined.peers) {
        sources.push_back(peer_source(transport, "peer " + std::to_string(peer.learner) + " (" + peer.address + ")",
                                      peer.address, handshake, 15.0));
      }
      sources.push_back({"syncer", [&link](int p) { return link.fetch_fragment(p); }});
      const auto& at_join = out.joined.fragment_versions;
      out.fetched = fetch_fragments(sources, at_join.size() == static_cast<size_t>(P) ? at_join
                                                                                       : std::vector<int64_t>(P, 0));
      return out;
    } catch (const HandshakeRefused&) {
      throw;
    } catch (const InputError& e) {
      if (Clock::now() >= deadline) throw;
      events.emit("bootstrap_retry", {{"reason", e.what()}});
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }
}

}  // namespace dloco
