// Small helpers of the protocol types; see protocol.h and transport.h.
#include "transport/protocol.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <system_error>

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

constexpr int kNamedMismatches = 6;  // a refusal names this many differing settings, then counts the rest
constexpr size_t kShownBytes = 64;   // of a peer's string or name in a message

// A peer's bytes fit for a log line: at most kShownBytes, non-printable ASCII as '?'.
std::string shown(std::string_view text) {
  std::string out(text.substr(0, kShownBytes));
  for (char& ch : out) {
    if (static_cast<unsigned char>(ch) < ' ' || ch == 127) ch = '?';
  }
  if (text.size() > kShownBytes) out += "…";
  return out;
}

// The shortest text that reads back to the same double, with ".0" when it looks like an integer (10.0, not 10).
std::string double_text(double x) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  std::string out(buf, ec == std::errc() ? end : buf);
  if (out.find_first_of(".eEni") == std::string::npos) out += ".0";
  return out;
}

const char* type_name(const Setting::Value& v) {
  switch (v.index()) {
    case 0: return "no value";
    case 1: return "an integer";
    case 2: return "a double";
    case 3: return "a bool";
    default: return "a string";
  }
}

std::string value_text(const Setting::Value& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return double_text(*d);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v)) return "\"" + shown(*s) + "\"";
  return "(no value)";
}

bool doubles_agree(double got, double want) {
  if (got == want) return true;  // ±inf equal to itself; NaN never equal (configs are finite: NaN is a mismatch)
  if (!std::isfinite(got) || !std::isfinite(want)) return false;
  return std::fabs(got - want) <= kSettingRelativeTolerance * std::max(std::fabs(got), std::fabs(want));
}

// "" when the peer's value agrees with ours, else how it differs ("= 0.3 (expected 0.002)").
std::string value_mismatch(const Setting::Value& got, const Setting::Value& want) {
  if (std::holds_alternative<std::monostate>(got)) return " has no value (expected " + value_text(want) + ")";
  if (got.index() != want.index()) {
    return " = " + value_text(got) + " (" + type_name(got) + "; expected " + type_name(want) + ", " +
           value_text(want) + ")";
  }
  const auto* d = std::get_if<double>(&got);
  const bool agree = d ? doubles_agree(*d, std::get<double>(want)) : got == want;
  return agree ? "" : " = " + value_text(got) + " (expected " + value_text(want) + ")";
}

// The bounds of a peer's settings (they come from another process, already authenticated by the secret).
std::string settings_too_large(const std::vector<Setting>& got) {
  if (got.size() > kMaxSettings) {
    return "the handshake carries more than " + std::to_string(kMaxSettings) + " settings";
  }
  for (const Setting& s : got) {
    if (s.name.size() > kMaxSettingName) {
      return "a setting name in the handshake is " + std::to_string(s.name.size()) + " bytes, more than " +
             std::to_string(kMaxSettingName) + " ('" + shown(s.name) + "')";
    }
    const auto* text = std::get_if<std::string>(&s.value);
    if (text && text->size() > kMaxSettingString) {
      return "setting " + shown(s.name) + " in the handshake is a string of " + std::to_string(text->size()) +
             " bytes, more than " + std::to_string(kMaxSettingString);
    }
  }
  return "";
}

// Names the settings that differ (at most kNamedMismatches), with both values: ours in their order (missing or
// different), then the peer's names this process does not have (extra) or sent twice.
std::string settings_mismatch(const std::vector<Setting>& got, const std::vector<Setting>& want) {
  if (const std::string large = settings_too_large(got); !large.empty()) return large;
  if (got.empty() && !want.empty()) return "no [model]/[train]/[diloco] settings in the handshake";
  std::map<std::string_view, const Setting*> theirs;
  std::vector<std::string> differ;
  for (const Setting& s : got) {
    if (!theirs.emplace(s.name, &s).second) differ.push_back(shown(s.name) + " sent twice");
  }
  std::map<std::string_view, const Setting*> ours;
  for (const Setting& s : want) {
    ours.emplace(s.name, &s);
    const auto it = theirs.find(s.name);
    if (it == theirs.end()) {
      differ.push_back(s.name + " missing (expected " + value_text(s.value) + ")");
    } else if (std::string why = value_mismatch(it->second->value, s.value); !why.empty()) {
      differ.push_back(s.name + why);
    }
  }
  for (const Setting& s : got) {
    if (!ours.count(s.name)) {
      differ.push_back(shown(s.name) + " = " + value_text(s.value) + " (extra: not a setting of this process)");
    }
  }
  if (differ.empty()) return "";
  std::string out;
  for (size_t i = 0; i < differ.size() && i < kNamedMismatches; ++i) out += (i ? ", " : "") + differ[i];
  if (differ.size() > kNamedMismatches) out += " and " + std::to_string(differ.size() - kNamedMismatches) + " more";
  return "settings differ: " + out +
         " (every process of a run must share [model], [train], [diloco], data.streams and data.order)";
}

}  // namespace

std::string check_handshake(const Handshake& got, const Handshake& want) {
  // The secret first, answered like the transport's own token check: nothing else is told to a caller without it.
  if (!constant_time_equal(got.secret, want.secret)) return kNotAuthenticated;
  if (got.protocol_version < want.protocol_version) {
    return "protocol version " + std::to_string(got.protocol_version) + " is older than this process's " +
           std::to_string(want.protocol_version) + " (a learner of an older dloco; since version 5 a batch is B "
           "rows of T + 1 tokens, since 4 the [model], [train] and [diloco] settings travel as typed values: upgrade "
           "it)";
  }
  if (got.protocol_version > want.protocol_version) {
    return "protocol version " + std::to_string(got.protocol_version) + " is newer than this process's " +
           std::to_string(want.protocol_version) + " (a learner of a newer dloco: upgrade the syncer and the other "
           "learners)";
  }
  if (got.run_id != want.run_id) {  // the other run's name is not told, even to a caller with the secret
    return "run id (run.name) '" + shown(got.run_id) + "' is not this run's";
  }
  if (got.layout_hash != want.layout_hash) {
    return "fragment layout hash differs (different model shape, diloco.fragments or split_large_tensors)";
  }
  if (got.tokenizer_hash != want.tokenizer_hash) return "tokenizer hash differs (another tokenizer.model)";
  return settings_mismatch(got.settings, want.settings);
}

}  // namespace dloco::wire
