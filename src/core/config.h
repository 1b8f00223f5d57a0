// The one configuration of a dloco run: model, data, inner training, Decoupled DiLoCo (outer) and run
// settings, each field with its default and unit. Loaded from TOML; unknown keys and out-of-range values
// are errors (InputError naming the key); the resolved config is printed and saved with every checkpoint.
// Symbols follow docs/protocol.md §2 (M, H, P, τ, K, γ, η, μ).
// Deliberately not here: flags of single commands (those live in src/apps).
#pragma once

#include <cstdint>
#include <array>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/merge.h"

namespace dloco {

/// Decoder-only transformer shape (RMSNorm, rotary positions, SwiGLU). Named presets: "tiny" (tests),
/// "small" (the demo), "base-124m" (real hardware). Parameter count: see gpt_parameter_count().
struct ModelConfig {
  std::string preset = "small";  // preset the fields below started from
  int64_t vocab_size = 4096;     // V: tokenizer vocabulary, tokens
  int64_t seq_len = 128;         // T: context length, tokens
  int64_t n_layer = 4;           // L: transformer blocks
  int64_t n_head = 4;            // NH: attention heads (d_model must be a multiple)
  int64_t d_model = 128;         // C: residual width
  int64_t d_ff = 0;              // F: SwiGLU hidden width; 0 = round_up(8/3·C, 64)
  bool tie_embeddings = true;    // output head shares the token embedding (V×C)
  double rope_theta = 10000.0;   // rotary base
  double norm_eps = 1e-5;        // RMSNorm epsilon
  double init_std = 0.02;        // normal init std; output projections scaled by 1/sqrt(2L)

  /// The SwiGLU width actually used (resolves d_ff = 0).
  int64_t ff_dim() const;
};

/// Checks a model shape; throws InputError naming the offending model.* key.
void validate_model(const ModelConfig& m);

/// Returns the named preset ("tiny", "small", "base-124m"); throws InputError for an unknown name.
ModelConfig model_preset(const std::string& name);

/// Closed-form parameter count of the model (no biases anywhere):
/// V·C·(tied ? 1 : 2) + L·(4C² + 3·C·F + 2C) + C.
int64_t gpt_parameter_count(const ModelConfig& m);

/// Training FLOPs per token (forward + backward): 6·N_matmul + 12·L·T·C for attention scores and values
/// (the PaLM/llm.c convention), where N_matmul excludes the embedding lookup but includes the output head.
double gpt_flops_per_token(const ModelConfig& m);

/// How a data stream's batch windows are laid over the train split (data.order; src/data/stream.h).
enum class DataOrder { kContiguous, kShuffled };

/// Where the tokenized corpus lives (written by `dloco data prepare`).
struct DataConfig {
  std::string dir = "data/kjv";  // folder with tokenizer.model, train_*.bin, val_*.bin, meta.json
  int64_t streams = 0;           // S data streams the train split is cut into; 0 = one per learner (S = M)
  // contiguous: stream s is the s-th of S contiguous ranges, read in order (a learner trains one stretch of text
  // after the other); shuffled: stream s owns every S-th row slot of T tokens of the whole split and reads them in a
  // permutation keyed by (stream, epoch), each row of a batch from its own slot (each stream samples all the text;
  // src/data/stream.h). Either way a token is read at most once an epoch (contiguous: a tail shorter than a batch is
  // dropped; shuffled: the n_s mod B slots the permutation puts last).
  DataOrder order = DataOrder::kContiguous;
};

/// The inner optimisation a learner runs (AdamW, warmup + cosine), docs/protocol.md §2 "inner".
struct TrainConfig {
  int64_t batch_size = 16;       // B: sequences per micro-batch
  int64_t grad_accum = 1;        // micro-batches per optimizer step
  int64_t total_tokens = 2000000;// token budget of the whole run (all learners), tokens
  bool shared_budget = false;    // decoupled: false = each learner slot trains total/M tokens; true = the learners
                                 // share the budget and the syncer ends training when their sum reaches it, so a
                                 // slot that was down or slow leaves its share to the others (chaos runs, docs/protocol.md §7)
  double lr = 2e-3;              // peak inner learning rate
  int64_t warmup_steps = 50;     // steps
  double min_lr_ratio = 0.1;     // cosine floor as a fraction of lr
  double weight_decay = 0.1;     // AdamW decoupled weight decay
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;        // global-norm clip; 0 disables
  int64_t eval_interval = 100;   // global steps between evaluations of the global model; 0 = only at the end
  int64_t eval_tokens = 0;       // validation tokens per evaluation; 0 = the whole validation split
  int64_t checkpoint_interval = 200;  // steps between checkpoints; 0 = only at the end
  int64_t learner_state_interval = 100;  // decoupled: steps between a learner's local saves of its AdamW state
                                         // (run_dir/learners/learner_<id>/); a restarted learner resumes it; 0 = off
  int64_t log_interval = 10;     // steps between console rows

