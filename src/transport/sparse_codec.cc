// The sparse codec; see sparse_codec.h.
#include "transport/sparse_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string_view>

namespace dloco::wire::sparse {

namespace {

constexpr size_t kHeader = sizeof(uint64_t);

int64_t chunks_of(int64_t n, int64_t chunk) { return (n + chunk - 1) / chunk; }

// K = Σ over chunks of the values kept.
int64_t kept_total(int64_t n, int64_t chunk, int64_t density) {
  const int64_t full = n / chunk, rest = n % chunk;
  return full * kept_of(chunk, density) + (rest > 0 ? kept_of(rest, density) : 0);
}

// A whole number in [lo, hi] written without sign or leading zeros; 0 otherwise.
int64_t parse_bounded(std::string_view digits, int64_t lo, int64_t hi) {
  if (digits.empty() || digits.size() > 6 || digits[0] == '0') return 0;
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    v = v * 10 + (c - '0');
  }
  return v >= lo && v <= hi ? v : 0;
}

// The two magnitude levels of a chunk whose kept magnitudes span [t, m]. (m − t)·0.25 is exact (a power of two),
// so each level is one rounding, the same on every machine and in the Python learner, with or without FMA.
float level_lo(float t, float m) { return t + (m - t) * 0.25f; }
float level_hi(float t, float m) { return m - (m - t) * 0.25f; }

}  // namespace

int64_t encoded_bytes(int64_t n, int64_t chunk, int64_t density) {
  const int64_t k = kept_total(n, chunk, density);
  return static_cast<int64_t>(kHeader) + 8 * chunks_of(n, chunk) + 2 * k + (k + 3) / 4;
}

std::string wire_name(int64_t chunk, int64_t density) {
  return "topk/" + std::to_string(chunk) + (density == kDensity ? "" : "/" + std::to_string(density));
}

bool parse(const std::string& name, int64_t* chunk, int64_t* density) {
  if (name.size() > 16 || name.compare(0, 5, "topk/") != 0) return false;
  const std::string_view rest = std::string_view(name).substr(5);
  const size_t slash = rest.find('/');
  const int64_t c = parse_bounded(rest.substr(0, slash), kMinChunk, kMaxChunk);
  const int64_t d = slash == std::string_view::npos ? kDensity
                                                    : parse_bounded(rest.substr(slash + 1), kMinDensity, kMaxDensity);
  // one spelling per layout: the default density is never written out ("topk/<C>/64" is refused)
  if (c == 0 || d == 0 || (slash != std::string_view::npos && d == kDensity)) return false;
  *chunk = c;
  *density = d;
  return true;
}

Payload encode(std::span<const float> values, int64_t chunk, int64_t density) {
  const auto n = static_cast<int64_t>(values.size());
  const int64_t nc = chunks_of(n, chunk), K = kept_total(n, chunk, density);
  Payload out;
  out.codec = wire_name(chunk, density);
  out.bytes.assign(static_cast<size_t>(encoded_bytes(n, chunk, density)), '\0');
  char* ranges = out.bytes.data() + kHeader;
  char* indices = ranges + 8 * nc;
  auto* codes = reinterpret_cast<unsigned char*>(indices + 2 * K);
  const auto count = static_cast<uint64_t>(n);
  std::memcpy(out.bytes.data(), &count, sizeof(count));
  std::vector<uint32_t> order(static_cast<size_t>(std::min(n, chunk)));
  int64_t j = 0;  // the next code
  for (int64_t c = 0; c < nc; ++c) {
    const float* x = values.data() + c * chunk;
    const int64_t len = std::min(n, (c + 1) * chunk) - c * chunk, k = kept_of(len, density);
    std::iota(order.begin(), order.begin() + len, 0u);
    // The k largest magnitudes first (the lower index on a tie), then in index order.
    const auto larger = [x](uint32_t a, uint32_t b) {
      const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
      return fa > fb || (fa == fb && a < b);
    };
    std::nth_element(order.begin(), order.begin() + (k - 1), order.begin() + len, larger);
    std::sort(order.begin(), order.begin() + k);
    float t = std::numeric_limits<float>::max(), m = 0;
    for (int64_t i = 0; i < k; ++i) {
      const float a = std::fabs(x[order[static_cast<size_t>(i)]]);
      t = std::min(t, a);
      m = std::max(m, a);
    }
    std::memcpy(ranges + 8 * c, &t, sizeof(float));
    std::memcpy(ranges + 8 * c + 4, &m, sizeof(float));
    const float middle = t + (m - t) * 0.5f;
    for (int64_t i = 0; i < k; ++i, ++j) {
      const uint32_t at = order[static_cast<size_t>(i)];
      const auto index = static_cast<uint16_t>(at);
      std::memcpy(indices + 2 * j, &index, sizeof(index));
      const unsigned code = (std::fabs(x[at]) >= middle ? 1u : 0u) | (std::signbit(x[at]) ? 2u : 0u);
      codes[j / 4] = static_cast<unsigned char>(codes[j / 4] | (code << (2 * (j % 4))));
    }
  }
  return out;
}

