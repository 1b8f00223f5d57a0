// Small helpers of the protocol types; see protocol.h and transport.h.
#include "transport/protocol.h"

#include "transport/transport.h"

namespace dloco::wire {

namespace {
constexpr int64_t kOverhead = 64;  // ids, counters and framing of one message, roughly
}  // namespace

const char* to_string(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kUnavailable: return "unavailable";
    case Code::kDeadline: return "deadline";
    case Code::kRefused: return "refused";
    case Code::kUnauthenticated: return "unauthenticated";
    case Code::kInvalid: return "invalid";
    case Code::kExhausted: return "exhausted";
    case Code::kAborted: return "aborted";
  }
  return "?";
}

int64_t approximate_bytes(const LearnerMessage& message) {
  if (const auto* a = std::get_if<PullAnswer>(&message)) return kOverhead + static_cast<int64_t>(a->delta.bytes.size());
  const auto& m = std::get<Metadata>(message);
  return kOverhead + static_cast<int64_t>(16 * m.steps.size() + 8 * m.versions.size() + m.cursor_json.size());
}

int64_t approximate_bytes(const SyncerMessage& message) {
  if (const auto* m = std::get_if<MergedFragment>(&message)) {
    return kOverhead + static_cast<int64_t>(m->fragment.payload.bytes.size() + 4 * m->participants.size());
  }
  return kOverhead;
}

}  // namespace dloco::wire

namespace dloco::wire {

std::string check_handshake(const Handshake& got, const Handshake& want) {
  if (got.protocol_version != want.protocol_version) {
    return "protocol version " + std::to_string(got.protocol_version) + " does not match the syncer's " +
           std::to_string(want.protocol_version);
  }
  if (got.secret != want.secret) return "wrong shared secret (set run.secret or DLOCO_SECRET to the syncer's)";
  if (got.run_id != want.run_id) {
    return "run id '" + got.run_id.substr(0, 256) + "' does not match the syncer's run '" + want.run_id + "'";
  }
  if (got.layout_hash != want.layout_hash) {
    return "fragment layout hash differs (different model shape, diloco.fragments or split_large_tensors)";
  }
  if (got.model_hash != want.model_hash) return "model config hash differs (a [model] field differs)";
  if (got.tokenizer_hash != want.tokenizer_hash) return "tokenizer hash differs (another tokenizer.model)";
  return "";
}

}  // namespace dloco::wire
