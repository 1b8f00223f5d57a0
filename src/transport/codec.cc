// The payload codec; see codec.h.
#include "transport/codec.h"

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/bf16.h"
#include "core/check.h"
#include "transport/sparse_codec.h"

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

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// The largest |x| over a block of finite values, as the maximum of their bit patterns with the sign cleared: for
// finite non-negative floats the integer order is the float order, and an integer maximum vectorises where a float
// one (NaN-aware) does not.
float block_absmax(const float* x, int64_t count) {
  uint32_t m = 0;
  for (int64_t i = 0; i < count; ++i) m = std::max(m, bits_of(x[i]) & 0x7fffffffu);
  float out;
  std::memcpy(&out, &m, sizeof(out));
  return out;
}

// q = clamp(round-half-even(x / s), −q_max, q_max) for one block of finite values, s > 0, as two's complement
// bytes. Clamping before rounding gives the same integers (rounding is monotone and keeps the integer bounds).
// Adding and subtracting 1.5·2^23 rounds |y| < 2^22 to an integer in the current rounding mode (the caller sets
// to-nearest, ties to even): the value std::nearbyint gives, in a loop the compiler vectorises (nearbyint is a
// libm call without SSE4.1).
void quantize_block(const float* x, int64_t count, float scale, int qm, unsigned char* q) {
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23
  const auto limit = static_cast<float>(qm);
  for (int64_t i = 0; i < count; ++i) {
    const float y = std::min(std::max(x[i] / scale, -limit), limit);
    q[i] = static_cast<unsigned char>(static_cast<int>((y + kRound) - kRound));
  }
}

// q4's nibbles travel two to a byte; the loops below treat each pair as one 16-bit word (low byte = the even value,
// as the wire has it), a uniform operation the compiler vectorises where byte-interleaved code is not.
static_assert(std::endian::native == std::endian::little, "the wire's layout is little-endian");

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
  // q8 writes its bytes in place; q4 first one byte per value (a last odd one padded with 0), then packs them.
  const int64_t pairs = (n + 1) / 2;
  std::vector<uint16_t> words(codec == Codec::kQ4 ? static_cast<size_t>(pairs) : 0, 0);
  unsigned char* v = codec == Codec::kQ8 ? q : reinterpret_cast<unsigned char*>(words.data());
  const int old_round = std::fegetround();
  std::fesetround(FE_TONEAREST);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * block, len = std::min(n, lo + block) - lo;
    const float scale = block_absmax(values.data() + lo, len) / static_cast<float>(qm);
    std::memcpy(scales + b * static_cast<int64_t>(sizeof(float)), &scale, sizeof(float));
    if (scale > 0) {
      quantize_block(values.data() + lo, len, scale, qm, v + lo);
    } else {
      std::fill(v + lo, v + lo + len, static_cast<unsigned char>(0));
    }
  }
  std::fesetround(old_round);
  if (codec == Codec::kQ4) {
    for (int64_t k = 0; k < pairs; ++k) {
      const uint16_t w = words[static_cast<size_t>(k)];
      q[k] = static_cast<unsigned char>((w & 0x0F) | ((w >> 4) & 0xF0));
    }
  }
  return out;
}

