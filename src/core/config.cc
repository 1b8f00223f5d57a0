// Config loading: one table of (section, key, field) drives parsing, JSON and TOML output, so a new field is
// added in one place and can never be parsed but not saved (or the reverse).
#include "core/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include <toml++/toml.h>

#include "core/check.h"
#include "core/config_fields.h"
#include "core/slowdown.h"

namespace dloco {

namespace {

using namespace config_detail;

// Calls f(section, key, field&) for every config field, in file order.
template <class C, class F>
void for_each_field(C& c, F&& f) {
  f("model", "preset", c.model.preset);
  f("model", "vocab_size", c.model.vocab_size);
  f("model", "seq_len", c.model.seq_len);
  f("model", "n_layer", c.model.n_layer);
  f("model", "n_head", c.model.n_head);
  f("model", "d_model", c.model.d_model);
  f("model", "d_ff", c.model.d_ff);
  f("model", "tie_embeddings", c.model.tie_embeddings);
  f("model", "rope_theta", c.model.rope_theta);
  f("model", "norm_eps", c.model.norm_eps);
  f("model", "init_std", c.model.init_std);
  f("data", "dir", c.data.dir);
  f("data", "streams", c.data.streams);
  f("data", "order", c.data.order);
  f("train", "batch_size", c.train.batch_size);
  f("train", "grad_accum", c.train.grad_accum);
  f("train", "total_tokens", c.train.total_tokens);
  f("train", "shared_budget", c.train.shared_budget);
  f("train", "lr", c.train.lr);
  f("train", "warmup_steps", c.train.warmup_steps);
  f("train", "min_lr_ratio", c.train.min_lr_ratio);
  f("train", "weight_decay", c.train.weight_decay);
  f("train", "beta1", c.train.beta1);
  f("train", "beta2", c.train.beta2);
  f("train", "adam_eps", c.train.adam_eps);
  f("train", "grad_clip", c.train.grad_clip);
  f("train", "eval_interval", c.train.eval_interval);
  f("train", "eval_tokens", c.train.eval_tokens);
  f("train", "checkpoint_interval", c.train.checkpoint_interval);
  f("train", "learner_state_interval", c.train.learner_state_interval);
  f("train", "log_interval", c.train.log_interval);
  f("diloco", "mode", c.diloco.mode);
  f("diloco", "learners", c.diloco.learners);
  f("diloco", "inner_steps", c.diloco.inner_steps);
  f("diloco", "fragments", c.diloco.fragments);
  f("diloco", "overlap", c.diloco.overlap);
  f("diloco", "quorum", c.diloco.quorum);
  f("diloco", "grace_window", c.diloco.grace_window);
  f("diloco", "gamma", c.diloco.gamma);
  f("diloco", "outer_lr", c.diloco.outer_lr);
  f("diloco", "outer_momentum", c.diloco.outer_momentum);
  f("diloco", "merge", c.diloco.merge);
  f("diloco", "weights", c.diloco.weights);
  f("diloco", "split_large_tensors", c.diloco.split_large_tensors);
  f("diloco", "alpha", c.diloco.alpha);
  f("diloco", "stale_policy", c.diloco.stale_policy);
  f("diloco", "anchor_versions", c.diloco.anchor_versions);
  f("diloco", "wire_up", c.diloco.wire_up);
  f("diloco", "wire_down", c.diloco.wire_down);
  f("diloco", "error_feedback", c.diloco.error_feedback);
  f("diloco", "error_feedback_decay", c.diloco.error_feedback_decay);
  f("diloco", "topk_density", c.diloco.topk_density);
  f("diloco", "screen_ratio", c.diloco.screen_ratio);
  f("diloco", "clip_ratio", c.diloco.clip_ratio);
  f("diloco", "refetch_after", c.diloco.refetch_after);
  f("diloco", "blocking", c.diloco.blocking);
  f("diloco", "bootstrap", c.diloco.bootstrap);
  f("run", "name", c.run.name);
  f("run", "out_dir", c.run.out_dir);
  f("run", "seed", c.run.seed);
  f("run", "device", c.run.device);
  f("run", "threads", c.run.threads);
  f("run", "secret", c.run.secret);
  f("run", "tls_cert", c.run.tls_cert);
  f("run", "tls_key", c.run.tls_key);
  f("run", "tls_ca", c.run.tls_ca);
  f("run", "tls_mutual", c.run.tls_mutual);
  f("run", "insecure", c.run.insecure);
  f("run", "trusted_network", c.run.trusted_network);
  f("run", "syncer_address", c.run.syncer_address);
  f("run", "peer_host", c.run.peer_host);
  f("run", "peer_advertise", c.run.peer_advertise);
  f("run", "monitor", c.run.monitor);
  f("run", "learner_monitor", c.run.learner_monitor);
  f("run", "restart_delay_s", c.run.restart_delay_s);
  f("run", "report_interval_s", c.run.report_interval_s);
  f("run", "slowdown", c.run.slowdown);
  f("run", "collective_timeout_s", c.run.collective_timeout_s);
  f("run", "recovery", c.run.recovery);
  f("skippipe", "stages", c.skippipe.stages);
  f("skippipe", "skip", c.skippipe.skip);
  f("skippipe", "full_depth_every", c.skippipe.full_depth_every);
  for_each_parallel_field(c.parallel, [&](const char* k, auto& field) { f("parallel", k, field); });
}

std::set<std::string> known_sections() {
  std::set<std::string> s;
  Config c;
  for_each_field(c, [&](const char* section, const char*, auto&) { s.insert(section); });
  return s;
}

// Applies one parsed TOML table to c: [model] preset first, then every other key; unknown keys throw.
void apply_table(Config& c, const toml::table& root, const std::string& source) {
  const auto sections = known_sections();
  for (const auto& [name, node] : root) {
    const std::string section(name.str());
    if (!sections.count(section)) {
      throw InputError(where(source, node) + ": unknown section [" + section +
                       "] (known: model, data, train, diloco, run, skippipe, parallel)");
    }
    if (!node.is_table()) throw InputError(where(source, node) + ": '" + section + "' must be a table");
  }
  if (auto preset = root["model"]["preset"].value<std::string>()) c.model = model_preset(*preset);
  for (const auto& [sec_name, sec_node] : root) {
    const std::string section(sec_name.str());
    for (const auto& [key_name, value] : *sec_node.as_table()) {
      const std::string key(key_name.str());
      const toml::node& node = value;  // a plain reference: clang 14 cannot capture a structured binding
      if (section == "parallel" && key == "learner") continue;  // [[parallel.learner]]: after [parallel]'s keys
      bool found = false;
      for_each_field(c, [&](const char* s, const char* k, auto& field) {
        if (section == s && key == k) {
          assign(source, section + "." + key, node, field);
          found = true;
        }
      });
      if (!found) {
        std::string known;
        for_each_field(c, [&](const char* s, const char* k, auto&) {
          if (section == s) known += (known.empty() ? "" : ", ") + std::string(k);
        });
        const bool renamed = section == "diloco" && key == "wire_dtype";
        throw InputError(where(source, node) + ": unknown key '" + key + "' in [" + section + "]" +
                         (renamed ? " (renamed: it is diloco.wire_up now, with diloco.wire_down beside it)"
                                  : " (known keys: " + known + ")"));
      }
    }
  }
  const toml::node* learners = root["parallel"]["learner"].node();
  if (!learners) return;
  if (!learners->is_array_of_tables()) {
    throw InputError(where(source, *learners) + ": 'parallel.learner' must be tables: [[parallel.learner]]");
  }
  for (const auto& table : *learners->as_array()) {
    ParallelLearner entry{0, c.parallel};
    apply_parallel_learner(source, *table.as_table(), entry);
    for (const auto& l : c.parallel_learners) {
      if (l.id == entry.id) {
        throw InputError(where(source, table) + ": a second [[parallel.learner]] with id = " + std::to_string(entry.id));
      }
    }
    c.parallel_learners.push_back(entry);
  }
}

void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw InputError("config: " + key + " " + what);
}

}  // namespace

