// Fuzz target: protobuf messages into the syncer's handlers (syncer/syncer_service.h), the way the gRPC server
// passes them (transport/grpc/proto_convert.h), on a fresh SyncerService with its merger running, per input.
// Input: records [kind: 1 byte][length: 2 bytes LE][a serialized proto message: length bytes]:
//   kind % 8 = 0  Join(JoinRequest) as sent
//              1  Join(JoinRequest) with the run's handshake put in (so the fuzzer gets past it; its learner id,
//                 streams and peer address are the fuzzer's); the session it gets becomes "the current one"
//              2  one LearnerMessage of a session (session_id 0 = the current one); consecutive records of kind 2
//                 are one session, read in order until the session ends
//              3  GetFragment(FragmentRequest)      4  GetSnapshot(SnapshotRequest)
//              5  Status, the dashboard's JSON and the metrics text
//              6  ReportEval(EvalReport)            7  let the merger tick once (5 ms; at most 4 per input)
// The first byte picks the run's wire codecs, merge rule and grace window. Checked beyond "no crash, no UB, no leak":
// whatever was sent, Θ as the syncer hands it out afterwards is finite and of the layout's size (docs/protocol.md §10).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "core/check.h"
#include "core/fragments.h"
#include "fuzz/fuzz_support.h"
#include "fuzz/fuzz_syncer.h"
#include "process/events.h"
#include "syncer/syncer_service.h"
#include "transport/codec.h"
#include "transport/grpc/proto_convert.h"

using namespace dloco;
namespace fs = std::filesystem;

namespace {

// The syncer's end of one session: hands out the fuzzer's messages in order, then ends; what the syncer writes is
// dropped.
class ScriptedPeer final : public wire::SessionPeer {
 public:
  explicit ScriptedPeer(uint64_t session) : session_(session) {}
  void add(v1::LearnerMessage m) { script_.push_back(std::move(m)); }
  bool read(wire::LearnerMessage* message) override {
    while (!script_.empty()) {
      v1::LearnerMessage in = std::move(script_.front());
      script_.pop_front();
      if (in.session_id() != session_) return false;  // as the gRPC server: another session's message ends this one
      if (grpc_transport::from_proto(in, message)) return true;
    }
    return false;
  }
  bool write(const wire::SyncerMessage&) override { return true; }

 private:
  uint64_t session_;
  std::deque<v1::LearnerMessage> script_;
};

struct Run {
  Config config;
  FragmentLayout layout;
  wire::Handshake handshake;
  fs::path dir;
};

Run make_run(uint8_t knobs) {
  Run r;
  r.dir = fuzz::scratch_dir() / "syncer_rpc";
  fs::remove_all(r.dir);
  fs::create_directories(r.dir / "events");
  Config& c = r.config = fuzz::syncer_config();
  c.diloco.anchor_versions = 1;
  c.diloco.grace_window = (knobs & 1) != 0;
  c.diloco.wire_down = (knobs & 2) ? WireDtype::kQ4 : WireDtype::kFp32;
  c.diloco.wire_up = (knobs & 4) ? WireDtype::kQ8 : WireDtype::kFp32;
  c.diloco.error_feedback = (knobs & 8) != 0;
  c.diloco.merge = (knobs & 16) ? MergeRule::kMean : MergeRule::kRda;
  r.layout = fuzz::syncer_layout();
  r.handshake = fuzz::syncer_handshake(r.layout);
  return r;
}

template <class M>
bool parse(M& message, std::string_view bytes) {
  return message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 64 * 1024) return 0;
  Run run = make_run(data[0]);
  std::vector<std::vector<float>> theta;
  for (const auto& f : run.layout.fragments) theta.emplace_back(static_cast<size_t>(f.numel), 0.5f);
  auto state = std::make_unique<SyncerState>(run.config, run.layout, std::move(theta), [](const std::string&) { return false; });
  EventLog events(run.dir / "events" / "syncer.jsonl", Role::kSyncer, 0);
  SyncerService service(run.config, std::move(state), run.handshake, run.dir, &events,
                        [&](const std::vector<SafetensorsEntry>&, const nlohmann::json&, int64_t) { return run.dir / "ckpt"; });
  service.start();