// x̂ = q · s_b for block b of a q8 / q4 payload whose scales are valid. `q` holds one byte per value: q8's two's
// complement bytes, or q4's nibbles 0..15 (two's complement in 4 bits). Returns the index of the first value outside
// [−q_max, q_max] (q8's −128, q4's nibble 8), or −1.
int64_t dequantize(Codec codec, const unsigned char* __restrict q, const char* scales, int64_t n, int64_t block,
                   float* __restrict out) {
  unsigned bad = 0;
  for (int64_t b = 0; b * block < n; ++b) {
    float scale = 0;
    std::memcpy(&scale, scales + b * static_cast<int64_t>(sizeof(float)), sizeof(float));
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    if (codec == Codec::kQ8) {
      for (int64_t i = lo; i < hi; ++i) {
        bad |= static_cast<unsigned>(q[i] == 0x80);
        out[i] = static_cast<float>(static_cast<signed char>(q[i])) * scale;
      }
    } else {
      for (int64_t i = lo; i < hi; ++i) {
        bad |= static_cast<unsigned>(q[i] == 8);
        out[i] = static_cast<float>((q[i] ^ 8) - 8) * scale;
      }
    }
  }
  if (!bad) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (q[i] == (codec == Codec::kQ8 ? 0x80 : 8)) return i;
  }
  return -1;
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
  }
  if (codec == Codec::kQ4 && n % 2 == 1 && (q[n / 2] >> 4) != 0) {
    return "the unused half of a " + payload.codec + " payload's last byte is not zero";
  }
  std::vector<uint16_t> nibbles;  // q4: one byte per value, two at a time
  if (codec == Codec::kQ4) {
    nibbles.resize(static_cast<size_t>((n + 1) / 2));
    for (size_t k = 0; k < nibbles.size(); ++k) {
      nibbles[k] = static_cast<uint16_t>((q[k] & 0x0F) | ((q[k] & 0xF0) << 4));
    }
  }
  const auto* values = codec == Codec::kQ4 ? reinterpret_cast<const unsigned char*>(nibbles.data()) : q;
  if (const int64_t i = dequantize(codec, values, scales, n, block, out.data()); i >= 0) {
    const int v = codec == Codec::kQ8 ? -128 : -8;
    return "value " + std::to_string(i) + " of a " + payload.codec + " payload is " + std::to_string(v) +
           ", outside [−" + std::to_string(qm) + ", " + std::to_string(qm) + "]";
  }
  return "";
}

// The index of the first value of x that is not finite, or −1; the scan is a vectorisable reduction over the
// exponent bits, the search only runs when it found one.
int64_t first_not_finite(std::span<const float> x) {
  uint32_t all_ones = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    all_ones |= static_cast<uint32_t>((bits_of(x[i]) & 0x7f800000u) == 0x7f800000u);
  }
  if (all_ones == 0) return -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

int64_t default_block(Codec codec) {
  switch (codec) {
    case Codec::kQ8: return 256;
    case Codec::kQ4: return 64;
    case Codec::kTopK: return sparse::kDefaultChunk;
    default: return 0;
  }
}

const char* to_string(Codec codec) {
  switch (codec) {
    case Codec::kBf16: return "bf16";
    case Codec::kQ8: return "q8";
    case Codec::kQ4: return "q4";
    case Codec::kTopK: return "topk";
    default: return "fp32";
  }
}

Codec parse_codec(std::string_view name) {
  if (name == "fp32") return Codec::kFp32;
  if (name == "bf16") return Codec::kBf16;
  if (name == "q8") return Codec::kQ8;
  if (name == "q4") return Codec::kQ4;
  if (name == "topk") return Codec::kTopK;
  throw InputError("unknown wire codec '" + std::string(name) +
                   "' (expected \"fp32\", \"bf16\", \"q8\", \"q4\" or \"topk\")");
}

int64_t encoded_bytes(Codec codec, int64_t n, int64_t block, int64_t density) {
  if (block <= 0) block = default_block(codec);
  switch (codec) {
    case Codec::kFp32: return 4 * n;
    case Codec::kBf16: return 2 * n;
    case Codec::kTopK: return sparse::encoded_bytes(n, block, density > 0 ? density : sparse::kDensity);
    default: return static_cast<int64_t>(kHeader) + 4 * blocks_of(n, block) + value_bytes(codec, n);
  }
}