int64_t ModelConfig::ff_dim() const {
  if (d_ff > 0) return d_ff;
  const int64_t raw = (8 * d_model + 2) / 3;
  return (raw + 63) / 64 * 64;
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig m;
  m.preset = name;
  if (name == "tiny") {  // unit and integration tests: a few thousand parameters, milliseconds per step
    m.vocab_size = 512; m.seq_len = 32; m.n_layer = 2; m.n_head = 2; m.d_model = 32;
  } else if (name == "small") {  // the demo: ~1.3M parameters with a 4096 vocabulary
    m.vocab_size = 4096; m.seq_len = 128; m.n_layer = 4; m.n_head = 4; m.d_model = 128;
  } else if (name == "base-124m") {  // GPT-2-small class for real hardware (~124M with a 16k vocabulary)
    m.vocab_size = 16384; m.seq_len = 1024; m.n_layer = 12; m.n_head = 12; m.d_model = 768; m.d_ff = 3072;
  } else {
    throw InputError("unknown model preset '" + name + "' (known: tiny, small, base-124m)");
  }
  return m;
}

int64_t gpt_parameter_count(const ModelConfig& m) {
  const int64_t V = m.vocab_size, C = m.d_model, L = m.n_layer, F = m.ff_dim();
  return V * C * (m.tie_embeddings ? 1 : 2) + L * (4 * C * C + 3 * C * F + 2 * C) + C;
}

