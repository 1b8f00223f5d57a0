// The payload codec; see codec.h.
#include "transport/codec.h"

#include <cstring>

#include "core/bf16.h"
#include "core/check.h"

namespace dloco::wire {

const char* to_string(Codec codec) { return codec == Codec::kBf16 ? "bf16" : "fp32"; }

Codec parse_codec(std::string_view name) {
  if (name == "fp32") return Codec::kFp32;
  if (name == "bf16") return Codec::kBf16;
  throw InputError("unknown wire codec '" + std::string(name) + "' (expected \"fp32\" or \"bf16\")");
}

Payload encode(std::span<const float> values, Codec codec) {
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
