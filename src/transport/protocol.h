// The learner ↔ syncer protocol as plain C++ types (docs/protocol.md): what the roles send and receive,
// independent of how it travels. transport/grpc maps these one to one onto proto/dloco.proto (kProtocolVersion);
// transport/inproc passes them between threads of one process. Tensor payloads stay encoded (a codec name and
// its bytes, transport/codec.h) so every transport refuses the same malformed payloads.
// Deliberately not here: gRPC, protobuf, sockets, threads, LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace dloco::wire {

/// The wire protocol's version; a peer with another one is refused with both versions named.
inline constexpr uint32_t kProtocolVersion = 5;  // 2: merged fragments may be updates (base_version, base_hash);
                                                 // 3: the secret is a bearer token on every call, [train]/[diloco]
                                                 // in the handshake (docs/protocol.md §7, §12);
                                                 // 4: [model]/[train]/[diloco] as typed settings compared as values
                                                 // (no model hash, no JSON text: docs/protocol.md §7), no
                                                 // GlobalStep message (it was never sent);
                                                 // 5: a batch is B rows of T + 1 tokens, and data.order
                                                 // "shuffled" draws each row from its own slot (data/stream.h)

/// An encoded tensor payload: `codec` names the encoding ("fp32" | "bf16" | "q8/<B>" | "q4/<B>",
/// transport/codec.h), `bytes` the encoded values.
struct Payload {
  std::string codec;
  std::string bytes;
};

/// One setting every process of a run must share (docs/protocol.md §7 "Handshake"): its dotted name
/// ("model.d_model", "train.lr", "diloco.outer_lr", "data.streams") and its value, typed as the config field is
/// (core/config.h): int64 for an integer field, double for a floating-point one even when whole (1.0), bool, or
/// string (names and choices: "tiny", "rda"). std::monostate only for a peer's setting that came with no value:
/// check_handshake refuses it.
struct Setting {
  using Value = std::variant<std::monostate, int64_t, double, bool, std::string>;
  std::string name;
  Value value;
  bool operator==(const Setting&) const = default;
};

/// Bounds of a peer's settings (check_handshake refuses more): the run's own are about 50 names under 40 bytes.
inline constexpr size_t kMaxSettings = 512;
inline constexpr size_t kMaxSettingName = 128;          // bytes
inline constexpr size_t kMaxSettingString = 4096;       // bytes of a string value
/// Two doubles agree when equal or within this relative difference, |a − b| ≤ 1e-12 · max(|a|, |b|): the same
/// decimal read by two languages' parsers, not two different settings. NaN agrees with nothing.
inline constexpr double kSettingRelativeTolerance = 1e-12;

/// What every peer must agree on before it may take part (docs/protocol.md "Handshake").
struct Handshake {
  std::string run_id;
  uint32_t protocol_version = kProtocolVersion;
  std::string secret;
  uint64_t layout_hash = 0;
  uint64_t tokenizer_hash = 0;
  std::vector<Setting> settings;  // every [model] field, [train] but the role-local ones, [diloco], data.streams
};

struct JoinRequest {
  Handshake handshake;
  int learner_id = 0;                 // [0, 65536) for a learner; -1 for the evaluator (no session, no stream)
  std::string host;                   // for logs
  std::optional<int64_t> held_stream; // a running learner re-attaching keeps the stream whose log it holds
  std::vector<int64_t> busy_streams;  // streams it found locked by another live process: lease another
  std::string peer_address;           // where it serves its fragments to joiners ("" = it does not)
  std::string certificate;            // not sent: set by the syncer's transport under mutual TLS to the name in the
                                      // caller's verified certificate, for logs ("" otherwise)
};

struct PeerInfo {
  int learner = 0;
  std::string address;
};

struct JoinReply {
  uint64_t session_id = 0;
  uint64_t syncer_generation = 0;      // changes when the syncer restarts
  int64_t global_step = 0;
  std::vector<int64_t> fragment_versions;
  int64_t stream_index = -1;           // data stream leased to this learner
  std::string stream_cursor_json;      // its persisted cursor ("" = start of the stream)
  int64_t tokens_budget = 0;           // this stream's share of the token budget (the whole one if shared)
  std::vector<PeerInfo> peers;         // live learners serving their fragments, most recently heard from first
  int64_t streams = 0;                 // S: the syncer's count of data streams
};

/// Θ_p at a version (bootstrap, snapshots, peer transfers). Always fp32 on the wire today.
struct Fragment {
  int fragment = 0;
  int64_t version = 0;
  Payload payload;
};

struct Snapshot {
  int64_t global_step = 0;
  std::vector<Fragment> fragments;
  int64_t tokens_merged = 0;
};

/// A learner's metadata after each step (docs/protocol.md "Learner loop", step 4).
struct Metadata {
  int64_t step = 0;                  // t_m
  std::vector<int64_t> steps;        // steps[m][p] since p was last applied, P entries
  std::vector<int64_t> tokens;       // tokens[m][p]
  double step_time_s = 0;            // EMA of its step time
  int64_t tokens_trained = 0;        // tokens its stream has served
  std::string cursor_json;           // its data stream cursor (persisted by the syncer)
  double tokens_per_s = 0;
  double loss = 0;                   // EMA of its training loss
  bool finished = false;             // spent its token budget
  std::optional<int64_t> stream;     // the data stream it trains; unset before it has one
  bool leaving = false;              // leaves gracefully after this message: release its lease now
  std::vector<int64_t> versions;     // the newest version of each fragment it holds (P entries; empty = unknown):
                                     // a new session's first merge of p is an update when it holds the latest
  bool takes_over = false;           // fixed shares: its share is spent and it can train a stream whose holder left
  std::optional<int64_t> declined_stream;  // an offered stream it could not take (its log is locked elsewhere)
};