double gpt_flops_per_token(const ModelConfig& m) {
  const double V = m.vocab_size, C = m.d_model, L = m.n_layer, F = m.ff_dim(), T = m.seq_len;
  const double matmul_params = L * (4 * C * C + 3 * C * F) + V * C;  // blocks + output head
  return 6.0 * matmul_params + 12.0 * L * T * C;
}

void validate_model(const ModelConfig& m) {
  // Upper bounds far above any model this runs, low enough that the products taken from them (B·T·grad_accum,
  // V·C parameters) fit int64: batch_size = 4.4·10^17 overflowed B·T·grad_accum (found by fuzz/config.cc).
  require(m.vocab_size >= 2 && m.vocab_size <= (int64_t{1} << 24), "model.vocab_size", "must be in [2, 2^24]");
  require(m.seq_len >= 2 && m.seq_len <= (int64_t{1} << 20), "model.seq_len", "must be in [2, 2^20]");
  require(m.n_layer >= 1 && m.n_layer <= 4096, "model.n_layer", "must be in [1, 4096]");
  require(m.d_model >= 2 && m.d_model <= (int64_t{1} << 20), "model.d_model", "must be in [2, 2^20]");
  require(m.n_head >= 1 && m.d_model % m.n_head == 0, "model.n_head",
          "must be ≥ 1 and divide model.d_model (" + std::to_string(m.d_model) + ")");
  require((m.d_model / m.n_head) % 2 == 0, "model.d_model / model.n_head",
          "(the head size) must be even for rotary positions");
  require(m.d_ff >= 0 && m.d_ff <= (int64_t{1} << 22), "model.d_ff", "must be in [0, 2^22] (0 = automatic)");
  require(m.norm_eps > 0 && m.init_std > 0 && m.rope_theta > 0, "model.norm_eps/init_std/rope_theta",
          "must be > 0");
}

