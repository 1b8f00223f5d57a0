// Codec speed (issue 14, "Benchmarks"): encode + decode throughput of each wire codec (transport/codec.h) on one
// core, against a plain memcpy of the same fp32 bytes, for the demo model's size (1.4M values, one outer
// gradient) and the ~8× larger preset's. Throughput counts the fp32 input: GB/s = 4·n / (encode + decode time).
// Repeats alternate memcpy and codec; medians are compared, so the printed ratios hold within one run on a noisy
// machine. Also prints the error feedback's rate (encode, keep the residual and the decoded copy: what a learner or
// the syncer does per fragment) and the bytes on the wire.
// Usage: build/bin/bench_codec [--repeats 9]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "transport/codec.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dloco;
  int repeats = 9;
  CLI::App app{"Encode + decode throughput of every wire codec on one core against memcpy", "bench_codec"};
  app.add_option("--repeats", repeats, "alternating repeats (medians)")->capture_default_str()->check(
      CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  std::printf("one core, medians of %d alternating repeats; GB/s of fp32 input through encode + decode\n", repeats);
  std::printf("%9s %-6s %10s %10s %10s %11s %10s %12s\n", "values", "codec", "bytes", "bits/value", "GB/s",
              "memcpy GB/s", "vs memcpy", "with EF GB/s");
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1e-3f);
  volatile float sink = 0;
  for (const int64_t n : {int64_t{1'400'000}, int64_t{11'000'000}}) {
    std::vector<float> x(static_cast<size_t>(n)), copy(x.size()), decoded;
    for (auto& v : x) v = g(rng);
    for (const wire::Codec codec : {wire::Codec::kFp32, wire::Codec::kBf16, wire::Codec::kQ8, wire::Codec::kQ4}) {
      std::vector<double> t_copy, t_codec, t_ef;
      int64_t bytes = 0;
      wire::ErrorFeedback feedback;
      for (int r = 0; r < repeats; ++r) {
        auto t0 = Clock::now();
        std::memcpy(copy.data(), x.data(), x.size() * sizeof(float));
        t_copy.push_back(seconds_since(t0));
        sink = sink + copy[static_cast<size_t>(r) % copy.size()];
        t0 = Clock::now();
        const wire::Payload p = wire::encode(x, codec);
        const std::string bad = wire::decode(p, decoded, n);
        t_codec.push_back(seconds_since(t0));
        if (!bad.empty()) {
          std::fprintf(stderr, "decode failed: %s\n", bad.c_str());
          return 1;
        }
        bytes = static_cast<int64_t>(p.bytes.size());
        sink = sink + decoded[static_cast<size_t>(r) % decoded.size()];
        std::vector<float> with_residual = x;  // the copy a learner makes anyway (Δ is built in place)
        t0 = Clock::now();
        const wire::Payload q = feedback.encode(with_residual, codec, 0, &decoded);
        t_ef.push_back(seconds_since(t0));
        sink = sink + static_cast<float>(q.bytes.size());
      }
      const double fp32_gb = 4.0 * static_cast<double>(n) / 1e9;
      const double codec_gbs = fp32_gb / median(t_codec), copy_gbs = fp32_gb / median(t_copy);
      char ef[32] = "-";  // error feedback is for the lossy codecs only
      if (codec != wire::Codec::kFp32) std::snprintf(ef, sizeof(ef), "%.2f", fp32_gb / median(t_ef));
      std::printf("%9lld %-6s %10lld %10.3f %10.2f %11.2f %10.3f %12s\n", static_cast<long long>(n),
                  wire::to_string(codec), static_cast<long long>(bytes), 8.0 * static_cast<double>(bytes) / n, codec_gbs,
                  copy_gbs, codec_gbs / copy_gbs, ef);
    }
  }
  return sink == 12345.0f ? 1 : 0;
}
