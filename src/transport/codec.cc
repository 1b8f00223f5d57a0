// The payload codec; see codec.h.
#include "transport/codec.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/bf16.h"
#include "core/check.h"

namespace dloco::wire {

namespace {

constexpr int64_t kMaxBlock = 1 << 16;  // a receiver refuses larger blocks (a hostile "q8/huge" is not a codec)
constexpr size_t kHeader = sizeof(uint64_t);

int q_max(Codec codec) { return codec == Codec::kQ8 ? 127 : 7; }

// "q8/256" -> (kQ8, 256); false when the name is not an integer codec with a block in [1, kMaxBlock].
bool parse_wire_integer(const std::string& name, Codec* codec, int64_t* block) {
  if (name.size() < 4 || name[0] != 'q' || (name[1] != '8' && name[1] != '4') || name[2] != '/') return false;
  int64_t b = 0;
  for (size_t i = 3; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || b > kMaxBlock) return false;
    b = b * 10 + (name[i] - '0');
  }
  if (b < 1 || b > kMaxBlock) return false;
  *codec = name[1] == '8' ? Codec::kQ8 : Codec::kQ4;
  *block = b;
  return true;
}

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }
int64_t value_bytes(Codec codec, int64_t n) { return codec == Codec::kQ8 ? n : (n + 1) / 2; }

Payload encode_integer(std::span<const float> values, Codec codec, int64_t block) {
  const auto n = static_cast<int64_t>(values.size());
  const int64_t nb = blocks_of(n, block);
  const int qm = q_max(codec);
  Payload out;
  out.codec = std::string(to_string(codec)) + "/" + std::to_string(block);
  out.bytes.assign(static_cast<size_t>(encoded_bytes(codec, n, block)), '\0');
  char* header = out.bytes.data();
  char* scales = header + kHeader;
  auto* q = reinterpret_cast<unsigned char*>(scales + nb * static_cast<int64_t>(sizeof(float)));
  const auto count = static_cast<uint64_t>(n);
  std::memcpy(header, &count, sizeof(count));
  const int old_round = std::fegetround();
  std::fesetround(FE_TONEAREST);  // nearbyint rounds half to even
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    float absmax = 0;
    for (int64_t i = lo; i < hi; ++i) absmax = std::max(absmax, std::fabs(values[static_cast<size_t>(i)]));
    const float scale = absmax / static_cast<float>(qm);
    std::memcpy(scales + b * static_cast<int64_t>(sizeof(float)), &scale, sizeof(float));
    for (int64_t i = lo; i < hi; ++i) {
      int v = 0;
      if (scale > 0) {
        v = static_cast<int>(std::nearbyint(values[static_cast<size_t>(i)] / scale));
        v = std::clamp(v, -qm, qm);
      }
      if (codec == Codec::kQ8) {
        q[i] = static_cast<unsigned char>(static_cast<int8_t>(v));
      } else {
        const auto nibble = static_cast<unsigned char>(v & 0xF);
        q[i / 2] = static_cast<unsigned char>(q[i / 2] | (i % 2 == 0 ? nibble : nibble << 4));
      }
    }
  }
  std::fesetround(old_round);
  return out;
}

std::string decode_integer(const Payload& payload, Codec codec, int64_t block, std::vector<float>& out,
                           int64_t expected_numel) {
  if (payload.bytes.size() < kHeader) return "a " + payload.codec + " payload shorter than its 8-byte header";
  uint64_t count = 0;
  std::memcpy(&count, payload.bytes.data(), sizeof(count));
  if (count > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return "a " + payload.codec + " payload claiming " + std::to_string(count) + " values";
  }
  const auto n = static_cast<int64_t>(count);
  if (expected_numel >= 0 && n != expected_numel) {
    return std::to_string(n) + " " + payload.codec + " values where " + std::to_string(expected_numel) +
           " were expected";
  }
  const int64_t want = encoded_bytes(codec, n, block);
  if (static_cast<int64_t>(payload.bytes.size()) != want) {
    return std::to_string(payload.bytes.size()) + " bytes where " + std::to_string(n) + " " + payload.codec +
           " values take " + std::to_string(want);
  }
  const int64_t nb = blocks_of(n, block);
  const int qm = q_max(codec);
  const char* scales = payload.bytes.data() + kHeader;
  const auto* q = reinterpret_cast<const unsigned char*>(scales + nb * static_cast<int64_t>(sizeof(float)));
  out.resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < nb; ++b) {
    float scale = 0;
    std::memcpy(&scale, scales + b * static_cast<int64_t>(sizeof(float)), sizeof(float));
    if (!std::isfinite(scale) || scale < 0 || scale > std::numeric_limits<float>::max() / static_cast<float>(qm)) {
      return "block " + std::to_string(b) + " of a " + payload.codec + " payload has scale " + std::to_string(scale) +
             " (must be finite, ≥ 0 and decode to finite values)";
    }
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    for (int64_t i = lo; i < hi; ++i) {
      int v = 0;
      if (codec == Codec::kQ8) {
        v = static_cast<int8_t>(q[i]);
      } else {
        const int nibble = i % 2 == 0 ? q[i / 2] & 0xF : q[i / 2] >> 4;
        v = nibble >= 8 ? nibble - 16 : nibble;
      }
      if (v < -qm || v > qm) {
        return "value " + std::to_string(i) + " of a " + payload.codec + " payload is " + std::to_string(v) +
               ", outside [−" + std::to_string(qm) + ", " + std::to_string(qm) + "]";
      }
      out[static_cast<size_t>(i)] = static_cast<float>(v) * scale;
    }
  }
  if (codec == Codec::kQ4 && n % 2 == 1 && (q[n / 2] >> 4) != 0) {
    return "the unused half of a " + payload.codec + " payload's last byte is not zero";
  }
  return "";
}

}  // namespace

