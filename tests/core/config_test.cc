// Config: unknown keys and bad values are refused with the key named; overrides apply; TOML output round-trips;
// the parameter-count formula agrees with hand arithmetic.
#include "core/config.h"
#include "core/slowdown.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/check.h"

namespace dloco {
namespace {

std::string error_of(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(toml, overrides, "test.toml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreValid) {
  const Config c = parse_config("");
  EXPECT_EQ(c.diloco.learners, 4);
  EXPECT_EQ(c.diloco.inner_steps % c.diloco.fragments, 0);
}

TEST(Config, UnknownKeyIsNamedWithItsSection) {
  const auto msg = error_of("[train]\nlearning_rate = 1e-3\n");
  EXPECT_NE(msg.find("unknown key 'learning_rate' in [train]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("test.toml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lr"), std::string::npos) << "lists the known keys: " << msg;
}

TEST(Config, UnknownSectionAndWrongTypeAndSyntax) {
  EXPECT_NE(error_of("[trian]\nlr = 1\n").find("unknown section [trian]"), std::string::npos);
  EXPECT_NE(error_of("[train]\nlr = \"fast\"\n").find("'train.lr' must be a number"), std::string::npos);
  EXPECT_NE(error_of("[train\nlr = 1\n").find("TOML syntax error"), std::string::npos);
}

TEST(Config, OptionsAreParsedOnceIntoTheirChoicesAndSavedByName) {
  const std::string bad = error_of("[diloco]\nmode = \"async\"\n");
  EXPECT_NE(bad.find("'diloco.mode' must be \"local\", \"decoupled\", \"dp\", \"diloco\", \"streaming\" (got \"async\")"),
            std::string::npos) << bad;
  EXPECT_NE(bad.find(":2"), std::string::npos) << "the error does not give the line: " << bad;
  const Config c = parse_config("[diloco]\nmode = \"streaming\"\nweights = \"uniform\"\n[run]\n", {"diloco.wire_up=bf16"});
  EXPECT_EQ(c.diloco.mode, Mode::kStreaming);
  EXPECT_EQ(c.diloco.weights, WeightRule::kUniform);
  EXPECT_EQ(c.diloco.wire_up, WireDtype::kBf16);
  const nlohmann::json j = to_json(c);
  EXPECT_EQ(j["diloco"]["mode"], "streaming");
  EXPECT_EQ(j["run"]["recovery"], "stop");
  EXPECT_NE(to_toml(c).find("wire_up = 'bf16'"), std::string::npos) << to_toml(c);
  EXPECT_EQ(parse_config(to_toml(c)).diloco.wire_up, WireDtype::kBf16);  // round trip through the saved file
  EXPECT_EQ(parse_config("[diloco]\n", {"diloco.wire_down=q4"}).diloco.wire_down, WireDtype::kQ4);
  const std::string renamed = error_of("[diloco]\nwire_dtype = \"q4\"\n");  // the field's earlier name
  EXPECT_NE(renamed.find("renamed: it is diloco.wire_up now"), std::string::npos) << renamed;
}

TEST(Config, RangeChecksNameTheKey) {
  EXPECT_NE(error_of("[diloco]\ninner_steps = 10\nfragments = 4\n").find("diloco.inner_steps"), std::string::npos);
  EXPECT_NE(error_of("[diloco]\nquorum = 5\n").find("diloco.quorum"), std::string::npos);
  EXPECT_NE(error_of("[model]\nd_model = 100\nn_head = 3\n").find("model.n_head"), std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"huge\"\n").find("unknown model preset 'huge'"), std::string::npos);
  EXPECT_NE(error_of("[diloco]\nmerge = \"median\"\n").find("diloco.merge"), std::string::npos);
  // More data streams than learners (room for joiners) needs the shared budget: a fixed share per stream would
  // leave the streams nobody leases untrained.
  EXPECT_NE(error_of("[data]\nstreams = 6\n").find("train.shared_budget"), std::string::npos);
  EXPECT_EQ(error_of("[data]\nstreams = 6\n[train]\nshared_budget = true\n"), "");
  EXPECT_NE(error_of("[diloco]\nbootstrap = \"peer\"\n").find("diloco.bootstrap"), std::string::npos);
  for (const char* name : {"..", ".", "a/b", ""}) {  // the run folder must stay inside run.out_dir
    EXPECT_NE(error_of(std::string("[run]\nname = \"") + name + "\"\n").find("run.name"), std::string::npos) << name;
  }
}

TEST(Config, ABudgetBelowOneStepPerLearnerIsRefusedAndCompleteTokensAreWholeSteps) {
  // small preset: B·T·grad_accum = 8·128 = 1024 tokens a step. 2048 tokens over M = 4 learners is half a step each:
  // before this check such a run "finished" with 0 tokens in 0 steps.
  const std::string bad = error_of("[train]\nbatch_size = 8\ntotal_tokens = 2048\n[diloco]\nlearners = 4\n");
  EXPECT_NE(bad.find("train.total_tokens"), std::string::npos) << bad;
  EXPECT_NE(bad.find("less than one step (B·T·grad_accum = 1024 tokens): it must be at least 4096"), std::string::npos)
      << bad;
  EXPECT_NE(error_of("[train]\nbatch_size = 8\ntotal_tokens = 2048\n[diloco]\nmode = \"dp\"\nlearners = 4\n").find("workers"),
            std::string::npos);
  EXPECT_EQ(error_of("[train]\nbatch_size = 8\ntotal_tokens = 2048\n[diloco]\nmode = \"local\"\n"), "");  // one stream, 2 steps
  // M = 0 in a decoupled run (was a SIGFPE dividing the budget by M) and an infinite rate are refused by name.
  EXPECT_NE(error_of("[diloco]\nlearners = 0\n").find("diloco.learners"), std::string::npos);
  // Found by fuzz/config.cc: M = 18,101,810 was taken after seconds of checking; ids are < 65536 on the wire.
  EXPECT_NE(error_of("[diloco]\nlearners = 18101810\n").find("[1, 65536]"), std::string::npos);
  // Found by fuzz/config.cc (UBSan): B·T·grad_accum overflowed int64 before any bound on B was checked.
  EXPECT_NE(error_of("[train]\nbatch_size = 444444444444444444\n").find("train.batch_size"), std::string::npos);
  EXPECT_NE(error_of("[train]\ngrad_accum = 4611686018427387904\n").find("train.grad_accum"), std::string::npos);
  EXPECT_NE(error_of("[model]\nseq_len = 4611686018427387904\n").find("model.seq_len"), std::string::npos);
  EXPECT_NE(error_of("[train]\nlr = inf\n").find("train.lr"), std::string::npos);
  // Found by a new user's probes: an infinite init_std trained to NaN and wrote a manifest that could not be read
  // back; d_model = 0 reached LibTorch; τ ≥ H silently mismatched merges and rounds; a float in an integer field
  // out of int64's range was cast (UB). Every number must be finite and every size positive.
  EXPECT_NE(error_of("[model]\ninit_std = inf\n").find("'model.init_std' must be a finite number"), std::string::npos);
  EXPECT_NE(error_of("[run]\nrestart_delay_s = nan\n").find("'run.restart_delay_s' must be a finite number"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nd_model = 0\n").find("model.d_model"), std::string::npos);
  EXPECT_NE(error_of("[diloco]\ninner_steps = 12\nfragments = 4\noverlap = 12\n").find("diloco.overlap"), std::string::npos);
  EXPECT_EQ(error_of("[diloco]\ninner_steps = 12\nfragments = 4\noverlap = 11\n"), "");
  EXPECT_NE(error_of("[train]\ntotal_tokens = 1e300\n").find("'train.total_tokens' must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of("[diloco]\nouter_lr = inf\n").find("diloco.outer_lr"), std::string::npos);
  // Screening (docs/protocol.md §10): 0 turns a ratio off; below 1 would refuse the median itself; clip below screen.
  EXPECT_NE(error_of("[diloco]\nscreen_ratio = 0.5\n").find("diloco.screen_ratio"), std::string::npos);
  EXPECT_NE(error_of("[diloco]\nscreen_ratio = nan\n").find("diloco.screen_ratio"), std::string::npos);
  EXPECT_NE(error_of("[diloco]\nclip_ratio = 20\n").find("diloco.clip_ratio"), std::string::npos);
  EXPECT_EQ(error_of("[diloco]\nscreen_ratio = 0\nclip_ratio = 20\n"), "");
  // topk keeps one value in D of each chunk, D in [2, 1024] (transport/sparse_codec.h)
  EXPECT_NE(error_of("[diloco]\ntopk_density = 1\n").find("diloco.topk_density"), std::string::npos);
  EXPECT_NE(error_of("[diloco]\ntopk_density = 2048\n").find("diloco.topk_density"), std::string::npos);
  EXPECT_EQ(error_of("[diloco]\ntopk_density = 2\n"), "");
  EXPECT_EQ(error_of("[diloco]\ntopk_density = 1024\n"), "");
  // docs/protocol.md §12: the secret travels as a bearer token; TLS files come as a set.
  EXPECT_NE(error_of("[run]\nsecret = \"has space\"\n").find("run.secret"), std::string::npos);
  EXPECT_NE(error_of("[run]\nsecret = \"tab\\there\"\n").find("run.secret"), std::string::npos);
  EXPECT_NE(error_of("[run]\ntls_ca = \"ca.pem\"\n").find("run.tls_cert"), std::string::npos);
  EXPECT_NE(error_of("[run]\ntls_mutual = true\n").find("run.tls_mutual"), std::string::npos);
  EXPECT_EQ(error_of("[run]\nsecret = \"s3cret-0K\"\ntls_ca = \"a\"\ntls_cert = \"b\"\ntls_key = \"c\"\n"), "");
  EXPECT_EQ(error_of("[diloco]\nclip_ratio = 3\n"), "");
  EXPECT_EQ(error_of("[train]\nbatch_size = 8\ntotal_tokens = 2048\nshared_budget = true\n[diloco]\nlearners = 4\n"), "");
  // Each of the 4 streams trains ⌊10000 / 4 / 1024⌋ = 2 whole steps.
  EXPECT_EQ(parse_config("[train]\nbatch_size = 8\ntotal_tokens = 10000\n[diloco]\nlearners = 4\n").complete_tokens(), 4 * 2 * 1024);
  EXPECT_EQ(parse_config("[train]\nbatch_size = 8\ntotal_tokens = 10000\n[diloco]\nmode = \"local\"\n").complete_tokens(), 9 * 1024);
  // A shared budget: the learners stop once their sum reaches it; up to one step each may be in flight.
  EXPECT_EQ(parse_config("[train]\nbatch_size = 8\ntotal_tokens = 10000\nshared_budget = true\n").complete_tokens(), 10000 - 4 * 1024);
  // dp's group stops before a step that would pass the budget: any total above budget − one step of M workers is
  // whole, also one that an elastic generation of 3 of the 4 workers left at no multiple of 4 steps.
  EXPECT_EQ(parse_config("[train]\nbatch_size = 8\ntotal_tokens = 10000\n[diloco]\nmode = \"dp\"\n").complete_tokens(),
            10000 - 4 * 1024 + 1);
}

TEST(Config, PathsResolveAgainstTheConfigFileAndOverridesAgainstTheWorkingDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dloco_config_paths_" + std::to_string(::getpid())) / "conf";
  fs::create_directories(dir);
  std::ofstream(dir / "run.toml") << "[data]\ndir = \"../data/kjv\"\n[run]\nout_dir = \"/abs/runs\"\n";
  const Config c = load_config(dir / "run.toml");
  EXPECT_EQ(c.data.dir, (dir.parent_path() / "data" / "kjv").string());  // relative to the file
  EXPECT_EQ(c.run.out_dir, "/abs/runs");                                // absolute stays
  const Config o = load_config(dir / "run.toml", {"data.dir=mine", "run.out_dir=out"});
  EXPECT_EQ(o.data.dir, (fs::current_path() / "mine").string());  // an override: relative to the working directory
  EXPECT_EQ(o.run.out_dir, (fs::current_path() / "out").string());
  std::ofstream(dir / "bare.toml") << "[train]\nlr = 1e-3\n";  // defaults: relative to the working directory
  EXPECT_EQ(load_config(dir / "bare.toml").run.out_dir, (fs::current_path() / "runs").string());
  EXPECT_EQ(parse_config("[data]\ndir = \"rel\"\n").data.dir, "rel") << "text without a file stays as written";
  const std::string folder = [&] {
    try {
      load_config(dir);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(folder.find("is a folder: give a TOML file"), std::string::npos) << folder;
  fs::remove_all(dir.parent_path());
}

TEST(Config, PresetThenKeysThenOverrides) {
  const Config c = parse_config("[model]\npreset = \"tiny\"\nn_layer = 3\n[run]\nname = \"a\"\n",
                                {"model.d_model=64", "run.name=bare_word", "train.total_tokens=2e6"});
  EXPECT_EQ(c.model.preset, "tiny");
  EXPECT_EQ(c.model.n_layer, 3);   // file key over preset
  EXPECT_EQ(c.model.d_model, 64);  // override over file
  EXPECT_EQ(c.model.seq_len, 32);  // from the preset
  EXPECT_EQ(c.run.name, "bare_word");
  EXPECT_EQ(c.train.total_tokens, 2000000);
  EXPECT_NE(error_of("", {"lr=1"}).find("section.key=value"), std::string::npos);
  // The override is named, without the line number of the two-line table it is parsed as.
  EXPECT_EQ(error_of("", {"train.lr=abc"}), "override 'train.lr=abc': 'train.lr' must be a number");
}

TEST(Config, TomlRoundTrip) {
  const Config a = parse_config("[model]\npreset = \"tiny\"\n[train]\nlr = 3.5e-4\n[run]\nname = \"x y\"\n");
  const Config b = parse_config(to_toml(a));
  EXPECT_EQ(to_json(a), to_json(b));
}

TEST(Config, ParameterCountFormulaByHand) {
  ModelConfig m = model_preset("small");  // V=4096, C=128, L=4, F=round_up(341.3, 64)=384, tied
  EXPECT_EQ(m.ff_dim(), 384);
  const int64_t per_layer = 4 * 128 * 128 + 3 * 128 * 384 + 2 * 128;  // 65536 + 147456 + 256
  EXPECT_EQ(gpt_parameter_count(m), 4096 * 128 + 4 * per_layer + 128);
  m.tie_embeddings = false;
  EXPECT_EQ(gpt_parameter_count(m), 2 * 4096 * 128 + 4 * per_layer + 128);
  const ModelConfig big = model_preset("base-124m");
  EXPECT_GT(gpt_parameter_count(big), 110'000'000);
  EXPECT_LT(gpt_parameter_count(big), 135'000'000);
}

TEST(Config, BaselineModesFixWhatTheMethodFixes) {
  const Config d = parse_config("[diloco]\nmode = \"diloco\"\nlearners = 3\nfragments = 4\ninner_steps = 8\n"
                                "overlap = 2\nquorum = 1\nmerge = \"rda\"\n");
  EXPECT_EQ(d.diloco.fragments, 1);  // the whole model at once
  EXPECT_EQ(d.diloco.overlap, 0);
  EXPECT_EQ(d.diloco.quorum, 3);     // every worker joins every sync
  EXPECT_FALSE(d.diloco.grace_window);
  EXPECT_EQ(d.diloco.merge, MergeRule::kMean);
  const Config s = parse_config("[diloco]\nmode = \"streaming\"\nfragments = 4\ninner_steps = 8\noverlap = 2\n");
  EXPECT_EQ(s.diloco.fragments, 4);  // streaming keeps P and τ
  EXPECT_EQ(s.diloco.overlap, 2);
  const Config dec = parse_config("[diloco]\nmode = \"decoupled\"\nquorum = 1\n");
  EXPECT_EQ(dec.diloco.quorum, 1);   // the decoupled mode is left alone
  const auto msg = error_of("[diloco]\nmode = \"allreduce\"\n");
  EXPECT_NE(msg.find("diloco.mode"), std::string::npos) << msg;
  EXPECT_NE(msg.find("streaming"), std::string::npos) << msg;  // lists what is accepted
}

TEST(Config, SlowdownListNamesBadEntries) {
  RunSettings run;
  run.slowdown = "3:1.18, 1:1.5";
  EXPECT_DOUBLE_EQ(slowdown_factor(run, 3, 4), 1.18);
  EXPECT_DOUBLE_EQ(slowdown_factor(run, 1, 4), 1.5);
  EXPECT_DOUBLE_EQ(slowdown_factor(run, 0, 4), 1.0);
  run.slowdown = "";
  EXPECT_DOUBLE_EQ(slowdown_factor(run, 0, 4), 1.0);
  EXPECT_NE(error_of("[run]\nslowdown = \"3-1.18\"\n").find("'3-1.18' must look like ID:FACTOR"), std::string::npos);
  EXPECT_NE(error_of("[run]\nslowdown = \"9:1.2\"\n").find("outside [0, M = 4)"), std::string::npos);
  EXPECT_NE(error_of("[run]\nslowdown = \"1:0.5\"\n").find("must be ≥ 1"), std::string::npos);
  // Per-step variance: ID:FACTOR~SD, seeded, never below the step's own compute.
  run.slowdown = "2:3.54~0.1,0:3";
  const SlowdownSpec spec = slowdown_spec(run, 2, 4);
  EXPECT_DOUBLE_EQ(spec.factor, 3.54);
  EXPECT_DOUBLE_EQ(spec.sd, 0.1);
  EXPECT_DOUBLE_EQ(slowdown_spec(run, 0, 4).sd, 0.0);
  StepSlowdown a(spec, 7, 2), b(spec, 7, 2), c(spec, 8, 2);
  double sum = 0, sum2 = 0, differs = 0;
  constexpr int kSteps = 4000;
  for (int i = 0; i < kSteps; ++i) {
    const double x = a.next();
    EXPECT_DOUBLE_EQ(x, b.next()) << "not reproducible at step " << i;
    differs += x != c.next();
    sum += x;
    sum2 += x * x;
  }
  const double mean = sum / kSteps, sd = std::sqrt(sum2 / kSteps - mean * mean);
  EXPECT_NEAR(mean, 3.54, 0.02);
  EXPECT_NEAR(sd / mean, 0.1, 0.01);
  EXPECT_GT(differs, kSteps * 0.99) << "another seed gave the same steps";
  run.slowdown = "*:3~0.1, 2:3.54";  // "*": every learner not listed, joiners (ids ≥ M) too
  EXPECT_DOUBLE_EQ(slowdown_spec(run, 2, 4).factor, 3.54);
  EXPECT_DOUBLE_EQ(slowdown_spec(run, 2, 4).sd, 0.0);
  EXPECT_DOUBLE_EQ(slowdown_spec(run, 0, 4).factor, 3.0);
  EXPECT_DOUBLE_EQ(slowdown_spec(run, 0, 4).sd, 0.1);
  EXPECT_DOUBLE_EQ(slowdown_spec(run, 17, 4).factor, 3.0);
  StepSlowdown floor({1.0, 0.5}, 1, 0);
  for (int i = 0; i < 200; ++i) EXPECT_GE(floor.next(), 1.0) << "a step faster than its compute";
  for (const char* bad : {"1:2~1.5", "1:2~-0.1", "1:2~x", "1:2x", "1~2:0.1", "*x:2", "**:2", "*:0.5"}) {
    const std::string msg = error_of("[run]\nslowdown = \"" + std::string(bad) + "\"\n");
    EXPECT_NE(msg.find("run.slowdown"), std::string::npos) << bad << ": " << msg;
  }
}

TEST(Slowdown, StretchesTheSteadyComputeNotASpike) {
  // An emulated chip F times slower takes F times a steady step: a cold first step or a burst of another process on
  // the emulating machine is not stretched F times (a joiner's cold first step at F = 12 took 3.7 s, issue 32).
  SteadyCompute steady(3);
  EXPECT_EQ(steady.base(0.5), 0.0) << "a first step has no steady time: no sleep";
  EXPECT_DOUBLE_EQ(steady.base(0.10), 0.10);  // min(0.10, median {0.5})
  EXPECT_DOUBLE_EQ(steady.base(0.11), 0.11);  // median {0.10, 0.5} = 0.5 (the upper), its own is less
  EXPECT_DOUBLE_EQ(steady.base(0.90), 0.11);  // a spike: the median of {0.10, 0.11, 0.5}
  EXPECT_DOUBLE_EQ(steady.base(0.12), 0.11);  // the window is {0.10, 0.11, 0.90}
  EXPECT_DOUBLE_EQ(steady.base(0.95), 0.12);  // {0.11, 0.90, 0.12}: one spike in the window does not lead
  EXPECT_DOUBLE_EQ(steady.base(0.96), 0.90);  // {0.90, 0.12, 0.95}: a machine that stays slower is followed
  EXPECT_DOUBLE_EQ(steady.base(0.97), 0.95);  // {0.12, 0.95, 0.96}
  StepSlowdown slow({3.0, 0.0}, 1, 0);  // the sleep after each step: (F − 1) × the steady compute
  EXPECT_EQ(slow.sleep_after(0.5), 0.0);
  EXPECT_DOUBLE_EQ(slow.sleep_after(0.1), 0.2);
  EXPECT_DOUBLE_EQ(slow.sleep_after(0.1, 5.0), 0.4) << "a slow_learner fault's larger factor wins";
}

}  // namespace
}  // namespace dloco