void Config::validate() const {
  const auto& m = model;
  validate_model(m);
  const auto& t = train;
  require(t.batch_size >= 1 && t.batch_size <= (int64_t{1} << 20), "train.batch_size", "must be in [1, 2^20]");
  require(t.grad_accum >= 1 && t.grad_accum <= (int64_t{1} << 20), "train.grad_accum", "must be in [1, 2^20]");
  // Before anything divides the budget by M (diloco.learners = 0 was a SIGFPE in the per-stream check below).
  // Learner ids are in [0, 65536) on the wire (docs/protocol.md §7); a larger M also made this check loop for seconds
  // (found by fuzz/config.cc: M = 18,101,810 took 7 s here).
  require(diloco.learners >= 1 && diloco.learners <= 65536, "diloco.learners", "(M) must be in [1, 65536]");
  require(t.total_tokens >= t.tokens_per_step(m), "train.total_tokens",
          "must cover at least one step (" + std::to_string(t.tokens_per_step(m)) + " tokens)");
  if (!t.shared_budget || diloco.mode != Mode::kDecoupled) {  // a fixed share per stream (or worker)
    const int64_t S = budget_streams(), tps = t.tokens_per_step(m);
    require(t.total_tokens / S >= tps, "train.total_tokens",
            "(" + std::to_string(t.total_tokens) + ") gives each of the " + std::to_string(S) + " " +
                (is_collective_mode(diloco.mode) ? "workers " : "data streams ") + std::to_string(t.total_tokens / S) +
                " tokens, less than one step (B·T·grad_accum = " + std::to_string(tps) +
                " tokens): it must be at least " + std::to_string(S * tps));
  }
  require(t.lr > 0 && std::isfinite(t.lr), "train.lr", "must be a finite number > 0");
  require(t.warmup_steps >= 0, "train.warmup_steps", "must be ≥ 0");
  require(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1, "train.min_lr_ratio", "must be in [0, 1]");
  require(t.weight_decay >= 0, "train.weight_decay", "must be ≥ 0");
  require(t.beta1 >= 0 && t.beta1 < 1 && t.beta2 >= 0 && t.beta2 < 1, "train.beta1/beta2", "must be in [0, 1)");
  require(t.grad_clip >= 0, "train.grad_clip", "must be ≥ 0 (0 disables)");
  require(t.learner_state_interval >= 0, "train.learner_state_interval", "must be ≥ 0 (0 = off)");
  require(t.eval_interval >= 0 && t.eval_tokens >= 0 && t.checkpoint_interval >= 0 && t.log_interval >= 1,
          "train.eval_interval/eval_tokens/checkpoint_interval/log_interval", "must be ≥ 0 (log_interval ≥ 1)");
  const auto& d = diloco;
  require(d.learners >= 1, "diloco.learners", "(M) must be ≥ 1");
  require(d.inner_steps >= 1 && d.fragments >= 1 && d.inner_steps % d.fragments == 0, "diloco.inner_steps",
          "(H = " + std::to_string(d.inner_steps) + ") must be a positive multiple of diloco.fragments (P = " +
              std::to_string(d.fragments) + ")");
  // τ < H where τ means something (decoupled, streaming): a learner holds one answered round per fragment.
  const bool overlapped = d.mode == Mode::kDecoupled || d.mode == Mode::kStreaming;
  require(d.overlap >= 0 && (!overlapped || d.overlap < d.inner_steps), "diloco.overlap",
          "(τ) must be in [0, diloco.inner_steps = " + std::to_string(d.inner_steps) +
              "): a fragment's merge is applied τ steps after its pull and before the fragment's next round, H steps "
              "later");
  require(d.quorum >= 1 && d.quorum <= d.learners, "diloco.quorum",
          "(K) must be in [1, M = " + std::to_string(d.learners) + "]");
  require(d.gamma > 0 && d.gamma < 1, "diloco.gamma", "(γ) must be in (0, 1)");
  require(d.outer_lr > 0 && std::isfinite(d.outer_lr), "diloco.outer_lr", "(η) must be a finite number > 0");
  require(d.outer_momentum >= 0 && d.outer_momentum < 1, "diloco.outer_momentum", "(μ) must be in [0, 1)");
  require(d.alpha >= 0 && d.alpha < 1, "diloco.alpha", "must be in [0, 1)");
  require(d.anchor_versions >= 1, "diloco.anchor_versions", "must be ≥ 1");
  require(d.error_feedback_decay > 0 && d.error_feedback_decay <= 1, "diloco.error_feedback_decay", "(β) must be in (0, 1]");
  require(d.error_feedback || (d.wire_up != WireDtype::kTopK && d.wire_down != WireDtype::kTopK), "diloco.wire_up",
          "\"topk\" (up or down) needs diloco.error_feedback = true: it drops all but 1 of every diloco.topk_density "
          "values, and error feedback carries them into the next one");
  require(d.topk_density >= 2 && d.topk_density <= 1024, "diloco.topk_density", "(D, one value in D kept) must be in "
          "[2, 1024]");
  require(d.screen_ratio == 0 || (d.screen_ratio >= 1 && std::isfinite(d.screen_ratio)), "diloco.screen_ratio",
          "must be 0 (off) or a finite number ≥ 1");
  require(d.clip_ratio == 0 || (d.clip_ratio >= 1 && std::isfinite(d.clip_ratio) &&
                                (d.screen_ratio == 0 || d.clip_ratio < d.screen_ratio)),
          "diloco.clip_ratio", "must be 0 (off) or a finite number ≥ 1 and below diloco.screen_ratio");
  require(d.refetch_after >= 0, "diloco.refetch_after", "must be ≥ 0 (0 = off)");
  require(data.streams >= 0, "data.streams", "must be ≥ 0 (0 = one per learner)");
  require(data.streams == 0 || data.streams >= d.learners, "data.streams", "(S) must be ≥ diloco.learners (M)");
  require(data.streams <= d.learners || train.shared_budget || is_collective_mode(d.mode) || d.mode == Mode::kLocal,
          "data.streams",
          "(S = " + std::to_string(data.streams) + ") > diloco.learners (M) needs train.shared_budget = true: with a "
          "fixed share per stream, streams no learner leases would stay untrained");
  require(!run.name.empty() && run.name.find('/') == std::string::npos && run.name != "." && run.name != "..",
          "run.name", "must be a folder name (not empty, '.', '..' or containing '/')");
  require(run.threads >= 0, "run.threads", "must be ≥ 0 (0 = all cores)");
  require(run.secret.size() <= 256 && std::all_of(run.secret.begin(), run.secret.end(),
                                                  [](char ch) { return ch > ' ' && ch < 127; }),
          "run.secret", "must be printable ASCII without spaces, at most 256 bytes (it travels as a bearer token)");
  {
    const int tls_set = !run.tls_cert.empty() + !run.tls_key.empty() + !run.tls_ca.empty();
    require(tls_set == 0 || tls_set == 3, "run.tls_cert",
            "run.tls_cert, run.tls_key and run.tls_ca are set together (all three or none)");
    require(!run.tls_mutual || tls_set == 3, "run.tls_mutual", "needs run.tls_cert, run.tls_key and run.tls_ca");
  }
  require(run.report_interval_s > 0, "run.report_interval_s", "must be > 0");
  require(run.collective_timeout_s > 0, "run.collective_timeout_s", "must be > 0");
  require(run.recovery == RecoveryPolicy::kStop || d.mode == Mode::kDp, "run.recovery",
          std::string("\"") + to_string(run.recovery) + "\" applies to diloco.mode = \"dp\" only (got mode \"" +
              to_string(d.mode) +
              "\"; decoupled learners are restarted on their own)");
  for (int id = 0; id < d.learners; ++id) (void)slowdown_factor(run, id, d.learners);  // throws on a bad list
  validate_parallel(*this);
  validate_skippipe(*this);
}

