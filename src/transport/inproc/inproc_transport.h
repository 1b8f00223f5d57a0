// The in-process transport: a syncer, learners and peers as threads of one process (protocol tests with no
// sockets and no wall-clock races). One InprocNetwork holds the servers by address; each participant gets its
// own endpoint (a wire::Transport named after it), and the network's fault hooks act on one endpoint's link:
//   cut(name)          every call fails with kUnavailable and its open sessions break (a reset, not silence);
//   delay(name, d)     each message and call on the link waits d more, each way (on the link's own threads);
//   drop_answers(name, n)  the next n pull answers it sends vanish (the learner believes they were sent);
//   drop_merges(name, n)   the next n merged fragments sent to it vanish (it stays connected and live);
//   tamper_answers(name, edits)  the payloads of the next pull answers it sends pass through the edits in order:
//                          the first edit sees each answer until it returns true (it applied), then the next one
//                          (a hostile or broken learner: the syncer must refuse what does not decode).
// Messages are passed as the plain types, payloads encoded as on the wire (transport/codec.h).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace dloco::inproc {

class InprocNetwork {
 public:
  InprocNetwork();
  ~InprocNetwork();
  InprocNetwork(const InprocNetwork&) = delete;
  InprocNetwork& operator=(const InprocNetwork&) = delete;

  /// The transport of participant `name` ("learner 2", "syncer", ...); lives as long as the network.
  wire::Transport& endpoint(const std::string& name);

  /// Fault hooks on `name`'s link (see the header comment). Take effect at once, from any thread.
  void cut(const std::string& name, bool cut = true);
  void delay(const std::string& name, std::chrono::milliseconds delay);
  void drop_answers(const std::string& name, int count);
  void drop_merges(const std::string& name, int count);
  void tamper_answers(const std::string& name, std::vector<std::function<bool(wire::Payload&)>> edits);
  /// Pull answers `name` sent, and merged fragments sent to it, that were dropped so far.
  int dropped_answers(const std::string& name) const;
  int dropped_merges(const std::string& name) const;

  struct State;  // shared with the endpoints, servers and sessions

 private:
  std::shared_ptr<State> state_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<wire::Transport>> endpoints_;
};

}  // namespace dloco::inproc
