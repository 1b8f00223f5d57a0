// The `dloco` command line as a new user meets it (issue 15, "CLI and paths"), against the real binary:
// `--version` names the version and the commit; bare `dloco` lists the commands; a typo gets the nearest command
// suggested; `--config` must be a file and `--resume` a run folder, each refused with what was wrong; a config's
// paths resolve against the config file's folder, so a run starts from any working directory and its folder stores
// them absolute; a run folder carries its tokenizer, so a copy of it can be sampled after the corpus is gone; and
// `--temperature 0` is greedy (the same text whatever the seed); `dloco config` prints the resolved config or one
// field (what scripts/slurm/dloco.sbatch reads), hides the secret, and refuses a field that does not exist; a Slurm
// job's tasks map to learners and ranks, and a misplaced task is refused.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/tiny_corpus.h"

namespace {

namespace fs = std::filesystem;
namespace testing_support = dloco::testing_support;

const std::string kDloco = std::string(DLOCO_BINARY_DIR) + "/bin/dloco";
const std::string kDataTool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";

struct Result {
  int exit = -1;
  std::string output;  // stdout and stderr
};

// Runs a shell command line; returns its exit status and output.
Result run(const std::string& command) {
  const fs::path out = fs::temp_directory_path() / ("dloco_cli_out_" + std::to_string(::getpid()));
  const int rc = std::system((command + " > " + out.string() + " 2>&1").c_str());
  std::ifstream in(out);
  Result r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1,
           {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()}};
  fs::remove(out);
  return r;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing_support::make_tiny_corpus("dloco_cli", kDataTool);
    ASSERT_FALSE(root_.empty()) << "dloco-data prepare failed on the tiny corpus";
  }
  static void TearDownTestSuite() { testing_support::remove_unless_kept(root_); }
  static fs::path root_;
};
fs::path CliTest::root_;

TEST_F(CliTest, VersionNamesTheCommitAndBareDlocoListsTheCommands) {
  const Result version = run(kDloco + " --version");
  EXPECT_EQ(version.exit, 0) << version.output;
  EXPECT_NE(version.output.find("dloco 0.1.0 (commit "), std::string::npos) << version.output;
  EXPECT_EQ(version.output.find("commit unknown"), std::string::npos) << "built from a checkout: " << version.output;
  const Result bare = run(kDloco);
  EXPECT_EQ(bare.exit, 2);
  for (const char* command : {"train", "data", "compare", "generate", "syncer", "learner"}) {
    EXPECT_NE(bare.output.find(std::string("  ") + command + " "), std::string::npos) << command << ":\n"
                                                                                  << bare.output;
  }
}

TEST_F(CliTest, ATypoGetsTheNearestCommand) {
  const Result typo = run(kDloco + " trian --config x.toml");
  EXPECT_EQ(typo.exit, 2);
  EXPECT_NE(typo.output.find("'trian' is not a command. Did you mean 'train'?"), std::string::npos) << typo.output;
  const Result far = run(kDloco + " frobnicate");
  EXPECT_EQ(far.exit, 2);
  EXPECT_NE(far.output.find("'frobnicate' is not a command"), std::string::npos) << far.output;
  EXPECT_EQ(far.output.find("Did you mean"), std::string::npos) << "nothing is near 'frobnicate': " << far.output;
}

TEST_F(CliTest, AnUnknownFlagOrAMissingValueIsAUsageErrorExitingTwo) {
  // CLI11's own codes (109 for an extra argument, 106 for a bad value, …) are not what a script expects: every
  // usage error is 2, with CLI11's message; --help stays 0.
  for (const char* args : {" train --no-such-flag", " train --config", " sim goodput --chips many",
                           " skippipe schedule --nodes", " data --no-such-flag", " data prepare --kjv --bogus 1",
                           " data encode --no-such-flag"}) {
    const Result r = run(kDloco + args);
    EXPECT_EQ(r.exit, 2) << args << ":\n" << r.output;
    EXPECT_FALSE(r.output.empty()) << args;
  }
  const Result flag = run(kDloco + " train --no-such-flag");
  EXPECT_NE(flag.output.find("--no-such-flag"), std::string::npos) << flag.output;
  EXPECT_NE(flag.output.find("dloco train --help"), std::string::npos) << "say where the options are: " << flag.output;
  const Result help = run(kDloco + " train --help");
  EXPECT_EQ(help.exit, 0) << help.output;
}