std::string decode(const Payload& payload, int64_t chunk, int64_t density, std::vector<float>& out,
                   int64_t expected_numel) {
  const std::string& codec = payload.codec;
  if (payload.bytes.size() < kHeader) return "a " + codec + " payload shorter than its 8-byte header";
  uint64_t count = 0;
  std::memcpy(&count, payload.bytes.data(), sizeof(count));
  if (count > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return "a " + codec + " payload claiming " + std::to_string(count) + " values";
  }
  const auto n = static_cast<int64_t>(count);
  if (expected_numel >= 0 && n != expected_numel) {
    return std::to_string(n) + " " + codec + " values where " + std::to_string(expected_numel) + " were expected";
  }
  const int64_t want = encoded_bytes(n, chunk, density);
  if (static_cast<int64_t>(payload.bytes.size()) != want) {
    return std::to_string(payload.bytes.size()) + " bytes where " + std::to_string(n) + " " + codec +
           " values take " + std::to_string(want);
  }
  const int64_t nc = chunks_of(n, chunk), K = kept_total(n, chunk, density);
  const char* ranges = payload.bytes.data() + kHeader;
  const char* indices = ranges + 8 * nc;
  const auto* codes = reinterpret_cast<const unsigned char*>(indices + 2 * K);
  if (K % 4 != 0 && (codes[K / 4] >> (2 * (K % 4))) != 0) {
    return "the unused bits of a " + codec + " payload's last byte are not zero";
  }
  out.assign(static_cast<size_t>(n), 0.0f);
  int64_t j = 0;
  for (int64_t c = 0; c < nc; ++c) {
    float t = 0, m = 0;
    std::memcpy(&t, ranges + 8 * c, sizeof(float));
    std::memcpy(&m, ranges + 8 * c + 4, sizeof(float));
    if (!std::isfinite(t) || !std::isfinite(m) || !(t >= 0) || !(t <= m)) {
      return "chunk " + std::to_string(c) + " of a " + codec + " payload has the range [" + std::to_string(t) +
             ", " + std::to_string(m) + "] (must be finite with 0 ≤ t ≤ m)";
    }
    const float lo = level_lo(t, m), hi = level_hi(t, m);
    const int64_t base = c * chunk, len = std::min(n, base + chunk) - base, k = kept_of(len, density);
    int64_t previous = -1;
    for (int64_t i = 0; i < k; ++i, ++j) {
      uint16_t index = 0;
      std::memcpy(&index, indices + 2 * j, sizeof(index));
      if (index <= previous || index >= len) {
        return "index " + std::to_string(index) + " of chunk " + std::to_string(c) + " of a " + codec +
               " payload is " + (index >= len ? "outside the chunk" : "not after the one before");
      }
      previous = index;
      const unsigned code = (codes[j / 4] >> (2 * (j % 4))) & 3u;
      const float magnitude = (code & 1u) ? hi : lo;
      out[static_cast<size_t>(base + index)] = (code & 2u) ? -magnitude : magnitude;
    }
  }
  return "";
}

double error_bound(const Payload& payload, int64_t chunk, int64_t density) {
  if (payload.bytes.size() < kHeader) return 0;
  uint64_t count = 0;
  std::memcpy(&count, payload.bytes.data(), sizeof(count));
  const auto n = static_cast<int64_t>(count);
  const char* ranges = payload.bytes.data() + kHeader;
  double sum = 0;
  for (int64_t c = 0; c < chunks_of(n, chunk); ++c) {
    float t = 0, m = 0;
    std::memcpy(&t, ranges + 8 * c, sizeof(float));
    std::memcpy(&m, ranges + 8 * c + 4, sizeof(float));
    const int64_t len = std::min(n, (c + 1) * chunk) - c * chunk, k = kept_of(len, density);
    const double step = 0.25 * (static_cast<double>(m) - t) * (1 + 1e-6);
    sum += static_cast<double>(len - k) * t * t + static_cast<double>(k) * step * step;
  }
  return std::sqrt(sum);
}

}  // namespace dloco::wire::sparse
