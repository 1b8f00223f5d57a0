// Small helpers of the protocol types; see protocol.h and transport.h.
#include "transport/protocol.h"

#include <nlohmann/json.hpp>

#include "transport/transport.h"

namespace dloco::wire {

namespace {
constexpr int64_t kOverhead = 64;  // ids, counters and framing of one message, roughly
}  // namespace

bool constant_time_equal(std::string_view got, std::string_view want) {
  // Time depends on want's length only: every byte of want is compared with some byte of got.
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    const unsigned char g = got.empty() ? 0 : static_cast<unsigned char>(got[i % got.size()]);
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(want[i]));
  }
  return diff == 0;
}

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

namespace {

// Names the [train] / [diloco] / [data] fields whose values differ (at most 6), with both values. `got` comes from the
// other process (already authenticated by the secret): its size is bounded and a text that does not parse is refused
// as such.
std::string training_mismatch(const std::string& got, const std::string& want) {
  if (got.empty()) return "no [train]/[diloco] settings in the handshake (a peer of an older protocol)";
  if (got.size() > 65536) return "[train]/[diloco] settings in the handshake larger than 64 KiB";
  const nlohmann::json theirs = nlohmann::json::parse(got, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json ours = nlohmann::json::parse(want, nullptr, false);
  if (!theirs.is_object() || !ours.is_object()) return "unreadable [train]/[diloco] settings in the handshake";
  std::string out;
  int differ = 0;
  for (const auto& [section, fields] : ours.items()) {
    for (const auto& [key, value] : fields.items()) {
      const nlohmann::json* other = nullptr;
      if (theirs.contains(section) && theirs[section].is_object() && theirs[section].contains(key)) {
        other = &theirs[section][key];
      }
      if (other && *other == value) continue;
      if (++differ > 6) continue;
      std::string mine = other ? other->dump() : "missing";
      if (mine.size() > 64) mine = mine.substr(0, 64) + "…";
      out += std::string(out.empty() ? "" : ", ") + section + "." + key + " = " + mine + " (expected " +
             value.dump() + ")";
    }
  }
  if (differ == 0) return "[train]/[diloco] settings differ in fields this process does not know";
  if (differ > 6) out += " and " + std::to_string(differ - 6) + " more";
  return "settings differ: " + out + " (every process of a run must share [train], [diloco] and data.streams)";
}

}  // namespace

std::string check_handshake(const Handshake& got, const Handshake& want) {
  // The secret first, answered like the transport's own token check: nothing else is told to a caller without it.
  if (!constant_time_equal(got.secret, want.secret)) return kNotAuthenticated;
  if (got.protocol_version != want.protocol_version) {
    return "protocol version " + std::to_string(got.protocol_version) + " does not match the syncer's " +
           std::to_string(want.protocol_version);
  }
  if (got.run_id != want.run_id) {  // the other run's name is not told, even to a caller with the secret
    return "run id (run.name) '" + got.run_id.substr(0, 64) + "' is not this run's";
  }
  if (got.layout_hash != want.layout_hash) {
    return "fragment layout hash differs (different model shape, diloco.fragments or split_large_tensors)";
  }
  if (got.model_hash != want.model_hash) return "model config hash differs (a [model] field differs)";
  if (got.tokenizer_hash != want.tokenizer_hash) return "tokenizer hash differs (another tokenizer.model)";
  if (got.training != want.training) return training_mismatch(got.training, want.training);
  return "";
}

}  // namespace dloco::wire
