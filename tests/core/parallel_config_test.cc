// The [parallel] section and [[parallel.learner]] tables: defaults, per-learner groups that start from
// [parallel], round-trips through TOML and JSON, and refusals that name the key and the reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "core/config.h"

namespace dloco {
namespace {

std::string error_of(const std::string& toml) {
  try {
    parse_config(toml, {}, "test.toml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const char* kTiny = "[model]\npreset = \"tiny\"\n[diloco]\nlearners = 2\ninner_steps = 4\nfragments = 2\n";

TEST(ParallelConfig, DefaultIsOneRankPerLearner) {
  const Config c = parse_config(kTiny);
  EXPECT_EQ(c.parallel.ranks(), 1);
  EXPECT_EQ(c.parallel_for(0).ranks(), 1);
  EXPECT_TRUE(c.parallel_learners.empty());
}

TEST(ParallelConfig, LearnerTablesStartFromTheSectionAndRoundTrip) {
  const Config c = parse_config(std::string(kTiny) +
                                "[parallel]\ntensor = 2\ntimeout_s = 30\n"
                                "[[parallel.learner]]\nid = 1\ntensor = 1\ndata = 2\nzero = 2\n");
  EXPECT_EQ(c.parallel_for(0).tensor, 2);
  EXPECT_EQ(c.parallel_for(1).tensor, 1);
  EXPECT_EQ(c.parallel_for(1).data, 2);
  EXPECT_EQ(c.parallel_for(1).zero, 2);
  EXPECT_EQ(c.parallel_for(1).timeout_s, 30) << "a learner table starts from [parallel]";
  EXPECT_EQ(c.parallel_for(7).tensor, 2) << "an unlisted id gets [parallel]";
  const Config back = parse_config(to_toml(c));
  EXPECT_EQ(to_json(back), to_json(c));
  ASSERT_EQ(back.parallel_learners.size(), 1u);
  EXPECT_EQ(back.parallel_learners[0].parallel, c.parallel_learners[0].parallel);
  EXPECT_EQ(to_json(c)["parallel"]["learner"][0]["zero"], 2);
}

TEST(ParallelConfig, RefusalsNameTheKeyAndWhy) {
  const std::string t = kTiny;
  EXPECT_EQ(error_of(t + "[parallel]\ntensor = 2\ndata = 2\n"), "") << "TP × DP is supported";
  EXPECT_EQ(error_of(t + "[parallel]\ntensor = 2\npipeline = 2\ndata = 2\nzero = 1\n"), "")
      << "Megatron's layout: TP × PP × DP with the distributed optimizer";
  EXPECT_NE(error_of(t + "[parallel]\ntensor = 2\ndata = 2\nzero = 2\n").find("= 2 with tensor = 2 is not built"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\npipeline = 2\ndata = 2\nzero = 3\n").find("DeepSpeed refuses"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\npipeline = 2\ndata = 2\nzero = 1\noffload = true\n")
                .find("parallel.offload is wired into ZeRO groups without pipelines only"),
            std::string::npos);
  const std::string untied = "[model]\npreset = \"tiny\"\ntie_embeddings = false\n[diloco]\nlearners = 2\n";
  EXPECT_EQ(error_of(untied + "[parallel]\nprecision = \"bf16\"\ntensor = 2\ndata = 2\nzero = 3\n"
                              "offload = true\ncheckpoint_activations = true\n"),
            "")
      << "ZeRO-3 × TP (FSDP × TP) in bf16, offloaded, checkpointed";
  EXPECT_EQ(error_of(untied + "[parallel]\nprecision = \"bf16\"\ndata = 2\nzero = 3\n"), "") << "bf16 ZeRO-3";
  EXPECT_NE(error_of(t + "[parallel]\nprecision = \"bf16\"\ndata = 2\nzero = 2\n").find("not with ZeRO-2"),
            std::string::npos);
  EXPECT_EQ(error_of(t + "[parallel]\ntensor = 2\npipeline = 2\n"), "") << "tensor × pipeline is supported";
  EXPECT_NE(error_of(t + "[parallel]\nzero = 2\n").find("parallel.zero shards over the data-parallel ranks"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\ndata = 2\nzero = 3\n").find("tie_embeddings = false"), std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\ndata = 2\nzero = 4\n").find("parallel.zero must be 0, 1, 2 or 3"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\ntensor = 3\n").find("parallel.tensor (3) must divide model.n_head"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\npipeline = 3\n").find("must not exceed model.n_layer (2)"), std::string::npos);
  EXPECT_EQ(error_of(t + "[parallel]\nprecision = \"bf16\"\ntensor = 2\npipeline = 2\ndata = 2\nzero = 1\n"), "")
      << "Megatron's layout in bf16";
  EXPECT_EQ(error_of(t + "[parallel]\nprecision = \"bf16\"\ndata = 2\nzero = 1\n"), "")
      << "the distributed optimizer in a purely data-parallel bf16 group";
  EXPECT_EQ(error_of(t + "[parallel]\nprecision = \"bf16\"\n"), "") << "a one-process bf16 learner";
  EXPECT_NE(error_of(t + "[parallel]\nprecision = \"fp16\"\n").find("fp16 matmul does not exist"), std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\noffload = true\n").find("set data > 1 and zero ≥ 1"), std::string::npos);
  EXPECT_EQ(error_of(t + "[parallel]\ndata = 2\nzero = 1\noffload = true\n"), "");
  EXPECT_NE(error_of(t + "[parallel]\nschedule = \"zigzag\"\n").find("\"gpipe\", \"1f1b\", \"interleaved\""),
            std::string::npos);
  const std::string dp = "[model]\npreset = \"tiny\"\n[diloco]\nmode = \"dp\"\nlearners = 2\n";
  EXPECT_EQ(error_of(dp + "[parallel]\ntensor = 2\n"), "") << "the baselines run over learner groups";
  EXPECT_NE(error_of(dp + "[parallel]\ntensor = 2\n[[parallel.learner]]\nid = 1\ntensor = 1\ndata = 2\n")
                .find("every learner needs the same group"),
            std::string::npos);
  const std::string diloco = "[model]\npreset = \"tiny\"\n[diloco]\nmode = \"diloco\"\nlearners = 2\n";
  EXPECT_EQ(error_of(diloco + "[parallel]\ntensor = 2\n[[parallel.learner]]\nid = 1\ntensor = 1\ndata = 2\n"), "")
      << "diloco exchanges whole fragments: its learners' groups may differ";
  EXPECT_NE(error_of("[model]\npreset = \"tiny\"\n[diloco]\nmode = \"local\"\n[parallel]\ntensor = 2\n")
                .find("runs one-process learners only"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[[parallel.learner]]\ntensor = 2\n").find("needs an id"), std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\ntensor = 2\n[run]\ndevice = \"cuda\"\n").find("runs on the CPU only"),
            std::string::npos);
  try {
    parse_config(t + "[[parallel.learner]]\nid = 1\n", {"parallel.tensor=2"}, "test.toml");
    ADD_FAILURE() << "an override of [parallel] beside [[parallel.learner]] tables is refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("would not reach them"), std::string::npos) << e.what();
  }
  EXPECT_NE(error_of(t + "[[parallel.learner]]\nid = 1\ntensr = 2\n").find("unknown key 'tensr' in [[parallel.learner]]"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[[parallel.learner]]\nid = 1\n[[parallel.learner]]\nid = 1\n").find("a second"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[[parallel.learner]]\nid = 1\npipeline = 2\nmicro_batches = 3\n")
                .find("parallel.learner[id = 1].micro_batches (3) must divide each replica's share of train.batch_size"),
            std::string::npos);
}

// A SkipPipe learner ([[parallel.learner]] skippipe_setting / skippipe_schedule): its group has one rank per node
// of the setting (counted when the config is read; the files' full check is skippipe/pipeline_check.h's), it
// round-trips, and what it cannot be combined with is refused naming the key.
TEST(ParallelConfig, ASkipPipeLearnerHasOneRankPerNodeAndRefusesWhatItIsNot) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dloco_skippipe_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "setting.json") << R"({"nodes": [{}, {}, {}]})";
  std::ofstream(dir / "bad.json") << R"({"nodes": 3})";
  const std::string setting = (dir / "setting.json").string();
  const std::string t = kTiny;
  const std::string learner = "[[parallel.learner]]\nid = 1\nskippipe_setting = \"" + setting +
                              "\"\nskippipe_schedule = \"s.json\"\n";
  const Config c = parse_config(t + learner);
  EXPECT_EQ(c.parallel_for(0).ranks(), 1);
  EXPECT_EQ(c.parallel_for(1).ranks(), 3) << "one rank per node of the setting";
  EXPECT_TRUE(c.parallel_for(1).skippipe());
  const Config back = parse_config(to_toml(c));
  EXPECT_EQ(back.parallel_for(1), c.parallel_for(1));
  EXPECT_EQ(to_json(c)["parallel"]["learner"][0]["skippipe_schedule"], "s.json");

  EXPECT_NE(error_of(t + "[parallel]\nskippipe_schedule = \"s.json\"\n").find("go together"), std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\nskippipe_setting = \"" + setting + "\"\n").find("go together"),
            std::string::npos);
  EXPECT_NE(error_of(t + learner + "tensor = 2\n").find("tensor, pipeline, data, micro_batches must be 1"),
            std::string::npos);
  EXPECT_NE(error_of(t + learner + "skippipe_link_scale = -1.0\n").find("skippipe_link_scale must be finite"),
            std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\nskippipe_compute_scale = 0.5\n").find("apply to a SkipPipe learner only"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"tiny\"\n[diloco]\nmode = \"diloco\"\nlearners = 2\n" + learner)
                .find("runs in diloco.mode = \"decoupled\""),
            std::string::npos);
  EXPECT_NE(error_of(t + "[parallel]\nskippipe_setting = \"/nonexistent/x.json\"\nskippipe_schedule = \"s\"\n")
                .find("parallel.skippipe_setting = '/nonexistent/x.json': cannot read"),
            std::string::npos);
  EXPECT_EQ(error_of(t + "[parallel]\nskippipe_setting = \"/nonexistent/x.json\"\nskippipe_schedule = \"s\"\n"
                         "skippipe_nodes = 4\n"),
            "")
      << "a config written out carries the node count and needs no file (a checkpoint read elsewhere)";
  EXPECT_NE(error_of(t + "[parallel]\nskippipe_setting = \"" + (dir / "bad.json").string() +
                     "\"\nskippipe_schedule = \"s\"\n")
                .find("no \"nodes\" array"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(SkipConfig, OffByDefaultRoundTripsAndRefusalsNameTheKey) {
  const std::string six = "[model]\npreset = \"tiny\"\nn_layer = 6\n";
  EXPECT_EQ(parse_config(six).skippipe.stages, 0);
  const Config c = parse_config(six + "[train]\ngrad_accum = 5\n[skippipe]\nstages = 6\nskip = 0.34\nfull_depth_every = 10\n");
  EXPECT_EQ(c.skippipe, (SkipConfig{6, 0.34, 10}));
  EXPECT_EQ(parse_config(to_toml(c)).skippipe, c.skippipe);
  EXPECT_EQ(to_json(c)["skippipe"]["stages"], 6);
  // 4 micro-batches × 3 non-zero stages per path = 12 visits cannot cover 5 stages equally; 5 can.
  EXPECT_NE(error_of(six + "[train]\ngrad_accum = 4\n[skippipe]\nstages = 6\nskip = 0.34\n")
                .find("train.grad_accum must be a multiple of 5"),
            std::string::npos);
  EXPECT_NE(error_of(six + "[skippipe]\nstages = 4\n").find("skippipe.stages (S = 4) must be ≥ 2 and divide"),
            std::string::npos);
  EXPECT_NE(error_of(six + "[skippipe]\nskip = 0.5\n").find("need skippipe.stages"), std::string::npos);
  EXPECT_NE(error_of(six + "[skippipe]\nstages = 6\nskip = 0.9\n").find("at least one other stage"),
            std::string::npos);
  EXPECT_NE(error_of(six + "[skippipe]\nstages = 6\nskip = 1\n").find("skippipe.skip (k) must be in [0, 1)"),
            std::string::npos);
  const std::string group = error_of(six + "[diloco]\nmode = \"decoupled\"\n[train]\nbatch_size = 4\ngrad_accum = 5\n[skippipe]\nstages = 6\nskip = 0.34\n"
                                           "[parallel]\ndata = 2\n");
  EXPECT_NE(group.find("one-process fp32 learners"), std::string::npos) << group;
  EXPECT_EQ(error_of(six + "[skippipe]\nstages = 3\n"), "") << "skip 0: every path is the full depth";
}

}  // namespace
}  // namespace dloco
