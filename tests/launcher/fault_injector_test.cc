// The fault injector against real processes (`sleep`), without a run: which faults fire at which tick, and what
// happens to one whose target the plan has just killed.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chaos/fault_plan.h"
#include "launcher/fault_injector.h"
#include "process/events.h"
#include "support/tiny_corpus.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A process that lives until it is killed, in its own process group (the injector signals the group).
pid_t start_sleeper() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::execlp("sleep", "sleep", "600", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  return pid;
}

bool reaped_as_killed(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

std::vector<json> launcher_events(const fs::path& path, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : dloco::testing_support::read_events(path)) {
    if (e["event"] == name) out.push_back(e);
  }
  return out;
}

class FaultInjectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dloco_injector_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(FaultInjectorTest, TwoKillsDueAtOnceKillTwoIncarnationsNotOneProcessTwice) {
  // A global step that jumps past two planned kills of learner 0 (as after a syncer's restart): the first kills
  // the running process; the second waits for the next incarnation instead of "killing" a dying one again.
  const auto plan = dloco::parse_fault_plan(
      "[[fault]]\nat_step = 380\naction = \"kill_learner\"\nlearner = 0\nrestart_after_s = 0.2\n"
      "[[fault]]\nat_step = 440\naction = \"kill_learner\"\nlearner = 0\nrestart_after_s = 0.2\n"
      "[[fault]]\nat_step = 450\naction = \"kill_learner\"\nlearner = 0\nrestart_after_s = -1\n",
      "test plan");
  const fs::path log = dir_ / "launcher.jsonl";
  std::vector<dloco::Child> children(1);
  {
    dloco::EventLog events(log, dloco::Role::kLauncher, 0);
    dloco::FaultInjector injector(plan.events, dir_, events);
    children[0].role = "learner 0";
    children[0].learner = 0;
    children[0].pid = start_sleeper();
    const pid_t first = children[0].pid;

    injector.tick(1.0, 448, false, children);  // both of the first two are due
    EXPECT_TRUE(reaped_as_killed(first));
    children[0].exited = true;  // reaped, as the launcher does
    ASSERT_EQ(launcher_events(log, "fault").size(), 1u);
    EXPECT_EQ(launcher_events(log, "fault")[0]["at_step"], 380);
    EXPECT_TRUE(injector.planned_kill(children[0]));

    injector.tick(1.2, 449, false, children);  // still the dead process: nothing more
    EXPECT_EQ(launcher_events(log, "fault").size(), 1u);
    EXPECT_TRUE(launcher_events(log, "fault_skipped").empty());

    children[0].pid = start_sleeper();  // the launcher restarts it
    children[0].exited = false;
    injector.restarted(children[0]);
    const pid_t second = children[0].pid;
    injector.tick(1.5, 449, false, children);
    EXPECT_TRUE(reaped_as_killed(second));
    children[0].exited = true;
    const auto fired = launcher_events(log, "fault");
    ASSERT_EQ(fired.size(), 2u);
    EXPECT_EQ(fired[1]["at_step"], 440);
    EXPECT_EQ(fired[1]["pid"], second);

    // The third is due at 450, but its target is still down (not restarted) when the run ends: it is reported
    // as skipped, not as injected.
    injector.tick(2.0, 460, false, children);
    EXPECT_EQ(launcher_events(log, "fault").size(), 2u);
    EXPECT_EQ(injector.injected(), 2);
    injector.release(children, 3.0);
  }
  const auto skipped = launcher_events(log, "fault_skipped");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0]["at_step"], 450);
  EXPECT_NE(skipped[0]["reason"].get<std::string>().find("down"), std::string::npos);
}

TEST_F(FaultInjectorTest, ALeaveDueWhileItsLearnerIsDownIsNotDeferred) {
  // A leave is not a fault of the next incarnation: due while the learner is down after a kill, it makes the
  // learner leave for good at once (the launcher does not restart it).
  const auto plan = dloco::parse_fault_plan(
      "[[fault]]\nat_step = 10\naction = \"kill_learner\"\nlearner = 0\nrestart_after_s = 5\n"
      "[[fault]]\nat_step = 11\naction = \"leave_learner\"\nlearner = 0\n",
      "test plan");
  dloco::EventLog events(dir_ / "launcher.jsonl", dloco::Role::kLauncher, 0);
  dloco::FaultInjector injector(plan.resolve(1), dir_, events);
  injector.set_scavenging(true);
  std::vector<dloco::Child> children(1);
  children[0].role = "learner 0";
  children[0].learner = 0;
  children[0].pid = start_sleeper();
  injector.tick(1.0, 10, false, children);
  EXPECT_TRUE(reaped_as_killed(children[0].pid));
  children[0].exited = true;
  injector.tick(1.2, 11, false, children);
  EXPECT_TRUE(injector.left(children[0]));
  EXPECT_EQ(injector.injected(), 2);
}

}  // namespace