int64_t Config::budget_streams() const {
  if (diloco.mode == Mode::kLocal) return 1;
  if (is_collective_mode(diloco.mode)) return diloco.learners;
  return data.streams > 0 ? data.streams : diloco.learners;
}

int64_t Config::complete_tokens() const {
  const int64_t tps = train.tokens_per_step(model);
  if (train.shared_budget && diloco.mode == Mode::kDecoupled) {
    return std::max<int64_t>(0, train.total_tokens - diloco.learners * tps);
  }
  if (is_collective_mode(diloco.mode)) {  // the group stops when its next step would pass the budget
    return std::max<int64_t>(0, train.total_tokens - diloco.learners * tps + 1);
  }
  const int64_t S = budget_streams();
  return S * (train.total_tokens / S / tps) * tps;
}

const ParallelConfig& Config::parallel_for(int64_t id) const {
  for (const auto& l : parallel_learners) {
    if (l.id == id) return l.parallel;
  }
  return parallel;
}

bool is_collective_mode(Mode mode) { return mode == Mode::kDp || mode == Mode::kDiloco || mode == Mode::kStreaming; }

SlowdownSpec slowdown_spec(const RunSettings& run, int id, int64_t learners) {
  SlowdownSpec spec, every;
  bool listed = false;
  std::stringstream list(run.slowdown);
  std::string entry;
  while (std::getline(list, entry, ',')) {
    if (entry.find_first_not_of(" \t") == std::string::npos) continue;
    const auto colon = entry.find(':');
    const auto tilde = entry.find('~');
    long long who = -1;
    double f = 0, sd = 0;
    try {
      if (colon == std::string::npos || (tilde != std::string::npos && tilde < colon)) {
        throw std::invalid_argument("no colon");
      }
      size_t used = 0;
      const std::string id_text = entry.substr(0, colon);
      const auto star = id_text.find_first_not_of(" \t");
      if (star != std::string::npos && id_text[star] == '*') {  // every learner not listed by its id
        used = star + 1;
        who = -2;
      } else {
        who = std::stoll(id_text, &used);
      }
      if (id_text.find_first_not_of(" \t", used) != std::string::npos) throw std::invalid_argument("id");
      const std::string f_text =
          entry.substr(colon + 1, tilde == std::string::npos ? std::string::npos : tilde - colon - 1);
      f = std::stod(f_text, &used);
      if (f_text.find_first_not_of(" \t", used) != std::string::npos) throw std::invalid_argument("factor");
      if (tilde != std::string::npos) {
        const std::string sd_text = entry.substr(tilde + 1);
        sd = std::stod(sd_text, &used);
        if (sd_text.find_first_not_of(" \t", used) != std::string::npos) throw std::invalid_argument("sd");
      }
    } catch (const std::exception&) {
      throw InputError("run.slowdown: entry '" + entry + "' must look like ID:FACTOR or ID:FACTOR~SD, ID a learner or "
                       "* for every other (e.g. \"3:1.18\" or \"*:3~0.1,3:3.54~0.1\")");
    }
    require(who == -2 || (who >= 0 && who < learners), "run.slowdown",
            "names learner " + std::to_string(who) + ", outside [0, M = " + std::to_string(learners) + ")");
    const std::string name = who == -2 ? std::string("*") : std::to_string(who);
    require(f >= 1.0 && std::isfinite(f), "run.slowdown", "factor of learner " + name +
                                                            " must be ≥ 1 (got " + entry.substr(colon + 1) + ")");
    require(sd >= 0.0 && sd < 1.0, "run.slowdown", "the per-step sd of learner " + name +
                                                     " must be in [0, 1) (got " + entry.substr(tilde + 1) + ")");
    if (who == id) {
      spec = {f, sd};
      listed = true;
    } else if (who == -2) {
      every = {f, sd};
    }
  }
  return listed ? spec : every;
}