TEST_F(CliTest, ConfigPrintsTheResolvedConfigOrOneFieldAndHidesTheSecret) {
  const std::string demo = std::string(DLOCO_SOURCE_DIR) + "/configs/demo.toml";
  const Result mode = run(kDloco + " config --config " + demo + " diloco.mode");
  EXPECT_EQ(mode.exit, 0) << mode.output;
  EXPECT_EQ(mode.output, "decoupled\n");
  const Result set = run(kDloco + " config --config " + demo + " --set 'diloco.mode=\"dp\"' --set train.lr=0.5 train.lr");
  EXPECT_EQ(set.output, "0.5\n");
  EXPECT_EQ(run(kDloco + " config --config " + demo + " --set 'diloco.mode=\"dp\"' diloco.mode").output, "dp\n");
  const Result whole = run(kDloco + " config --config " + demo + " --set 'run.secret=\"hush-42\"'");
  EXPECT_EQ(whole.exit, 0) << whole.output;
  EXPECT_NE(whole.output.find("[model]"), std::string::npos) << whole.output;
  EXPECT_NE(whole.output.find("<set>"), std::string::npos) << whole.output;
  EXPECT_EQ(whole.output.find("hush-42"), std::string::npos) << "the secret was printed";
  for (const char* field : {"diloco.nope", "diloco", "nope.mode"}) {
    const Result bad = run(kDloco + " config --config " + demo + " " + field);
    EXPECT_EQ(bad.exit, 2) << field;
    EXPECT_NE(bad.output.find("no config field '" + std::string(field) + "'"), std::string::npos) << bad.output;
  }
}

// A Slurm job's tasks (scripts/slurm/dloco.sbatch): `dloco config --learners-for-tasks N` resolves M for N tasks (the
// learners whose ranks fill them; a baseline: N workers) and refuses a count that splits a group; `dloco learner
// --task-hosts` refuses a task Slurm placed elsewhere, a SLURM_PROCID outside the list, a missing SLURM_PROCID, a
// port out of range, and --group-port alone.
TEST_F(CliTest, ASlurmJobsTasksAreTheLearnersRanksAndAMisplacedTaskIsRefused) {
  const std::string demo = std::string(DLOCO_SOURCE_DIR) + "/configs/demo.toml";
  // demo.toml's K = 4 needs M ≥ 4: 8 tasks of 2-rank learners pass, 6 are checked with M = 3 and refused.
  const std::string config = kDloco + " config --config " + demo + " --set parallel.data=2 --learners-for-tasks ";
  EXPECT_EQ(run(config + "8").output, "4\n");
  const Result small = run(config + "6");
  EXPECT_EQ(small.exit, 2) << small.output;
  EXPECT_NE(small.output.find("diloco.quorum"), std::string::npos) << small.output;
  EXPECT_NE(small.output.find("M = 3"), std::string::npos) << small.output;
  const std::string k1 = kDloco + " config --config " + demo + " --set parallel.data=2 --set diloco.quorum=1 "
                         "--learners-for-tasks ";
  EXPECT_EQ(run(k1 + "6").output, "3\n");
  EXPECT_EQ(run(k1 + "6 diloco.learners").output, "3\n");
  EXPECT_EQ(run(k1 + "4 diloco.mode").output, "decoupled\n");
  const Result split = run(k1 + "5");
  EXPECT_EQ(split.exit, 2) << split.output;
  EXPECT_NE(split.output.find("ranks are 2 + 2 + 2 = 6 (give the job 4 or 6 tasks)"), std::string::npos)
      << split.output;
  EXPECT_EQ(run(config + "5 --set 'diloco.mode=\"dp\"'").output, "5\n") << "a baseline: one worker per task";
  const std::string learner = "env -u SLURM_CPUS_PER_TASK " + kDloco + " learner --config " + demo +
                              " --set parallel.data=2 --set diloco.quorum=1 --syncer 127.0.0.1:1"
                              " --task-hosts nodeA,nodeB";
  struct Case {
    std::string env, flags, says;
  };
  for (const Case& c : std::vector<Case>{
           {"SLURM_PROCID=1 SLURMD_NODENAME=nodeC", " --group-port 40000",
            "Slurm placed task 1 on nodeC, not on nodeB"},
           {"SLURM_PROCID=2", " --group-port 40000", "SLURM_PROCID = 2 is not one of the 2 tasks"},
           {"SLURM_PROCID=-1", " --group-port 40000", "SLURM_PROCID = -1 is not one of the 2 tasks"},
           {"", " --group-port 40000", "--task-hosts needs SLURM_PROCID"},
           {"SLURM_PROCID=1", " --group-port 40000 --id 3", "--task-hosts places this task itself"},
           {"SLURM_PROCID=1", " --group-port 0", "needs a port in [1, 65535]"}}) {
    const Result r = run("env -u SLURM_PROCID " + c.env + " " + learner + c.flags);
    EXPECT_EQ(r.exit, 2) << c.env << c.flags << ": " << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.env << c.flags << ": " << r.output;
  }
  const Result port = run(kDloco + " learner --config " + demo + " --syncer 127.0.0.1:1 --id 0 --group-port 40000");
  EXPECT_EQ(port.exit, 2) << port.output;
  EXPECT_NE(port.output.find("--group-port goes with --task-hosts"), std::string::npos) << port.output;
}