  /// Tokens in one optimizer step of one learner: B·T·grad_accum.
  int64_t tokens_per_step(const ModelConfig& m) const { return batch_size * m.seq_len * grad_accum; }
};

/// The choices of the config's option fields, parsed once into enums (names as in the files, on the command line
/// and in JSON). A name outside the list is an error that names the key, the file:line and the choices.
enum class Mode { kLocal, kDecoupled, kDp, kDiloco, kStreaming };
enum class WeightRule { kTokens, kUniform };
enum class StalePolicy { kReanchor, kSkip };
enum class WireDtype { kFp32, kBf16, kQ8, kQ4, kTopK };
enum class Bootstrap { kSyncer, kPeers };
enum class RecoveryPolicy { kStop, kRestart, kElastic };
enum class PipelineScheduleChoice { kGPipe, k1F1B, kInterleaved };
enum class Precision { kFp32, kBf16 };

template <class E>
struct Choices;
#define DLOCO_CHOICES(E, N, ...)                                                 \
  template <>                                                                    \
  struct Choices<E> {                                                            \
    static constexpr std::array<std::pair<E, const char*>, N> all = {{__VA_ARGS__}}; \
  };
DLOCO_CHOICES(Mode, 5, {Mode::kLocal, "local"}, {Mode::kDecoupled, "decoupled"}, {Mode::kDp, "dp"},
              {Mode::kDiloco, "diloco"}, {Mode::kStreaming, "streaming"})
DLOCO_CHOICES(DataOrder, 2, {DataOrder::kContiguous, "contiguous"}, {DataOrder::kShuffled, "shuffled"})
DLOCO_CHOICES(MergeRule, 2, {MergeRule::kRda, "rda"}, {MergeRule::kMean, "mean"})
DLOCO_CHOICES(WeightRule, 2, {WeightRule::kTokens, "tokens"}, {WeightRule::kUniform, "uniform"})
DLOCO_CHOICES(StalePolicy, 2, {StalePolicy::kReanchor, "reanchor"}, {StalePolicy::kSkip, "skip"})
DLOCO_CHOICES(WireDtype, 5, {WireDtype::kFp32, "fp32"}, {WireDtype::kBf16, "bf16"}, {WireDtype::kQ8, "q8"},
              {WireDtype::kQ4, "q4"}, {WireDtype::kTopK, "topk"})
DLOCO_CHOICES(Bootstrap, 2, {Bootstrap::kSyncer, "syncer"}, {Bootstrap::kPeers, "peers"})
DLOCO_CHOICES(RecoveryPolicy, 3, {RecoveryPolicy::kStop, "stop"}, {RecoveryPolicy::kRestart, "restart"}, {RecoveryPolicy::kElastic, "elastic"})
DLOCO_CHOICES(PipelineScheduleChoice, 3, {PipelineScheduleChoice::kGPipe, "gpipe"}, {PipelineScheduleChoice::k1F1B, "1f1b"},
              {PipelineScheduleChoice::kInterleaved, "interleaved"})
DLOCO_CHOICES(Precision, 2, {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"})
#undef DLOCO_CHOICES

template <class E>
concept ConfigChoice = requires { Choices<E>::all; };

/// The name of a choice ("dp", "rda", ...).
template <ConfigChoice E>
const char* to_string(E e) {
  for (const auto& [value, name] : Choices<E>::all) {
    if (value == e) return name;
  }
  return "?";
}
/// The choice named `name`, if any.
template <ConfigChoice E>
std::optional<E> parse_choice(std::string_view name) {
  for (const auto& [value, n] : Choices<E>::all) {
    if (name == n) return value;
  }
  return std::nullopt;
}
/// "\"a\", \"b\"" for error messages.
template <ConfigChoice E>
std::string choice_names() {
  std::string out;
  for (const auto& [value, name] : Choices<E>::all) out += (out.empty() ? "\"" : ", \"") + std::string(name) + "\"";
  return out;
}
template <ConfigChoice E>
void to_json(nlohmann::json& j, const E& e) {
  j = to_string(e);
}

/// Decoupled DiLoCo's outer loop, docs/protocol.md §2–§8.
struct DilocoConfig {
  // "local": one process, no syncer. "decoupled": the spine (syncer + M learners that never wait).
  // Baselines (docs/protocol.md §11), M worker processes over c10d/Gloo that all wait for each other:
  // "dp": gradients all-reduced every step; "diloco": H inner steps, then a blocking all-reduce of the whole
  // model's outer gradients (P = 1 and τ = 0 are forced); "streaming": P fragments on the staggered schedule,
  // all-reduce started at u and awaited at u + τ. The baselines set quorum = M, grace_window = false and
  // merge = "mean" when the config is parsed (every worker joins every sync; RDA is decoupled-only).
  Mode mode = Mode::kDecoupled;
  int64_t learners = 4;            // M
  int64_t inner_steps = 24;        // H: steps between two syncs of the same fragment
  int64_t fragments = 24;          // P: parameter fragments (H must be a multiple of P)
  int64_t overlap = 2;             // τ: steps between a pull and the apply of its merge
  int64_t quorum = 1;              // K: minimum learners reporting before a merge
  bool grace_window = true;        // adaptive grace window on/off (§5)
  double gamma = 0.5;              // γ: grace-window safety margin, 0 < γ < 1
  double outer_lr = 0.7;           // η
  double outer_momentum = 0.9;     // μ (Nesterov)
  MergeRule merge = MergeRule::kRda;        // "rda" | "mean" (§6)
  WeightRule weights = WeightRule::kTokens;  // "tokens" (tokens²/steps) | "uniform"
  bool split_large_tensors = true; // row-block split of tensors larger than total/P (§8)
  double alpha = 0.0;              // mixing on receive: θ ← α·θ + (1−α)·Θ
  StalePolicy stale_policy = StalePolicy::kReanchor;  // "reanchor" | "skip"
  int64_t anchor_versions = 2;     // versions of each fragment the syncer keeps for re-anchoring
  WireDtype wire_up = WireDtype::kFp32;    // learner → syncer, the outer gradients Δ: "fp32" | "bf16" | "q8" (int8,
                                           // blocks of 256) | "q4" (int4, blocks of 64) | "topk" (the largest 1/D of
                                           // each chunk of 4096 values, D = topk_density, 2 bits each; with
                                           // error feedback): transport/codec.h
  WireDtype wire_down = WireDtype::kFp32;  // syncer → learners, merged fragments: "fp32" sends Θ_p; the others send
                                           // the outer update U with Θ_p := Θ_p^prev + Û (docs/protocol.md §9)
  bool error_feedback = false;     // both directions: what quantization dropped is added to the next Δ (learner)
                                   // or U (syncer) of that fragment
  double error_feedback_decay = 1.0;  // β in (0, 1]: the carried error is β·e before it is added (SparseLoCo: 0.95);
                                      // 1 = the sum of what was sent tracks the sum of the inputs
  int64_t topk_density = 64;       // "topk": one value of D kept per chunk (64: 1.56%; 16: 6.25%), D in [2, 1024]
  double screen_ratio = 10;        // decoupled: an answer whose outer gradient per unit of inner lr (‖Δ‖ / Σ lr over its
                                   // steps) reaches this multiple of
                                   // the (lower) median of its round's other answers and the fragment's recent
                                   // merged answers is refused (docs/protocol.md §10); 0 = off
  double clip_ratio = 0;           // decoupled: an answer above this multiple (and below screen_ratio) is scaled
                                   // down to it instead of merged as is; 0 = off
  int64_t refetch_after = 3;       // decoupled: a learner whose answers were refused this many times in a row (any
                                   // kind, no merged answer between) is sent Θ whole, to replace its parameters
                                   // (docs/protocol.md §10); 0 = off
  bool blocking = false;           // decoupled only: learners wait at each due step for the pull and at s + τ for
                                   // the merge (a synchronous configuration, for equivalence tests and ablations)
  Bootstrap bootstrap = Bootstrap::kSyncer;  // where a (re)starting learner takes Θ from (§7): "syncer", or "peers": every
                                   // learner serves its copy, and a joiner takes each fragment from a live peer
                                   // that holds the syncer's version, falling back to the next peer, then the syncer
};

/// Learner ids are in [0, kMaxLearnerId): the launcher starts 0 … M−1; learners joining a running job
/// (scavenging, docs/protocol.md §7) may take any other id in the range.
inline constexpr int kMaxLearnerId = 65536;

/// Process and run settings.
struct RunSettings {
  std::string name = "run";        // run id; also the run folder name under out_dir
  std::string out_dir = "runs";    // parent folder of run folders
  uint64_t seed = 1234;            // model init and data order
  std::string device = "cpu";      // torch device string ("cpu", "cuda", "cuda:1")
  int64_t threads = 0;             // CPU threads for the whole run on this machine; 0 = all cores
  std::string secret = "";         // the run's shared secret: a bearer token on every call (docs/protocol.md §12);
                                   // env DLOCO_SECRET overrides when set. Printable ASCII, no spaces, ≤ 256 bytes
  std::string tls_cert = "";       // TLS (docs/protocol.md §12): this process's certificate chain (PEM file), presented
                                   // by its servers (syncer, peer server, monitor) and, under tls_mutual, by its
                                   // clients. tls_cert, tls_key and tls_ca: all three or none (scripts/make-certs.sh)
  std::string tls_key = "";        // its private key (PEM file)
  std::string tls_ca = "";         // the run's CA certificate (PEM file) that signed every process's certificate
  bool tls_mutual = false;         // servers also require and verify the caller's certificate (its name is logged)
  bool insecure = false;           // allow servers off loopback without TLS and a secret (warned); CLI --insecure
  bool trusted_network = false;    // allow Gloo groups (learner groups, baseline workers, SkipPipe nodes) that meet
                                   // over a TCP store or off loopback: neither is authenticated or encrypted (Gloo
                                   // 1.13 has no TLS; docs/protocol.md §11), so only on a network nobody else reaches
  std::string syncer_address = "127.0.0.1:0";  // syncer listen address; port 0 = pick a free one
  std::string peer_host = "";      // diloco.bootstrap = "peers": where each learner's peer server listens (a free
                                   // port): "" = this machine's address on the route to the syncer (127.0.0.1 for a
                                   // syncer on loopback), "0.0.0.0" = every interface, or one address
  std::string peer_advertise = ""; // the host a learner's peers dial: "" = peer_host, or for a wildcard or empty
                                   // peer_host this machine's address on the route to the syncer
  std::string monitor = "127.0.0.1:0";  // the syncer's HTTP endpoint: /metrics (Prometheus), /status.json and the
                                        // dashboard at /; port 0 = a free one (printed; run_dir/monitor.url); "" = off
  std::string learner_monitor = "127.0.0.1:0";  // each learner's /metrics endpoint (port 0 = a free one); "" = off
  double restart_delay_s = 2.0;    // the launcher restarts a learner that died after this delay; < 0 = never
  double report_interval_s = 5.0;  // seconds between the launcher's console rows
  std::string slowdown = "";       // heterogeneous learners: "ID:FACTOR,…", e.g. "3:1.18" makes learner/worker 3
                                   // sleep 0.18× its step time after every step (emulates slower hardware)
  double collective_timeout_s = 120;  // baselines: deadline of the Gloo rendezvous and of every collective, s
  RecoveryPolicy recovery = RecoveryPolicy::kStop;  // dp only: what the launcher does when a worker dies. "stop": the run ends;
                                   // "restart": every worker stops and the full group restarts from the last
                                   // checkpoint once the dead worker is back; "elastic" (torchelastic): the
                                   // survivors re-form at once without it from the last checkpoint, and the group
                                   // re-forms again with it when it is back (docs/protocol.md §11, chaos)
};

/// The slowdown factor of learner `id` from run.slowdown (1 when not listed). Throws InputError on a malformed
/// list (names the entry), a factor < 1, or an id outside [0, M).
double slowdown_factor(const RunSettings& run, int id, int64_t learners);

/// True for the modes whose workers synchronise through collectives (dp, diloco, streaming).
bool is_collective_mode(Mode mode);

/// Inside one learner (docs/parallel.md): the learner is a group of R = t·p·d ranks
/// in Megatron's layout (tensor-parallel ranks adjacent, pipeline outermost). The syncer still sees one learner.
/// R = 1 (the default) is today's one-process learner.
struct ParallelConfig {
  int64_t tensor = 1;              // t: Megatron tensor parallelism (attention by heads, MLP column → row)
  int64_t pipeline = 1;            // p: pipeline stages (blocks split contiguously over p·chunks virtual stages)
  int64_t data = 1;                // d: data-parallel ranks inside the learner (each B/d of every micro-batch)
  int64_t zero = 0;                // ZeRO stage over the d ranks: 0 (replicated AdamW), 1 (+ optimizer state
                                   // sharded), 2 (+ gradients), 3 (+ parameters; needs model.tie_embeddings = false)
  int64_t micro_batches = 1;       // m: pipeline micro-batches per micro-batch of train.batch_size (B % m == 0)
  PipelineScheduleChoice schedule = PipelineScheduleChoice::k1F1B;  // "gpipe" | "1f1b" | "interleaved"
  int64_t chunks = 1;              // v: model chunks per stage ("interleaved" only)
  Precision precision = Precision::kFp32;  // "fp32" | "bf16" (bf16 compute, fp32 masters and AdamW; with zero =
                                           // 0, 1 or 3, not 2); "fp16" is refused
  bool checkpoint_activations = false;     // recompute each block in backward (pipeline learners; ZeRO-3's units
                                           // always do, so it is accepted there too)
  bool offload = false;            // ZeRO's AdamW state (m, v; at zero = 3 also the fp32 slices, the masters) in
                                   // mapped files under run_dir/offload that each step streams through, out of the
                                   // ranks' resident memory (needs zero ≥ 1, no pipeline, with tensor only zero = 3)
  double timeout_s = 60;           // deadline of the group's collectives and of a rank's wait for its leader, s
  // A SkipPipe pipeline as the learner (docs/skippipe.md "A SkipPipe learner"): one rank per node of the setting,
  // micro-batches on the schedule's paths; both files set, or neither. Paths: relative to the config file.
  std::string skippipe_setting;    // the setting (nodes, regions, links: skippipe/setting.h)
  std::string skippipe_schedule;   // the schedule (placement and paths: skippipe/schedule.h)
  double skippipe_link_scale = 0;     // emulated links: a hop takes scale · its setting time (0 = off)
  double skippipe_compute_scale = 0;  // emulated compute: an operation lasts at least scale · its setting time
  int64_t skippipe_nodes = 0;      // the setting's node count: read from skippipe_setting when 0 (written out so a
                                   // saved config needs no file); must match the setting

  bool skippipe() const { return !skippipe_schedule.empty(); }
  /// R = t·p·d, or the SkipPipe setting's node count.
  int64_t ranks() const { return skippipe() ? skippipe_nodes : tensor * pipeline * data; }
  bool operator==(const ParallelConfig&) const = default;
};

/// SkipPipe training inside a one-process learner (docs/skippipe.md "Training with skips"): every micro-batch of a
/// step runs stage 0 and a subset of the other stages (its path), each non-zero stage is visited by the same number
/// of the step's micro-batches, and a stage's gradients are averaged over the micro-batches that visited it.
/// stages = 0 (the default) trains the full depth as before.
struct SkipConfig {
  int64_t stages = 0;              // S: the model's blocks cut into S stages of model.n_layer / S; 0 = off
  double skip = 0.0;               // k: a path visits round(S·(1 − k)) stages, stage 0 included
  int64_t full_depth_every = 0;    // every n-th step runs every stage for every micro-batch; 0 = never
  bool operator==(const SkipConfig&) const = default;
};

/// A learner whose group differs from [parallel]: `[[parallel.learner]]` tables in the file, each with an `id`
/// and the keys it changes (it starts from the [parallel] section as the file wrote it).
struct ParallelLearner {
  int64_t id = 0;
  ParallelConfig parallel;
};

/// A whole run's configuration.
struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  DilocoConfig diloco;
  RunSettings run;
  SkipConfig skippipe;
  ParallelConfig parallel;                       // every learner's group, unless listed below
  std::vector<ParallelLearner> parallel_learners;  // per-learner groups

  /// The group of learner `id`: its [[parallel.learner]] entry, else [parallel].
  const ParallelConfig& parallel_for(int64_t id) const;

  /// Checks ranges and cross-field rules; throws InputError naming the offending key.
  void validate() const;
  /// The run folder: out_dir/name.
  std::filesystem::path run_dir() const { return std::filesystem::path(run.out_dir) / run.name; }
  /// Data streams the budget is split over with fixed shares: data.streams (0 = M) when decoupled, M workers for the
  /// baselines, 1 locally.
  int64_t budget_streams() const;
  /// Tokens a run that trains its whole budget reaches: each of the budget_streams() trains
  /// ⌊total_tokens / S / (B·T·grad_accum)⌋ whole steps; with train.shared_budget the learners stop once their sum
  /// reaches the budget, so the budget less one step per learner (those in flight); the baselines' group (dp,
  /// diloco, streaming) stops when its next step would pass the budget, more than the budget less one step of M
  /// workers (after an elastic generation of fewer workers the group's total is not a multiple of M steps). A run
  /// that ends below it is "incomplete".
  int64_t complete_tokens() const;
};

/// Parses TOML text into a Config. Each `key=value` in `overrides` (e.g. "train.lr=1e-3") is applied after
/// the file. A `[model] preset = NAME` first loads the preset, then the other [model] keys override it.
/// With a non-empty `file_dir`, the config's paths (data.dir, run.out_dir, the SkipPipe files) become absolute:
/// those the text sets resolve against `file_dir` (the config file's folder), defaults and overrides against the
/// working directory; with an empty one they stay as written.
/// Throws InputError on a TOML syntax error (with line), an unknown section or key, or a wrong value type.
Config parse_config(const std::string& toml_text, const std::vector<std::string>& overrides = {},
                    const std::string& source_name = "config", const std::filesystem::path& file_dir = {});

/// Reads and parses a TOML file, its paths resolved against the file's folder (parse_config). Throws InputError if
/// the path is missing, is a folder, or cannot be read.
Config load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});

/// The resolved config as JSON (every field, defaults included), for manifests and reports.
nlohmann::json to_json(const Config& c);
/// The resolved config as TOML text that parse_config() reads back to the same Config.
std::string to_toml(const Config& c);

}  // namespace dloco