  uint64_t current = 0;
  int ticks = 0;
  std::string_view in = fuzz::as_text(data + 1, size - 1);
  std::deque<v1::LearnerMessage> pending;
  auto run_session = [&] {
    if (pending.empty()) return;
    const uint64_t id = pending.front().session_id();
    ScriptedPeer peer(id);
    for (auto& m : pending) peer.add(std::move(m));
    pending.clear();
    service.session(id, peer);
  };
  while (in.size() >= 3) {
    const uint8_t kind = static_cast<uint8_t>(in[0]) % 8;
    const size_t len = std::min<size_t>(in.size() - 3, static_cast<uint8_t>(in[1]) | (static_cast<uint8_t>(in[2]) << 8));
    const std::string_view body = in.substr(3, len);
    in.remove_prefix(3 + len);
    if (kind != 2) run_session();
    switch (kind) {
      case 0:
      case 1: {
        v1::JoinRequest req;
        if (!parse(req, body)) break;
        wire::JoinRequest request = grpc_transport::from_proto(req);
        if (kind == 1) request.handshake = run.handshake;
        const auto reply = service.join(request);
        if (kind == 1 && reply.ok()) current = reply.value.session_id;
        break;
      }
      case 2: {
        v1::LearnerMessage m;
        if (!parse(m, body)) break;
        if (m.session_id() == 0) m.set_session_id(current);
        pending.push_back(std::move(m));
        break;
      }
      case 3: {
        v1::FragmentRequest req;
        if (!parse(req, body)) break;
        const auto r = service.fragment(req.session_id() == 0 ? current : req.session_id(), req.fragment());
        if (r.ok()) {
          v1::Fragment out;
          grpc_transport::to_proto(r.value, &out);
        }
        break;
      }
      case 4: {
        v1::SnapshotRequest req;
        if (!parse(req, body)) break;
        (void)service.snapshot(req.session_id() == 0 ? current : req.session_id());
        break;
      }
      case 5: {
        v1::StatusReply out;
        grpc_transport::to_proto(service.status(), &out);
        (void)service.monitor_status().dump();
        (void)service.metrics_text();
        break;
      }
      case 6: {
        v1::EvalReport req;
        if (!parse(req, body)) break;
        wire::EvalReport report = grpc_transport::from_proto(req);
        if (report.session_id == 0) report.session_id = current;
        (void)service.report_eval(report);
        break;
      }
      case 7:
        if (ticks++ < 4) std::this_thread::sleep_for(std::chrono::milliseconds(6));
        break;
    }
  }
  run_session();

  // Whatever was sent: Θ as handed out is finite, of the layout's size, at versions ≥ 0.
  wire::JoinRequest evaluator;
  evaluator.handshake = run.handshake;
  evaluator.learner_id = -1;
  const auto joined = service.join(evaluator);
  fuzz::require(joined.ok(), "the evaluator's join was refused");
  const auto snap = service.snapshot(joined.value.session_id);
  fuzz::require(snap.ok(), "the snapshot was refused");
  fuzz::require(snap.value.fragments.size() == run.layout.fragments.size(), "a snapshot of another fragment count");
  for (size_t p = 0; p < snap.value.fragments.size(); ++p) {
    const std::vector<float> values = wire::fragment_values(snap.value.fragments[p]);
    fuzz::require(static_cast<int64_t>(values.size()) == run.layout.fragments[p].numel, "a fragment of another size");
    for (float v : values) fuzz::require(std::isfinite(v), "the syncer hands out a non-finite Θ");
    fuzz::require(snap.value.fragments[p].version >= 0, "a negative version");
  }
  service.stop();
  return 0;
}