TEST_F(CliTest, AFolderAsConfigAndAMissingRunFolderAreRefusedWithWhatWasWrong) {
  const Result folder = run(kDloco + " train --config " + root_.string());
  EXPECT_EQ(folder.exit, 2);
  EXPECT_NE(folder.output.find("is a folder: give a TOML file"), std::string::npos) << folder.output;
  EXPECT_FALSE(fs::exists(root_ / "runs")) << "a default job was started";
  const Result missing = run(kDloco + " train --config " + (root_ / "nope.toml").string());
  EXPECT_EQ(missing.exit, 2);
  EXPECT_NE(missing.output.find("does not exist"), std::string::npos) << missing.output;
  const Result resume = run(kDloco + " train --resume " + (root_ / "runs" / "nope").string());
  EXPECT_EQ(resume.exit, 2);
  EXPECT_NE(resume.output.find("no such run folder"), std::string::npos) << resume.output;
}

TEST_F(CliTest, PathsResolveAgainstTheConfigFileAndACopiedRunFolderCanBeSampled) {
  // The config lives in root/conf/ and names its data and run folders relative to itself.
  fs::create_directories(root_ / "conf");
  std::ofstream(root_ / "conf" / "local.toml")
      << "[model]\npreset = \"tiny\"\nvocab_size = 400\n[data]\ndir = \"../data\"\n"
      << "[train]\nbatch_size = 4\ntotal_tokens = 2560\neval_interval = 0\ncheckpoint_interval = 0\n"
      << "[diloco]\nmode = \"local\"\n[run]\nname = \"elsewhere\"\nout_dir = \"../runs\"\nthreads = 1\n";
  // Started from another working directory: the paths do not depend on it.
  const fs::path cwd = root_ / "somewhere" / "else";
  fs::create_directories(cwd);
  const Result train = run("cd " + cwd.string() + " && " + kDloco + " train --config ../../conf/local.toml");
  ASSERT_EQ(train.exit, 0) << train.output;
  const fs::path run_dir = root_ / "runs" / "elsewhere";
  ASSERT_TRUE(fs::exists(run_dir / "report.json")) << train.output;
  std::ifstream saved_file(run_dir / "config.toml");
  const std::string saved((std::istreambuf_iterator<char>(saved_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(saved.find("dir = '" + (root_ / "data").string() + "'"), std::string::npos) << saved;
  EXPECT_TRUE(fs::exists(run_dir / "tokenizer.model")) << "the run folder does not carry its tokenizer";

  // A copy of the run folder, sampled after the corpus (and its tokenizer) moved away.
  fs::copy(run_dir, root_ / "copied", fs::copy_options::recursive);
  fs::rename(root_ / "data", root_ / "data.away");
  const std::string generate = kDloco + " generate " + (root_ / "copied").string() + " --tokens 12 --temperature 0";
  const Result a = run(generate + " --seed 1"), b = run(generate + " --seed 2");
  fs::rename(root_ / "data.away", root_ / "data");
  ASSERT_EQ(a.exit, 0) << a.output;
  EXPECT_EQ(a.output, b.output) << "temperature 0 is greedy: the seed must not matter";
  EXPECT_NE(a.output.find("And God said"), std::string::npos) << a.output;
  const Result sampled = run(kDloco + " generate " + (root_ / "copied").string() + " --tokens 12 --seed 3");
  EXPECT_EQ(sampled.exit, 0) << sampled.output;
  // A count that would run for hours (its text comes out at the end) is refused at once.
  const Result huge = run(kDloco + " generate " + (root_ / "copied").string() + " --tokens 99999999999");
  EXPECT_EQ(huge.exit, 2) << huge.output;
  EXPECT_NE(huge.output.find("--tokens must be in [1, 100000]"), std::string::npos) << huge.output;
}

}  // namespace
