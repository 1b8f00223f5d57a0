// Compute utilisation (CU = compute time / wall time) as a function of the link bandwidth between workers
// (datacenters), for DP, DiLoCo and Streaming DiLoCo (± overlap, ± low-precision outer gradients), and the
// bandwidth needed for a target CU (docs/sim.md, "Bandwidth"). The model (docs/sim.md):
//   - a step is a forward (fraction f of t_step) then a backward over L equal layers; all traffic crosses one
//     link of bandwidth W, one transfer at a time; an all-reduce over n workers moves 2(n−1)/n × the payload;
//   - DP: each layer's gradient is all-reduced as soon as its backward is done; the next step's forward of a
//     layer waits for that layer's reduced gradient (steady state of that pipeline, simulated exactly);
//   - DiLoCo: the whole model every H steps, blocking, overlapped only with the last backward;
//   - Streaming: one of P fragments every H/P steps, hidden behind τ steps plus the backward (τ = 0: none);
//     Decoupled DiLoCo's syncer traffic is the same pattern.
// Deliberately not here: latency, compression compute time, congestion, more than one link.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dloco::sim {

/// Numeric format of what crosses the link. int8/int4 carry one fp32 absmax scale per block of values.
enum class Precision { kFp32, kBf16, kInt8, kInt4, kFp4 };
const char* to_string(Precision precision);
/// Inverse of to_string ("fp32", "bf16", "int8", "int4", "fp4"); InputError listing the names otherwise.
Precision parse_precision(std::string_view name);
/// Bits on the wire per value: 32, 16, 8 + 32/block, 4 + 32/block, 4.
double bits_per_value(Precision precision, int64_t quant_block);

/// How workers synchronise.
enum class SyncMethod { kDp, kDiloco, kStreaming };
const char* to_string(SyncMethod method);
SyncMethod parse_sync_method(std::string_view name);

/// The workload and the outer-loop settings. Defaults: the 1B row of Streaming DiLoCo's Table 4.
struct BandwidthModel {
  double params = 1e9;             // N_params: values exchanged per full sync
  int64_t layers = 24;             // L: equal layers of the backward pipeline (DP overlap granularity)
  double step_s = 0.1;             // t_step: compute time of one step, seconds
  double forward_fraction = 1.0 / 3;  // f: share of t_step spent in the forward pass
  int64_t workers = 2;             // n: workers (datacenters) in the all-reduce
  int64_t inner_steps = 100;       // H: steps between two syncs of the same parameters
  int64_t fragments = 8;           // P: fragments (streaming); DiLoCo sends everything at once
  int64_t overlap_steps = 1;       // τ: steps a fragment may hide behind (0 = blocking)
  Precision dp_precision = Precision::kBf16;     // gradients (DP)
  Precision outer_precision = Precision::kBf16;  // outer gradients (DiLoCo, Streaming)
  int64_t quant_block = 256;       // values per fp32 scale for int8/int4

  /// InputError naming the first bad field (params ≤ 0, P > H, ...). H/P need not be whole: a fragment every
  /// H/P steps on average.
  void validate() const;
};

/// CU in [0, 1] at a link bandwidth of `gbit_per_s` (10^9 bit/s). Throws InputError on a bad model or W ≤ 0.
double compute_utilization(SyncMethod method, const BandwidthModel& model, double gbit_per_s);

/// Smallest bandwidth (Gbit/s) with CU ≥ target (0 < target < 1), by bisection on log W to 0.01%;
/// +infinity when even 10^7 Gbit/s does not reach it (e.g. DP at 100% CU).
double required_bandwidth(SyncMethod method, const BandwidthModel& model, double target_cu);

/// The spec's closed form for a fragment that must cross within τ steps:
/// B = (N_params · bits_per_value / P) / (τ · t_step), Gbit/s (no all-reduce factor: one direction).
double hidden_fragment_bandwidth(double params, Precision precision, int64_t quant_block, int64_t fragments,
                                 int64_t overlap_steps, double step_s);

/// Bandwidths on the log grid the Streaming DiLoCo paper's Table 4 reports (10^(−1 + 4k/49), k = 0..49):
/// the largest grid value ≤ `gbit_per_s`, i.e. the value that table prints for a threshold of `gbit_per_s`.
double paper_grid_floor(double gbit_per_s);

/// One reference row: a model of Table 4 or of the spec, the method, and the paper's Gbit/s per CU target.
struct BandwidthReference {
  std::string model_label;   // "1B, 24 layers, 0.1 s step", ...
  std::string method_label;  // "DP", "DiLoCo", "Streaming", "Streaming + overlap", "Streaming + overlap + FP4"
  SyncMethod method;
  BandwidthModel model;
  std::vector<double> paper_gbps;  // at reference_cu_targets()
};

/// CU targets of Table 4: 0.5, 0.8, 0.9, 0.95, 0.99.
const std::vector<double>& reference_cu_targets();
/// The nine rows of the spec's Table 4, with the model settings this simulator uses for them.
const std::vector<BandwidthReference>& table4_references();

}  // namespace dloco::sim
