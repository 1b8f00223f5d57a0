// The [parallel] section and its [[parallel.learner]] tables: parsing, TOML output and the checks against the
// model, the batch and the mode (docs/parallel.md "Configuring learner groups"). What a group does not support yet is
// refused here with the reason, never silently run as something else.
#include <cmath>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/config_fields.h"
#include "core/json_read.h"
#include "core/stages_per_path.h"

namespace dloco::config_detail {

namespace {
void require(bool ok, const std::string& key, const std::string& what) {
  if (!ok) throw InputError("config: " + key + " " + what);
}

// A SkipPipe learner's checks (docs/skippipe.md "A SkipPipe learner"): the pipeline is the whole group.
void validate_skippipe_group(const Config& c, const ParallelConfig& g, const std::string& key) {
  require(!g.skippipe_setting.empty() && !g.skippipe_schedule.empty(), key + ".skippipe_setting/skippipe_schedule",
          "go together: a SkipPipe learner needs both files (or neither)");
  require(g.tensor == 1 && g.pipeline == 1 && g.data == 1 && g.zero == 0 && g.micro_batches == 1, key,
          "with skippipe_schedule is a SkipPipe pipeline (one rank per node of the setting): tensor, pipeline, data, "
          "micro_batches must be 1 and zero 0");
  require(g.precision == Precision::kFp32 && !g.offload && !g.checkpoint_activations, key,
          "with skippipe_schedule runs fp32 without offload or activation checkpointing for now");
  require(g.skippipe_nodes >= 2, key + ".skippipe_setting",
          "= '" + g.skippipe_setting + "' has " + std::to_string(g.skippipe_nodes) +
              " node(s): a pipeline needs 2 or more");
  require(std::isfinite(g.skippipe_link_scale) && g.skippipe_link_scale >= 0, key + ".skippipe_link_scale",
          "must be finite and ≥ 0 (0 = links not emulated)");
  require(std::isfinite(g.skippipe_compute_scale) && g.skippipe_compute_scale >= 0, key + ".skippipe_compute_scale",
          "must be finite and ≥ 0 (0 = compute not emulated)");
  require(c.diloco.mode == Mode::kDecoupled, key,
          "with skippipe_schedule is a SkipPipe learner: it runs in diloco.mode = \"decoupled\" (got \"" +
              std::string(to_string(c.diloco.mode)) + "\"; the baselines' rank-by-rank averaging is not built for it)");
  require(c.run.device == "cpu", key, "with skippipe_schedule runs on the CPU only for now");
}

// One group's checks; `key` is "parallel" or "parallel.learner[id = N]" for the messages.
void validate_group(const Config& c, const ParallelConfig& g, const std::string& key) {
  if (g.skippipe() || !g.skippipe_setting.empty()) {
    validate_skippipe_group(c, g, key);
    return;
  }
  require(g.skippipe_link_scale == 0 && g.skippipe_compute_scale == 0 && g.skippipe_nodes == 0,
          key + ".skippipe_link_scale/compute_scale/nodes",
          "apply to a SkipPipe learner only: set skippipe_setting and skippipe_schedule, or leave them at 0");
  const auto& m = c.model;
  require(g.tensor >= 1 && g.pipeline >= 1 && g.data >= 1, key + ".tensor/pipeline/data", "must be ≥ 1");
  require(g.zero >= 0 && g.zero <= 3, key + ".zero", "must be 0, 1, 2 or 3 (got " + std::to_string(g.zero) + ")");
  require(g.micro_batches >= 1 && g.chunks >= 1, key + ".micro_batches/chunks", "must be ≥ 1");
  require(g.timeout_s > 0, key + ".timeout_s", "must be > 0");
  require(g.zero <= 1 || g.pipeline == 1, key + ".zero",
          "= " + std::to_string(g.zero) + " with pipeline = " + std::to_string(g.pipeline) +
              " is not built (DeepSpeed refuses ZeRO-2/3 with pipelines too): use zero = 1 (Megatron's distributed "
              "optimizer) or 0 (replicated AdamW)");
  require(g.zero != 2 || g.tensor == 1, key + ".zero",
          "= 2 with tensor = " + std::to_string(g.tensor) + " is not built: use zero = 3 (FSDP × TP), 1 (the "
          "distributed optimizer) or 0");
  require(!g.offload || (g.pipeline == 1 && (g.tensor == 1 || g.zero == 3)), key + ".offload",
          "is wired into ZeRO groups without pipelines only for now: zero ≥ 1 with tensor = 1, or zero = 3");
  require(g.precision == Precision::kFp32 || g.zero != 2, key + ".precision",
          "= \"bf16\" runs with zero = 0, 1 (the distributed optimizer) or 3, not with ZeRO-2 (docs/parallel.md)");
  require(!g.offload || g.zero >= 1, key + ".offload",
          "keeps ZeRO's sharded AdamW state in files on local disk: set data > 1 and zero ≥ 1 (or offload = false)");
  require(g.zero == 0 || g.data > 1, key + ".zero",
          "shards over the data-parallel ranks: set data > 1 (data = 1 has nothing to shard over)");
  require(g.zero != 3 || !m.tie_embeddings, key + ".zero",
          "= 3 shards the embedding and the head as separate units: set model.tie_embeddings = false");
  require(c.train.batch_size % g.data == 0, key + ".data",
          "(" + std::to_string(g.data) + ") must divide train.batch_size (" + std::to_string(c.train.batch_size) + ")");
  require(m.n_head % g.tensor == 0 && m.ff_dim() % g.tensor == 0 && m.vocab_size % g.tensor == 0, key + ".tensor",
          "(" + std::to_string(g.tensor) + ") must divide model.n_head, the SwiGLU width and model.vocab_size");
  require(g.chunks == 1 || g.schedule == PipelineScheduleChoice::kInterleaved, key + ".chunks",
          "> 1 needs schedule = \"interleaved\"");
  require(g.pipeline * g.chunks <= m.n_layer, key + ".pipeline",
          "· chunks (" + std::to_string(g.pipeline * g.chunks) + ") must not exceed model.n_layer (" +
              std::to_string(m.n_layer) + ")");
  require((c.train.batch_size / g.data) % g.micro_batches == 0, key + ".micro_batches",
          "(" + std::to_string(g.micro_batches) + ") must divide each replica's share of train.batch_size (" +
              std::to_string(c.train.batch_size) + " / data = " + std::to_string(c.train.batch_size / g.data) + ")");
  require(g.schedule != PipelineScheduleChoice::kInterleaved || g.micro_batches % g.pipeline == 0,
          key + ".micro_batches", "must be a multiple of pipeline for the interleaved schedule");
  require(g.micro_batches == 1 || g.pipeline > 1, key + ".micro_batches", "> 1 needs pipeline > 1");
  require(!g.checkpoint_activations || g.pipeline > 1 || g.zero == 3, key + ".checkpoint_activations",
          "is wired into pipeline learners and ZeRO-3 (whose units always recompute) only for now (set pipeline > 1, "
          "or false)");
  const bool plain = g.ranks() == 1 && g.precision == Precision::kFp32 && !g.offload;  // today's one-process learner
  require(plain || c.diloco.mode == Mode::kDecoupled || is_collective_mode(c.diloco.mode), key,
          "makes a learner of " + std::to_string(g.ranks()) + " rank(s) (precision \"" + to_string(g.precision) +
              "\"): diloco.mode = \"" + std::string(to_string(c.diloco.mode)) + "\" runs one-process learners "
              "only (learner groups run in \"decoupled\", \"dp\", \"diloco\" and \"streaming\")");
  require(plain || c.run.device == "cpu", key,
          "runs on the CPU only for now (run.device = \"" + c.run.device + "\"): no GPU path of a learner group is "
          "built or tested yet");
}
}  // namespace

void apply_parallel_learner(const std::string& source, const toml::table& table, ParallelLearner& out) {
  bool has_id = false;
  for (const auto& [key_name, value] : table) {
    const std::string key(key_name.str());
    const toml::node& node = value;  // a plain reference: clang 14 cannot capture a structured binding
    if (key == "id") {
      assign(source, "parallel.learner.id", node, out.id);
      has_id = true;
      continue;
    }
    bool found = false;
    for_each_parallel_field(out.parallel, [&](const char* k, auto& field) {
      if (key == k) {
        assign(source, "parallel.learner." + key, node, field);
        found = true;
      }
    });
    if (!found) {
      std::string known = "id";
      for_each_parallel_field(out.parallel, [&](const char* k, auto&) { known += ", " + std::string(k); });
      throw InputError(where(source, node) + ": unknown key '" + key + "' in [[parallel.learner]] (known keys: " +
                       known + ")");
    }
  }
  if (!has_id) throw InputError(where(source, table) + ": a [[parallel.learner]] table needs an id (the learner slot)");
  if (out.id < 0 || out.id >= kMaxLearnerId) {
    throw InputError(where(source, table) + ": parallel.learner.id = " + std::to_string(out.id) + " is outside [0, " +
                     std::to_string(kMaxLearnerId) + ")");
  }
}

std::string parallel_learners_toml(const Config& c) {
  std::ostringstream os;
  for (const auto& l : c.parallel_learners) {
    os << "\n[[parallel.learner]]\nid = " << l.id << "\n";
    for_each_parallel_field(l.parallel, [&](const char* k, const auto& field) {
      os << k << " = " << toml_value(field) << "\n";
    });
  }
  return os.str();
}

void resolve_skippipe_nodes(Config& c) {
  auto resolve = [](ParallelConfig& g, const std::string& key) {
    if (g.skippipe_setting.empty() || g.skippipe_nodes != 0) return;
    std::ifstream in(g.skippipe_setting);
    if (!in) {
      throw InputError("config: " + key + ".skippipe_setting = '" + g.skippipe_setting +
                       "': cannot read the file (paths are read from the working directory)");
    }
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json j =
        parse_json(text.str(), "config: " + key + ".skippipe_setting = '" + g.skippipe_setting + "'");
    if (!j.is_object() || !j.contains("nodes") || !j["nodes"].is_array()) {
      throw InputError("config: " + key + ".skippipe_setting = '" + g.skippipe_setting +
                       "': no \"nodes\" array (a SkipPipe setting, docs/skippipe.md)");
    }
    g.skippipe_nodes = static_cast<int64_t>(j["nodes"].size());
  };
  resolve(c.parallel, "parallel");
  for (auto& l : c.parallel_learners) resolve(l.parallel, "parallel.learner[id = " + std::to_string(l.id) + "]");
}

void validate_parallel(const Config& c) {
  validate_group(c, c.parallel, "parallel");
  for (const auto& l : c.parallel_learners) {
    validate_group(c, l.parallel, "parallel.learner[id = " + std::to_string(l.id) + "]");
    // dp averages every rank's gradients with the same rank of every other learner (docs/parallel.md
    // "Baselines over learner groups"): every learner must shard its state the same way.
    require(c.diloco.mode != Mode::kDp || l.parallel == c.parallel, "parallel.learner[id = " + std::to_string(l.id) + "]",
            "differs from [parallel]: diloco.mode = \"dp\" averages gradients rank by rank across the learners, so "
            "every learner needs the same group (drop the [[parallel.learner]] tables, or use diloco, streaming or "
            "decoupled)");
  }
}

void validate_skippipe(const Config& c) {
  const SkipConfig& k = c.skippipe;
  require(k.stages >= 0, "skippipe.stages", "(S) must be ≥ 0 (0 = off)");
  require(k.full_depth_every >= 0, "skippipe.full_depth_every", "must be ≥ 0 (0 = never)");
  if (k.stages == 0) {
    require(k.skip == 0 && k.full_depth_every == 0, "skippipe.skip/full_depth_every",
            "need skippipe.stages (S ≥ 2): without stages every micro-batch runs the full depth");
    return;
  }
  require(k.stages >= 2 && c.model.n_layer % k.stages == 0, "skippipe.stages",
          "(S = " + std::to_string(k.stages) + ") must be ≥ 2 and divide model.n_layer (" +
              std::to_string(c.model.n_layer) + "): each stage holds n_layer / S blocks");
  require(k.skip >= 0 && k.skip < 1, "skippipe.skip", "(k) must be in [0, 1)");
  const int64_t keep = stages_per_path(k.stages, k.skip);
  require(keep >= 2, "skippipe.skip",
          "(k = " + std::to_string(k.skip) + ") leaves a path of round(S·(1 − k)) = " + std::to_string(keep) +
              " stage(s): a path must visit stage 0 and at least one other stage");
  // Every non-zero stage gets the same number of the step's micro-batches (docs/skippipe.md "Scheduling" 1).
  const int64_t visits = c.train.grad_accum * (keep - 1), others = k.stages - 1;
  const int64_t step = others / std::gcd(keep - 1, others);
  require(visits % others == 0, "train.grad_accum",
          "(" + std::to_string(c.train.grad_accum) + " micro-batches per step) gives " + std::to_string(visits) +
              " visits of the " + std::to_string(others) + " non-zero stages (" + std::to_string(keep - 1) +
              " per path): SkipPipe needs every stage visited equally, so train.grad_accum must be a multiple of " +
              std::to_string(step));
  auto one_process = [&](const ParallelConfig& g, const std::string& key) {
    require(g.ranks() == 1 && g.precision == Precision::kFp32, key,
            "is a group (or bf16): skippipe training runs in one-process fp32 learners for now (the multi-process "
            "pipeline is docs/skippipe.md \"What is not built yet\")");
  };
  one_process(c.parallel, "parallel");
  for (const auto& l : c.parallel_learners) one_process(l.parallel, "parallel.learner[id = " + std::to_string(l.id) + "]");
}

}  // namespace dloco::config_detail
