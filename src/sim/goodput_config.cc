// Knob table, validation and the calibration file format of the goodput simulator.
#include "sim/goodput_config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <variant>

#include <toml++/toml.h>

#include "core/check.h"

namespace dloco::sim {
namespace {

using Member = std::variant<double GoodputConfig::*, int64_t GoodputConfig::*, uint64_t GoodputConfig::*>;

struct KnobEntry {
  KnobInfo info;
  Member member;
};

const std::vector<KnobEntry>& entries() {
  static const std::vector<KnobEntry> kEntries = {
      {{"chips", "chips", "N: chips allocated to the run"}, &GoodputConfig::chips},
      {{"slice_chips", "chips", "S: chips per slice (unit of failure and elasticity)"}, &GoodputConfig::slice_chips},
      {{"chip_mtbf_s", "s", "mean time between failures of one chip"}, &GoodputConfig::chip_mtbf_s},
      {{"return_mean_s", "s", "mean time a failed slice stays away"}, &GoodputConfig::return_mean_s},
      {{"return_cv", "1", "coefficient of variation of the time away"}, &GoodputConfig::return_cv},
      {{"speed_cv", "1", "sigma of the per-slice step-time multiplier exp(sigma*Z)"}, &GoodputConfig::speed_cv},
      {{"step_s", "s", "nominal step time"}, &GoodputConfig::step_s},
      {{"detect_s", "s", "failure to detection"}, &GoodputConfig::detect_s},
      {{"downscale_s", "s", "elastic: re-form without the dead slice"}, &GoodputConfig::downscale_s},
      {{"upscale_s", "s", "elastic: re-form with returned slices"}, &GoodputConfig::upscale_s},
      {{"upscale_batch_s", "s", "elastic: wait after the first return before upscaling"},
       &GoodputConfig::upscale_batch_s},
      {{"restart_s", "s", "dp: restart from checkpoint, after detection"}, &GoodputConfig::restart_s},
      {{"checkpoint_interval_s", "s", "dp: training time between checkpoints"}, &GoodputConfig::checkpoint_interval_s},
      {{"learners", "1", "M: learners or synchronous groups"}, &GoodputConfig::learners},
      {{"quorum", "1", "K: learners that must step for merges to happen"}, &GoodputConfig::quorum},
      {{"inner_steps", "steps", "H: steps between two syncs of a fragment"}, &GoodputConfig::inner_steps},
      {{"fragments", "1", "P: fragments"}, &GoodputConfig::fragments},
      {{"overlap_steps", "steps", "tau: steps a sync hides behind"}, &GoodputConfig::overlap_steps},
      {{"rejoin_s", "s", "decoupled: a learner that lost its state fetches it from the syncer"},
       &GoodputConfig::rejoin_s},
      {{"learner_fatal_fraction", "1", "decoupled: fraction of failures that take the whole learner down"},
       &GoodputConfig::learner_fatal_fraction},
      {{"horizon_s", "s", "simulated wall time"}, &GoodputConfig::horizon_s},
      {{"seed", "1", "seed of every random stream"}, &GoodputConfig::seed},
  };
  return kEntries;
}

const KnobEntry& entry(std::string_view name) {
  for (const KnobEntry& e : entries()) {
    if (e.info.name == name) return e;
  }
  std::ostringstream os;
  os << "unknown simulator knob '" << name << "'; known knobs:";
  for (const KnobEntry& e : entries()) os << ' ' << e.info.name;
  throw InputError(os.str());
}

void require(bool ok, const char* knob, const std::string& what) {
  if (!ok) throw InputError(std::string("simulator knob ") + knob + ": " + what);
}

}  // namespace

const char* to_string(Method method) {
  switch (method) {
    case Method::kDp: return "dp";
    case Method::kElasticDp: return "elastic-dp";
    case Method::kDiloco: return "diloco";
    case Method::kStreaming: return "streaming";
    case Method::kDecoupled: return "decoupled";
  }
  return "?";
}

Method parse_method(std::string_view name) {
  for (Method m : {Method::kDp, Method::kElasticDp, Method::kDiloco, Method::kStreaming, Method::kDecoupled}) {
    if (name == to_string(m)) return m;
  }
  throw InputError("unknown method '" + std::string(name) +
                   "'; use one of dp, elastic-dp, diloco, streaming, decoupled");
}

const char* to_string(ReturnDist dist) {
  switch (dist) {
    case ReturnDist::kFixed: return "fixed";
    case ReturnDist::kExponential: return "exponential";
    case ReturnDist::kLognormal: return "lognormal";
  }
  return "?";
}

ReturnDist parse_return_dist(std::string_view name) {
  for (ReturnDist d : {ReturnDist::kFixed, ReturnDist::kExponential, ReturnDist::kLognormal}) {
    if (name == to_string(d)) return d;
  }
  throw InputError("unknown return distribution '" + std::string(name) +
                   "'; use one of fixed, exponential, lognormal");
}

void GoodputConfig::validate() const {
  require(chips >= 1, "chips", "must be at least 1");
  require(slice_chips >= 1, "slice_chips", "must be at least 1");
  require(chip_mtbf_s > 0, "chip_mtbf_s", "must be positive");
  require(return_mean_s >= 0 && return_cv >= 0, "return_mean_s/return_cv", "must be non-negative");
  require(speed_cv >= 0 && speed_cv < 2, "speed_cv", "must be in [0, 2)");
  require(step_s > 0, "step_s", "must be positive");
  for (auto [v, name] : {std::pair{detect_s, "detect_s"}, {downscale_s, "downscale_s"}, {upscale_s, "upscale_s"},
                         {upscale_batch_s, "upscale_batch_s"}, {restart_s, "restart_s"}, {rejoin_s, "rejoin_s"}}) {
    require(v >= 0, name, "must be non-negative");
  }
  require(checkpoint_interval_s > 0, "checkpoint_interval_s", "must be positive");
  require(learners >= 1, "learners", "must be at least 1");
  require(learners <= slice_count(), "learners",
          "M = " + std::to_string(learners) + " exceeds the " + std::to_string(slice_count()) +
              " slices; every learner needs at least one slice (lower M or slice_chips)");
  require(quorum >= 1 && quorum <= learners, "quorum", "K must be in [1, M]");
  require(inner_steps >= 1 && fragments >= 1, "inner_steps/fragments", "must be at least 1");
  require(inner_steps % fragments == 0, "inner_steps",
          "H = " + std::to_string(inner_steps) + " must be a multiple of P = " + std::to_string(fragments));
  require(overlap_steps >= 0, "overlap_steps", "must be non-negative");
  require(learner_fatal_fraction >= 0 && learner_fatal_fraction <= 1, "learner_fatal_fraction", "must be in [0, 1]");
  require(horizon_s > 0, "horizon_s", "must be positive");
  for (size_t i = 0; i < trace.size(); ++i) {
    require(trace[i].chip >= 0 && trace[i].chip < chips && trace[i].away_s >= 0 && trace[i].t_s >= 0 &&
                (i == 0 || trace[i].t_s >= trace[i - 1].t_s),
            "trace", "failure " + std::to_string(i + 1) + " must name a chip in [0, N), a time ≥ the one before and "
                     "away_s ≥ 0");
  }
}

const std::vector<KnobInfo>& knob_table() {
  static const std::vector<KnobInfo> kTable = [] {
    std::vector<KnobInfo> t;
    for (const KnobEntry& e : entries()) t.push_back(e.info);
    return t;
  }();
  return kTable;
}

void set_knob(GoodputConfig& config, std::string_view name, double value) {
  const KnobEntry& e = entry(name);
  if (!std::isfinite(value)) throw InputError("simulator knob " + e.info.name + ": value must be finite");
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(config.*member)>;
        if constexpr (std::is_same_v<T, double>) {
          config.*member = value;
        } else {
          if (value != std::floor(value) || value < 0 || value > 9.0e15) {
            throw InputError("simulator knob " + e.info.name + " must be a whole non-negative number, got " +
                             std::to_string(value));
          }
          config.*member = static_cast<T>(value);
        }
      },
      e.member);
}

