// Configuration of the goodput simulator (docs/sim.md, "Goodput"): every knob of the model
// is a field here with its unit and default, settable by name from a TOML calibration file or a CLI flag.
// Unknown names and out-of-range values are InputErrors that name the knob.
// Deliberately not here: the event loop (goodput_sim.h) and any file reading beyond the calibration file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dloco::sim {

/// The training methods the simulator compares (spec: DP, elastic DP, DiLoCo, Streaming DiLoCo, Decoupled).
enum class Method {
  kDp,         // data parallel, no elasticity: any failure stops the job, restart from the last checkpoint
  kElasticDp,  // data parallel over slices: a failure pauses everyone to downscale, a return to upscale
  kDiloco,     // M elastic groups that sync the whole model every H steps and wait for each other
  kStreaming,  // M elastic groups that sync one fragment every H/P steps, hiding it behind τ steps
  kDecoupled,  // M elastic learners that never wait; a syncer merges with quorum K
};

/// "dp", "elastic-dp", "diloco", "streaming", "decoupled".
const char* to_string(Method method);
/// Inverse of to_string; throws InputError listing the valid names.
Method parse_method(std::string_view name);

/// Distribution of the time a failed slice stays away (repair, or swap for a spare) before it can rejoin.
enum class ReturnDist { kFixed, kExponential, kLognormal };
const char* to_string(ReturnDist dist);
ReturnDist parse_return_dist(std::string_view name);

/// One failure replayed from a real run (a chaos run's fault plan, `dloco sim replay`) instead of drawn.
struct TracedFailure {
  double t_s = 0;            // when the chip fails, seconds since the start
  int64_t chip = 0;          // which chip (0 ≤ chip < N)
  double away_s = 0;         // how long its slice stays away before it can rejoin
  bool keeps_state = false;  // a pause (SIGSTOP), not a death: no work is lost, it resumes without a rejoin
};

/// All knobs of one simulated run. Times are seconds of wall time; "chips" are accelerator chips.
struct GoodputConfig {
  Method method = Method::kElasticDp;
  int64_t chips = 150'000;             // N: chips allocated to the run (the goodput denominator)
  int64_t slice_chips = 256;           // S: chips per slice, the unit that fails, is removed and returns
  double chip_mtbf_s = 365.0 * 86400;  // mean time between failures of one chip; cluster MTBF = this / N
  ReturnDist return_dist = ReturnDist::kLognormal;  // shape of a failed slice's time away
  double return_mean_s = 600.0;        // mean time away of a failed slice
  double return_cv = 1.0;              // coefficient of variation of the time away (ignored when fixed)
  double speed_cv = 0.0;               // σ of the per-slice step-time multiplier exp(σ·Z); a group steps at
                                       // the pace of its slowest active slice
  double step_s = 1.0;                 // nominal step time of a group
  double detect_s = 10.0;              // failure -> the job knows which slice died
  double downscale_s = 10.0;           // elastic: re-form the group without the dead slice(s), after detection
  double upscale_s = 10.0;             // elastic: re-form the group with returned slices
  double upscale_batch_s = 60.0;       // elastic: wait this long after the first return before upscaling,
                                       // so that several returns share one pause
  double restart_s = 60.0;             // dp: restart the whole job from its checkpoint, after detection
  double checkpoint_interval_s = 1.0;  // dp: training time between two checkpoints
  int64_t learners = 1;                // M: learners (decoupled) or synchronous groups (diloco, streaming)
  int64_t quorum = 1;                  // K: learners that must step for the global model to receive merges
  int64_t inner_steps = 24;            // H: steps between two syncs of the same fragment
  int64_t fragments = 24;              // P: fragments (streaming/decoupled); diloco syncs the whole model
  int64_t overlap_steps = 2;           // τ: steps a sync may hide behind (streaming, decoupled)
  double rejoin_s = 30.0;              // decoupled: a learner that lost its state fetches Θ from the syncer
  double learner_fatal_fraction = 0.0; // decoupled: fraction of chip failures that take the whole learner
                                       // down (its unmerged progress is lost) instead of only the slice
  double horizon_s = 30.0 * 86400;     // simulated wall time
  uint64_t seed = 1;                   // seed of every random stream (failures, returns, speeds)
  std::vector<TracedFailure> trace;    // if not empty: exactly these failures, in time order, replace the
                                       // Poisson process (chip_mtbf_s and return_dist are then unused)

  /// Number of slices, ceil(N / S); the last slice may be partial.
  int64_t slice_count() const { return (chips + slice_chips - 1) / slice_chips; }
  /// Throws InputError naming the first knob out of range (chips < 1, M > slices, K > M, H % P != 0, ...).
  void validate() const;
};

/// One numeric knob as seen by files and flags: `name` is the field name (flags use dashes).
struct KnobInfo {
  std::string name;
  std::string unit;  // "s", "chips", "1", "steps", ...
  std::string help;
};

/// Every numeric knob of GoodputConfig, in declaration order (method and return_dist are not numeric).
const std::vector<KnobInfo>& knob_table();
/// Sets knob `name` to `value` (integers must be whole numbers). Throws InputError for an unknown name.
void set_knob(GoodputConfig& config, std::string_view name, double value);
/// Current value of knob `name`. Throws InputError for an unknown name.
double get_knob(const GoodputConfig& config, std::string_view name);

/// The resolved config as JSON (every knob, method and return_dist by name).
nlohmann::json to_json(const GoodputConfig& config);

/// A knob value written in a calibration file, with the reason it has that value.
struct CalibratedKnob {
  std::string name;
  double value = 0.0;
  std::string reason;
  std::string group;  // "fixed_shared", "fixed_decoupled" or "fitted_shared"
};

/// A calibration file (configs/sim/*.toml): knobs fixed in advance and knobs fitted on the DP rows, each with
/// its reason. Format: `[group] knob = { value = 1.0, reason = "..." }` for the three groups above, plus
/// optional `return_dist = "lognormal"` at top level.
struct Calibration {
  std::vector<CalibratedKnob> knobs;
  std::string return_dist;  // empty = leave the config's default

  /// Applies every knob (and return_dist) to `config`.
  void apply(GoodputConfig& config) const;
  /// The knob `name`, or nullptr.
  const CalibratedKnob* find(std::string_view name) const;
};

/// Reads a calibration file. Throws InputError for a missing file, a TOML syntax error, an unknown group or
/// knob, a value that is not a number, or a missing/empty reason (every fixed value must say why).
Calibration load_calibration(const std::filesystem::path& path);

/// Writes `calibration` as TOML (the inverse of load_calibration), with `header` as leading comment lines.
std::string calibration_to_toml(const Calibration& calibration, const std::string& header);

}  // namespace dloco::sim