Payload encode(std::span<const float> values, Codec codec, int64_t block, int64_t density) {
  if (codec == Codec::kQ8 || codec == Codec::kQ4 || codec == Codec::kTopK) {
    if (const int64_t i = first_not_finite(values); i >= 0) {
      throw InputError("cannot encode value " + std::to_string(i) + " (" +
                       std::to_string(values[static_cast<size_t>(i)]) + ") as " + to_string(codec) +
                       ": a NaN or an infinity would poison its block's scale");
    }
    if (block == 0) block = default_block(codec);
    if (codec == Codec::kTopK) {
      if (block < sparse::kMinChunk || block > sparse::kMaxChunk) {
        throw InputError("chunk of " + std::to_string(block) + " values for topk: must be in [" +
                         std::to_string(sparse::kMinChunk) + ", " + std::to_string(sparse::kMaxChunk) + "]");
      }
      if (density == 0) density = sparse::kDensity;
      if (density < sparse::kMinDensity || density > sparse::kMaxDensity) {
        throw InputError("topk density of one in " + std::to_string(density) + ": must be in [" +
                         std::to_string(sparse::kMinDensity) + ", " + std::to_string(sparse::kMaxDensity) + "]");
      }
      return sparse::encode(values, block, density);
    }
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

double error_bound(const Payload& payload, std::span<const float> decoded) {
  if (int64_t chunk = 0, density = 0; sparse::parse(payload.codec, &chunk, &density)) {
    return sparse::error_bound(payload, chunk, density);
  }
  Codec integer = Codec::kFp32;
  int64_t block = 0;
  if (parse_wire_integer(payload.codec, &integer, &block)) {
    // The step s_b is taken from what was decoded, not from the declared scale: an encoder's block holds its max|x|
    // at ±q_max exactly, so max|x̂_b| = q_max · s_b; a payload declaring a large scale over zeros cannot claim a
    // large error (and with it a large allowance in the norm screen).
    const auto n = static_cast<int64_t>(decoded.size());
    double sum = 0;
    for (int64_t b = 0; b < blocks_of(n, block); ++b) {
      const int64_t lo = b * block, hi = std::min(n, lo + block);
      float amax = 0;
      for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(decoded[static_cast<size_t>(i)]));
      const double half = 0.5 * amax / q_max(integer) * (1 + 1e-6);
      sum += static_cast<double>(hi - lo) * half * half;
    }
    return std::sqrt(sum);
  }
  if (payload.codec == "bf16") {
    double sq = 0;
    for (float v : decoded) sq += static_cast<double>(v) * v;
    return std::sqrt(sq) / 128;
  }
  return 0;
}

std::string decode(const Payload& payload, std::vector<float>& out, int64_t expected_numel) {
  Codec integer = Codec::kFp32;
  int64_t block = 0;
  if (parse_wire_integer(payload.codec, &integer, &block)) {
    return decode_integer(payload, integer, block, out, expected_numel);
  }
  if (int64_t chunk = 0, density = 0; sparse::parse(payload.codec, &chunk, &density)) {
    return sparse::decode(payload, chunk, density, out, expected_numel);
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
  if (n == 0) return "";  // memcpy from an empty string's and into an empty vector's data() (maybe null) is UB
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
  for (size_t i = 0; i < base.size(); ++i) out[i] = base[i] + out[i];
  if (const int64_t i = first_not_finite(out); i >= 0) {
    return "value " + std::to_string(i) + " of the updated fragment is not finite (" +
           std::to_string(base[static_cast<size_t>(i)]) + " + update)";
  }
  return "";
}

Payload ErrorFeedback::encode(std::vector<float>& values, Codec codec, int64_t block, std::vector<float>* decoded,
                              double decay, int64_t density) {
  if (residual_.size() == values.size()) {
    if (decay == 1.0) {
      for (size_t i = 0; i < values.size(); ++i) values[i] += residual_[i];
    } else {
      const auto beta = static_cast<float>(decay);
      for (size_t i = 0; i < values.size(); ++i) values[i] += beta * residual_[i];
    }
  }
  Payload payload;
  try {
    payload = wire::encode(values, codec, block, density);
  } catch (const InputError&) {
    residual_.clear();
    throw;
  }
  // decode(sent) lands in the residual's own buffer (no allocation per round), then e = x − x̂ in place.
  const std::string bad = decode(payload, residual_, static_cast<int64_t>(values.size()));
  DLOCO_CHECK(bad.empty() && "the codec cannot decode what it encoded");
  if (decoded) decoded->assign(residual_.begin(), residual_.end());
  for (size_t i = 0; i < values.size(); ++i) residual_[i] = values[i] - residual_[i];
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
