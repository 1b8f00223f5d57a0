// Fuzz target: the payload codec (transport/codec.h), what every fragment, answer and merged update on the wire
// goes through (docs/protocol.md §9). Input: a codec name ("fp32", "q4/64", anything), a newline, the payload bytes.
// Checked beyond "no crash, no UB": a payload decode() takes yields exactly the codec's size for its values, q8/q4
// values are finite and within max|scale|·q_max, encoding what was decoded and decoding that again stays within the
// codec's bound (fp32 and bf16: bit for bit; topk: within its own error bound, with at most ⌈L/D⌉ non-zero values a
// chunk), and apply_update() onto a base either refuses or gives finite values.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "fuzz/fuzz_support.h"
#include "transport/codec.h"
#include "transport/sparse_codec.h"

using namespace dloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = fuzz::as_text(data, size);
  const std::string_view name = fuzz::take_until(in, "\n");
  if (name.size() > 32) return 0;
  wire::Payload payload{std::string(name), std::string(in)};
  std::vector<float> values;
  if (!wire::decode(payload, values).empty()) return 0;

  const std::string codec_name(name.substr(0, name.find('/')));
  wire::Codec codec = wire::Codec::kFp32;
  try {
    codec = wire::parse_codec(codec_name);
  } catch (const InputError&) {
    fuzz::require(false, "decode() took a payload whose codec parse_codec() refuses");
  }
  const int64_t n = static_cast<int64_t>(values.size());
  const size_t slash = name.find('/');
  int64_t block = slash == std::string_view::npos ? 0 : std::atoll(std::string(name.substr(slash + 1)).c_str());
  int64_t density = 0;  // topk: one value kept in D ("topk/<C>/<D>")
  if (codec == wire::Codec::kTopK) {
    fuzz::require(wire::sparse::parse(payload.codec, &block, &density), "decode() took a topk name parse() refuses");
  }
  fuzz::require(wire::encoded_bytes(codec, n, block, density) == static_cast<int64_t>(payload.bytes.size()),
          "a payload of another size than encoded_bytes() was taken");
  const bool integer = codec == wire::Codec::kQ8 || codec == wire::Codec::kQ4;
  if (integer || codec == wire::Codec::kTopK) {
    for (float v : values) fuzz::require(std::isfinite(v), "q8/q4/topk decoded a non-finite value");
  }
  if (codec == wire::Codec::kTopK) {  // at most k non-zero values a chunk; re-encoding stays within its bound
    for (int64_t start = 0; start < n; start += block) {
      int64_t nonzero = 0;
      for (int64_t i = start; i < std::min(n, start + block); ++i) nonzero += values[i] != 0;
      fuzz::require(nonzero <= wire::sparse::kept_of(std::min(n, start + block) - start, density),
                    "topk decoded more than k values");
    }
    const wire::Payload again = wire::encode(values, codec, block, density);
    std::vector<float> twice;
    fuzz::require(wire::decode(again, twice, n).empty(), "decode() refused what encode() wrote");
    double gap = 0;
    for (int64_t i = 0; i < n; ++i) gap += std::pow(static_cast<double>(twice[i]) - values[i], 2);
    fuzz::require(std::sqrt(gap) <= wire::error_bound(again, twice) * 1.0001 + 1e-30,
                  "re-encoding moved the values past the topk bound");
  }

  // Re-encode what was decoded: fp32 and bf16 give the same bits back (bf16 values are exact in bf16); q8/q4 give
  // back values within half a step of the new scale.
  bool finite = true;
  for (float v : values) finite = finite && std::isfinite(v);
  if (codec != wire::Codec::kTopK && (finite || !integer)) {
    const wire::Payload again = wire::encode(values, codec, block);
    std::vector<float> twice;
    fuzz::require(wire::decode(again, twice, n).empty(), "decode() refused what encode() wrote");
    if (!integer) {
      fuzz::require(values.empty() || std::memcmp(twice.data(), values.data(), values.size() * sizeof(float)) == 0 || !finite,
              "fp32/bf16 did not round-trip bit for bit");
    } else {
      const int64_t b = block > 0 ? block : wire::default_block(codec);
      const float q_max = codec == wire::Codec::kQ8 ? 127.0f : 7.0f;
      for (int64_t start = 0; start < n; start += b) {
        const int64_t end = std::min(n, start + b);
        float amax = 0;
        for (int64_t i = start; i < end; ++i) amax = std::max(amax, std::fabs(values[i]));
        const float bound = amax / (2 * q_max) * 1.0001f + 1e-30f;
        for (int64_t i = start; i < end; ++i) fuzz::require(std::fabs(twice[i] - values[i]) <= bound, "re-encoding moved a value past the codec's bound");
      }
    }
  }

  // An update onto a base of ones: refused, or every value finite.
  const std::vector<float> base(values.size(), 1.0f);
  std::vector<float> out;
  if (wire::apply_update(base, payload, out).empty()) {
    fuzz::require(out.size() == base.size(), "apply_update() changed the size");
    for (float v : out) fuzz::require(std::isfinite(v), "apply_update() took an update that makes a value non-finite");
  }
  return 0;
}