double slowdown_factor(const RunSettings& run, int id, int64_t learners) {
  return slowdown_spec(run, id, learners).factor;
}

namespace {

namespace fs = std::filesystem;

// `path` made absolute against `base` (already absolute paths and empty ones stay).
void absolutize(std::string& path, const fs::path& base) {
  if (path.empty() || fs::path(path).is_absolute()) return;
  path = (base / path).lexically_normal().string();
}

// Every path of the config, with whether `file` (the parsed config file) sets it: data.dir, run.out_dir and the
// SkipPipe files of [parallel] and of each [[parallel.learner]] (those always come from the file).
void for_each_path(Config& c, const toml::table& file, const std::function<void(std::string&, bool)>& f) {
  f(c.data.dir, file.at_path("data.dir").is_value());
  f(c.run.out_dir, file.at_path("run.out_dir").is_value());
  f(c.run.tls_cert, file.at_path("run.tls_cert").is_value());
  f(c.run.tls_key, file.at_path("run.tls_key").is_value());
  f(c.run.tls_ca, file.at_path("run.tls_ca").is_value());
  f(c.parallel.skippipe_setting, file.at_path("parallel.skippipe_setting").is_value());
  f(c.parallel.skippipe_schedule, file.at_path("parallel.skippipe_schedule").is_value());
  for (auto& l : c.parallel_learners) {
    f(l.parallel.skippipe_setting, true);
    f(l.parallel.skippipe_schedule, true);
  }
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::vector<std::string>& overrides,
                    const std::string& source_name, const std::filesystem::path& file_dir) {
  Config c;
  try {
    const toml::table file = toml::parse(toml_text, source_name);
    apply_table(c, file, source_name);
    if (!file_dir.empty()) {  // the file's own paths: relative to the file
      for_each_path(c, file, [&](std::string& path, bool in_file) {
        if (in_file) absolutize(path, fs::absolute(file_dir));
      });
    }
    for (const auto& ov : overrides) {
      const auto eq = ov.find('=');
      const auto dot = ov.find('.');
      if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
        throw InputError("override '" + ov + "' must look like section.key=value (e.g. train.lr=1e-3)");
      }
      const std::string section = ov.substr(0, dot), key = ov.substr(dot + 1, eq - dot - 1);
      if (section == "parallel" && !c.parallel_learners.empty()) {
        throw InputError("override '" + ov + "': the [[parallel.learner]] tables started from [parallel] as the "
                         "file wrote it, so an override would not reach them; change the file instead");
      }
      std::string value = ov.substr(eq + 1);
      // A bare word that is not valid TOML (run.name=demo) is taken as a string.
      std::string text = "[" + section + "]\n" + key + " = " + value;
      try {
        (void)toml::parse("v = " + value);
      } catch (const toml::parse_error&) {
        text = "[" + section + "]\n" + key + " = " + toml_value(value);
      }
      apply_table(c, toml::parse(text, "override '" + ov + "'"), "override '" + ov + "'");
    }
    if (!file_dir.empty()) {  // defaults and overrides: relative to the working directory
      for_each_path(c, file, [](std::string& path, bool) { absolutize(path, fs::current_path()); });
    }
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw InputError((src.path ? *src.path : source_name) + ":" + std::to_string(src.begin.line) +
                     ": TOML syntax error: " + std::string(e.description()));
  }
  // The baselines' fixed settings (docs/protocol.md §11): DiLoCo syncs the whole model at once without overlap; every
  // baseline waits for all M workers.
  if (c.diloco.mode == Mode::kDiloco) {
    c.diloco.fragments = 1;
    c.diloco.overlap = 0;
  }
  if (is_collective_mode(c.diloco.mode)) {
    c.diloco.quorum = c.diloco.learners;
    c.diloco.grace_window = false;
    c.diloco.merge = MergeRule::kMean;
  }
  config_detail::resolve_skippipe_nodes(c);
  c.validate();
  return c;
}