int64_t default_block(Codec codec) {
  switch (codec) {
    case Codec::kQ8: return 256;
    case Codec::kQ4: return 64;
    default: return 0;
  }
}

const char* to_string(Codec codec) {
  switch (codec) {
    case Codec::kBf16: return "bf16";
    case Codec::kQ8: return "q8";
    case Codec::kQ4: return "q4";
    default: return "fp32";
  }
}

Codec parse_codec(std::string_view name) {
  if (name == "fp32") return Codec::kFp32;
  if (name == "bf16") return Codec::kBf16;
  if (name == "q8") return Codec::kQ8;
  if (name == "q4") return Codec::kQ4;
  throw InputError("unknown wire codec '" + std::string(name) + "' (expected \"fp32\", \"bf16\", \"q8\" or \"q4\")");
}

int64_t encoded_bytes(Codec codec, int64_t n, int64_t block) {
  if (block <= 0) block = default_block(codec);
  switch (codec) {
    case Codec::kFp32: return 4 * n;
    case Codec::kBf16: return 2 * n;
    default: return static_cast<int64_t>(kHeader) + 4 * blocks_of(n, block) + value_bytes(codec, n);
  }
}

Payload encode(std::span<const float> values, Codec codec, int64_t block) {
  if (codec == Codec::kQ8 || codec == Codec::kQ4) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        throw InputError("cannot encode value " + std::to_string(i) + " (" + std::to_string(values[i]) + ") as " +
                         to_string(codec) + ": a NaN or an infinity would poison its block's scale");
      }
    }
    if (block == 0) block = default_block(codec);
    if (block < 1 || block > kMaxBlock) {
      throw InputError("block of " + std::to_string(block) + " values for " + to_string(codec) + ": must be in [1, " +
                       std::to_string(kMaxBlock) + "]");
    }
    return encode_integer(values, codec, block);
  }
  Payload out;
  out.codec = to_string(codec);
  if (codec == Codec::kBf16) {
    std::vector<uint16_t> packed(values.size());
    float_to_bf16(values, packed);
    out.bytes.assign(reinterpret_cast<const char*>(packed.data()), packed.size() * sizeof(uint16_t));
  } else {
    out.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  return out;
}

std::string decode(const Payload& payload, std::vector<float>& out, int64_t expected_numel) {
  Codec integer = Codec::kFp32;
  int64_t block = 0;
  if (parse_wire_integer(payload.codec, &integer, &block)) {
    return decode_integer(payload, integer, block, out, expected_numel);
  }
  size_t width = 0;
  if (payload.codec == "fp32") {
    width = sizeof(float);
  } else if (payload.codec == "bf16") {
    width = sizeof(uint16_t);
  } else {
    return "unknown codec '" + payload.codec.substr(0, 32) + "'";
  }
  if (payload.bytes.size() % width != 0) {
    return std::to_string(payload.bytes.size()) + " bytes are not a whole number of " + payload.codec + " values";
  }
  const auto n = static_cast<int64_t>(payload.bytes.size() / width);
  if (expected_numel >= 0 && n != expected_numel) {
    return std::to_string(n) + " " + payload.codec + " values where " + std::to_string(expected_numel) +
           " were expected";
  }
  out.resize(static_cast<size_t>(n));
  if (width == sizeof(float)) {
    std::memcpy(out.data(), payload.bytes.data(), payload.bytes.size());
  } else {
    std::vector<uint16_t> raw(static_cast<size_t>(n));
    std::memcpy(raw.data(), payload.bytes.data(), payload.bytes.size());
    bf16_to_float(raw, out);
  }
  return "";
}

std::string apply_update(std::span<const float> base, const Payload& update, std::vector<float>& out) {
  std::string bad = decode(update, out, static_cast<int64_t>(base.size()));
  if (!bad.empty()) return bad;
  for (size_t i = 0; i < base.size(); ++i) {
    out[i] = base[i] + out[i];
    if (!std::isfinite(out[i])) {
      return "value " + std::to_string(i) + " of the updated fragment is not finite (" + std::to_string(base[i]) +
             " + update)";
    }
  }
  return "";
}

Payload ErrorFeedback::encode(std::vector<float>& values, Codec codec, int64_t block, std::vector<float>* decoded) {
  if (residual_.size() == values.size()) {
    for (size_t i = 0; i < values.size(); ++i) values[i] += residual_[i];
  }
  Payload payload;
  try {
    payload = wire::encode(values, codec, block);
  } catch (const InputError&) {
    residual_.clear();
    throw;
  }
  std::vector<float> sent;
  const std::string bad = decode(payload, sent, static_cast<int64_t>(values.size()));
  DLOCO_CHECK(bad.empty() && "the codec cannot decode what it encoded");
  residual_.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) residual_[i] = values[i] - sent[i];
  if (decoded) *decoded = std::move(sent);
  return payload;
}

}  // namespace dloco::wire

namespace dloco::wire {

std::vector<float> fragment_values(const Fragment& fragment) {
  std::vector<float> out;
  std::string bad = fragment.payload.codec == "fp32" ? decode(fragment.payload, out) : "not fp32";
  if (!bad.empty()) {
    throw InputError("fragment " + std::to_string(fragment.fragment) + " arrived as '" +
                     fragment.payload.codec.substr(0, 32) + "' with " + std::to_string(fragment.payload.bytes.size()) +
                     " bytes: " + bad);
  }
  return out;
}

}  // namespace dloco::wire
