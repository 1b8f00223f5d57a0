// Internal to src/core: the typed TOML readers and writers config.cc and parallel_config.cc share, and the
// [parallel] fields (one list drives parsing, JSON and TOML, as for_each_field in config.cc).
// Deliberately not here: anything a caller outside src/core should use (core/config.h is the interface).
#pragma once

#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>

#include <toml++/toml.h>

#include "core/check.h"
#include "core/config.h"
#include "core/whole_number.h"

namespace dloco::config_detail {

/// Calls f(key, field&) for every [parallel] field, in file order.
template <class P, class F>
void for_each_parallel_field(P& p, F&& f) {
  f("tensor", p.tensor);
  f("pipeline", p.pipeline);
  f("data", p.data);
  f("zero", p.zero);
  f("micro_batches", p.micro_batches);
  f("schedule", p.schedule);
  f("chunks", p.chunks);
  f("precision", p.precision);
  f("checkpoint_activations", p.checkpoint_activations);
  f("offload", p.offload);
  f("timeout_s", p.timeout_s);
  f("skippipe_setting", p.skippipe_setting);
  f("skippipe_schedule", p.skippipe_schedule);
  f("skippipe_link_scale", p.skippipe_link_scale);
  f("skippipe_compute_scale", p.skippipe_compute_scale);
  f("skippipe_nodes", p.skippipe_nodes);
}

/// "source:line" of a node.
inline std::string where(const std::string& source, const toml::node& node) {
  const auto& src = node.source();
  std::ostringstream os;
  os << source;
  // An override is parsed as a two-line table of its own: its line number would only confuse.
  if (src.begin.line > 0 && source.rfind("override '", 0) != 0) os << ":" << src.begin.line;
  return os.str();
}

/// Assigns a TOML node to a field of the matching type, or throws InputError naming the key.
inline void assign(const std::string& source, const std::string& key, const toml::node& node, std::string& out) {
  if (auto v = node.value<std::string>()) { out = *v; return; }
  throw InputError(where(source, node) + ": '" + key + "' must be a string");
}
inline void assign(const std::string& source, const std::string& key, const toml::node& node, bool& out) {
  if (auto v = node.value_exact<bool>()) { out = *v; return; }
  throw InputError(where(source, node) + ": '" + key + "' must be true or false");
}
inline void assign(const std::string& source, const std::string& key, const toml::node& node, int64_t& out) {
  if (node.is_integer()) { out = *node.value<int64_t>(); return; }
  if (node.is_floating_point()) {  // accept 2e6 for token budgets when it is a whole number
    if (const auto whole = whole_int64(*node.value<double>())) {
      out = *whole;
      return;
    }
  }
  throw InputError(where(source, node) + ": '" + key + "' must be an integer");
}
inline void assign(const std::string& source, const std::string& key, const toml::node& node, uint64_t& out) {
  int64_t v = 0;
  assign(source, key, node, v);
  if (v < 0) throw InputError(where(source, node) + ": '" + key + "' must be ≥ 0");
  out = static_cast<uint64_t>(v);
}
// No field of the config means anything at nan or ±inf (an infinite init_std trained to NaN and wrote a manifest
// that could not be read back): every number must be finite.
inline void assign(const std::string& source, const std::string& key, const toml::node& node, double& out) {
  if (auto v = node.value<double>()) {
    if (!std::isfinite(*v)) throw InputError(where(source, node) + ": '" + key + "' must be a finite number");
    out = *v;
    return;
  }
  throw InputError(where(source, node) + ": '" + key + "' must be a number");
}
template <ConfigChoice E>
inline void assign(const std::string& source, const std::string& key, const toml::node& node, E& out) {
  std::string name;
  assign(source, key, node, name);
  if (auto e = parse_choice<E>(name)) { out = *e; return; }
  throw InputError(where(source, node) + ": '" + key + "' must be " + choice_names<E>() + " (got \"" + name + "\")");
}

/// The precision key: fp16 gets the reason it is refused.
inline void assign(const std::string& source, const std::string& key, const toml::node& node, Precision& out) {
  if (node.value<std::string>() == "fp16") {
    throw InputError(where(source, node) + ": '" + key + "' = \"fp16\" is not available: this LibTorch build runs "
                     "on the CPU, where fp16 matmul does not exist; use \"bf16\" (same memory, fp32's exponent "
                     "range, no loss scaling needed) or \"fp32\"");
  }
  assign<Precision>(source, key, node, out);
}

/// A field's value as TOML text.
template <class T>
std::string toml_value(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    std::ostringstream os;
    os << toml::value<std::string>(v);
    return os.str();
  } else if constexpr (ConfigChoice<T>) {
    return toml_value(std::string(to_string(v)));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, double>) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    std::string s = os.str();
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  } else {
    return std::to_string(v);
  }
}

/// Applies one [[parallel.learner]] table (and its id) onto `out` (already a copy of [parallel]).
/// Throws InputError naming the key and the line.
void apply_parallel_learner(const std::string& source, const toml::table& table, ParallelLearner& out);

/// [[parallel.learner]] tables as TOML text (every field, so the text parses back to the same list).
std::string parallel_learners_toml(const Config& c);

/// Sets skippipe_nodes of [parallel] and every [[parallel.learner]] that names a skippipe_setting but no
/// skippipe_nodes: the length of the setting file's "nodes" array (skippipe/setting.h; its full check, and that a
/// given skippipe_nodes matches, is skippipe/pipeline_check.h's, before any process starts). A config written out
/// (to_toml: the run's config.toml, a checkpoint's manifest) carries the count, so reading it again needs no file.
/// Throws InputError naming the key when the file cannot be read or has no "nodes" array.
void resolve_skippipe_nodes(Config& c);

/// Checks [parallel] and every [[parallel.learner]] against the model, batch and mode; throws InputError.
void validate_parallel(const Config& c);

/// Checks [skippipe] (stages divide the model, a path keeps stage 0 and another, equal visits per non-zero stage
/// per step, one-process fp32 learners only); throws InputError naming the key.
void validate_skippipe(const Config& c);

}  // namespace dloco::config_detail