double get_knob(const GoodputConfig& config, std::string_view name) {
  const KnobEntry& e = entry(name);
  return std::visit([&](auto member) { return static_cast<double>(config.*member); }, e.member);
}

nlohmann::json to_json(const GoodputConfig& config) {
  nlohmann::json j;
  j["method"] = to_string(config.method);
  j["return_dist"] = to_string(config.return_dist);
  for (const KnobEntry& e : entries()) {
    std::visit([&](auto member) { j[e.info.name] = config.*member; }, e.member);
  }
  return j;
}

void Calibration::apply(GoodputConfig& config) const {
  for (const CalibratedKnob& k : knobs) set_knob(config, k.name, k.value);
  if (!return_dist.empty()) config.return_dist = parse_return_dist(return_dist);
}

const CalibratedKnob* Calibration::find(std::string_view name) const {
  for (const CalibratedKnob& k : knobs) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

Calibration load_calibration(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) {
    throw InputError("calibration file " + path.string() +
                     " not found; pass --calibration configs/sim/calibration.toml (run from the repository root)");
  }
  toml::table root;
  try {
    root = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "calibration file " << path.string() << ": " << e.description() << " at line " << e.source().begin.line;
    throw InputError(os.str());
  }
  Calibration cal;
  for (const auto& [key, node] : root) {
    const std::string group(key.str());
    if (group == "schema") continue;
    if (group == "return_dist") {
      const auto* s = node.as_string();
      if (s == nullptr) throw InputError("calibration file " + path.string() + ": return_dist must be a string");
      cal.return_dist = s->get();
      parse_return_dist(cal.return_dist);  // validates
      continue;
    }
    if (group != "fixed_shared" && group != "fixed_decoupled" && group != "fitted_shared") {
      throw InputError("calibration file " + path.string() + ": unknown section [" + group +
                       "]; use [fixed_shared], [fixed_decoupled] or [fitted_shared]");
    }
    const toml::table* table = node.as_table();
    if (table == nullptr) throw InputError("calibration file " + path.string() + ": " + group + " must be a table");
    for (const auto& [kkey, knode] : *table) {
      const std::string name(kkey.str());
      const std::string where = "calibration file " + path.string() + ": " + group + "." + name;
      entry(name);  // unknown knob -> InputError listing the known ones
      const toml::table* item = knode.as_table();
      if (item == nullptr) throw InputError(where + " must be { value = ..., reason = \"...\" }");
      const std::optional<double> value = (*item)["value"].value<double>();
      const std::optional<std::string> reason = (*item)["reason"].value<std::string>();
      if (!value) throw InputError(where + ": missing numeric 'value'");
      if (!reason || reason->empty()) throw InputError(where + ": missing 'reason' (every value must say why)");
      for (const auto& [field, unused] : *item) {
        if (field.str() != "value" && field.str() != "reason") {
          throw InputError(where + ": unknown field '" + std::string(field.str()) + "'");
        }
      }
      cal.knobs.push_back({name, *value, *reason, group});
    }
  }
  return cal;
}

std::string calibration_to_toml(const Calibration& calibration, const std::string& header) {
  std::ostringstream os;
  std::istringstream lines(header);
  for (std::string line; std::getline(lines, line);) os << "# " << line << '\n';
  os << "schema = \"dloco-sim-calibration/1\"\n";
  if (!calibration.return_dist.empty()) os << "return_dist = \"" << calibration.return_dist << "\"\n";
  for (const char* group : {"fixed_shared", "fixed_decoupled", "fitted_shared"}) {
    os << "\n[" << group << "]\n";
    for (const CalibratedKnob& k : calibration.knobs) {
      if (k.group != group) continue;
      std::string reason = k.reason;
      for (size_t i = 0; (i = reason.find('"', i)) != std::string::npos; i += 2) reason.replace(i, 1, "\\\"");
      std::ostringstream value;
      value.precision(10);
      value << k.value;
      std::string v = value.str();
      if (v.find_first_of(".e") == std::string::npos) v += ".0";
      os << k.name << " = { value = " << v << ", reason = \"" << reason << "\" }\n";
    }
  }
  return os.str();
}

}  // namespace dloco::sim