Config load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw InputError("config '" + path.string() + "' is a folder: give a TOML file (configs/demo.toml is the "
                     "default training job)");
  }
  if (!fs::exists(path, ec)) {
    throw InputError("config file '" + path.string() + "' does not exist (configs/demo.toml is the default training "
                     "job)");
  }
  std::ifstream in(path);
  if (!in) throw InputError("cannot read config file '" + path.string() + "': " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  const fs::path dir = fs::absolute(path).parent_path();
  return parse_config(ss.str(), overrides, path.string(), dir);
}

nlohmann::json to_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  for_each_field(c, [&](const char* s, const char* k, const auto& field) { j[s][k] = field; });
  if (!c.parallel_learners.empty()) {
    auto& list = j["parallel"]["learner"] = nlohmann::json::array();
    for (const auto& l : c.parallel_learners) {
      nlohmann::json entry{{"id", l.id}};
      for_each_parallel_field(l.parallel, [&](const char* k, const auto& field) { entry[k] = field; });
      list.push_back(entry);
    }
  }
  return j;
}

std::string to_toml(const Config& c) {
  std::ostringstream os;
  std::string current;
  for_each_field(c, [&](const char* s, const char* k, const auto& field) {
    if (current != s) {
      os << (current.empty() ? "" : "\n") << "[" << s << "]\n";
      current = s;
    }
    os << k << " = " << toml_value(field) << "\n";
  });
  os << parallel_learners_toml(c);
  return os.str();
}

}  // namespace dloco