/// The answer to PullRequest(p, u): Δ = Θ_p^base − θ_{m,p}, or raw θ_{m,p} in fp32 when base_version = −1
/// (re-anchoring: the syncer no longer holds the learner's base).
struct PullAnswer {
  int fragment = 0;
  int64_t round_step = 0;     // u of the request it answers
  int64_t captured_step = 0;  // t_m at the capture
  int64_t base_version = 0;
  int64_t steps = 0;          // steps[m][p] at the capture
  int64_t tokens = 0;         // tokens[m][p] at the capture
  Payload delta;
};

using LearnerMessage = std::variant<Metadata, PullAnswer>;

struct PullRequest {
  int fragment = 0;
  int64_t round_step = 0;     // u; −1 for the final flush
  int64_t oldest_anchor = 0;  // oldest version of Θ_p the syncer can rebuild a delta against
  int64_t version = -1;       // the syncer's version of Θ_p now (−1 unknown): a learner holding a higher one (the
                              // syncer came back with an older history) re-anchors
};

/// A merge's result. `base_version` −1: `fragment.payload` is Θ_p itself (fp32). ≥ 0 (diloco.wire_down, issue 14
/// part 3): the payload is the outer update U encoded, and Θ_p = apply_update(Θ_p at base_version, U)
/// (transport/codec.h), bit for bit what the syncer holds; a session's first merge of each fragment is always whole.
/// round_step −2: a whole copy sent to a session opened after the run finished (no round produced it).
struct MergedFragment {
  Fragment fragment;
  int64_t round_step = 0;         // u of the round that produced it
  std::vector<int> participants;  // learners whose answers were merged
  int64_t base_version = -1;
  uint64_t base_hash = 0;         // with base_version ≥ 0: FNV-1a 64 of Θ_p at base_version (core/hash.h), so an
                                  // update is applied only to the very copy it was built against
  bool refetch = false;           // Θ_p whole, sent because this learner's answers were refused
                                  // diloco.refetch_after times in a row: it replaces the learner's copy and its
                                  // parameters of p even at the version it holds (docs/protocol.md §10)
};

struct Stop {};         // the run is over: stop after this step
struct BudgetSpent {};  // the learners' tokens reached the shared budget: stop training, answer the final flush
/// Take-over under fixed shares (docs/protocol.md §7): train `stream`, whose holder left, until it has served
/// `tokens_budget` tokens. Sent only to a learner whose metadata says takes_over.
struct StreamOffer {
  int64_t stream = 0;
  std::string cursor_json;    // the syncer's persisted cursor ("" = the start; the stream's log wins when newer)
  int64_t tokens_budget = 0;  // the stream's share, tokens
};

using SyncerMessage = std::variant<PullRequest, MergedFragment, Stop, BudgetSpent, StreamOffer>;

struct LearnerStatus {
  int id = 0;
  bool live = false;
  int64_t step = 0;
  int64_t tokens_trained = 0;
  double tokens_per_s = 0;
  double loss = 0;
  int64_t bytes_sent = 0;      // learner → syncer
  int64_t bytes_received = 0;  // syncer → learner
};

struct StatusReply {
  int64_t global_step = 0;
  int64_t merges = 0;
  int64_t last_quorum = 0;
  std::vector<LearnerStatus> learners;
  double last_val_loss = 0;
  int64_t last_eval_step = -1;
  int64_t tokens_trained = 0;
  int64_t tokens_budget = 0;
  bool finished = false;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t answers_dropped = 0;
  int64_t answers_refused = 0;
  std::map<std::string, int64_t> answers_refused_by_kind;  // docs/protocol.md §10
  int64_t reports_refused = 0;
  int64_t answers_clipped = 0;
  int64_t merges_dropped = 0;
};

struct EvalReport {
  uint64_t session_id = 0;
  int64_t global_step = 0;
  double val_loss = 0;
  std::vector<int64_t> fragment_versions;
  double seconds = 0;
};

/// Approximate encoded size in bytes (payloads plus a fixed overhead), for the byte accounting of transports
/// that do not serialise (in-process); gRPC counts its real message sizes.
int64_t approximate_bytes(const LearnerMessage& message);
int64_t approximate_bytes(const SyncerMessage& message);

}  // namespace dloco::wire

namespace dloco::wire {

/// Checks a peer's handshake against this process's own; returns "" when they match, else a message naming the
/// first mismatch. The secret is compared first (constant time) and a wrong one gets kNotAuthenticated
/// (transport/transport.h) whatever else differs; then protocol version (an older peer is told to upgrade), run id
/// (the caller's named, never this process's), layout and tokenizer hashes, and the settings: compared by name as
/// values (int64, bool and string exactly, doubles within kSettingRelativeTolerance), a missing, extra, duplicate,
/// valueless or differently typed setting is a mismatch; up to 6 are named with both values. A peer's settings over
/// kMaxSettings, kMaxSettingName or kMaxSettingString are refused as such.
std::string check_handshake(const Handshake& got, const Handshake& want);

/// got == want in time that depends on want's length only (secrets, bearer tokens).
bool constant_time_equal(std::string_view got, std::string_view want);

}  // namespace dloco::wire
