// restore_or_rewarm (learner/learner_setup.h): fresh moments in a warm run re-warm the lr; moments saved amid that
// re-warm (a joiner stopped a few steps after joining) continue it where it stopped instead of taking the full lr
// at once; moments saved after it, or of a learner that never re-warmed, are warm.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/config.h"
#include "learner/inner_job.h"
#include "learner/learner_setup.h"
#include "process/events.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

// Only what restore_or_rewarm calls: the saved state's step (−1: none) and the re-warms asked for.
class FakeJob : public InnerJob {
 public:
  explicit FakeJob(int64_t saved_at) : saved_at_(saved_at) {}
  InnerStep step(int64_t) override { return {}; }
  StreamCursor cursor() const override { return {}; }
  void replace_stream(DataStream) override {}
  void read_fragment(int, std::span<float>) override {}
  void write_fragment(int, std::span<const float>) override {}
  void save_state(const fs::path&, int64_t) override {}
  int64_t restore_state(const fs::path&, std::string*) override { return saved_at_; }
  void rewarm(int64_t from_step) override { rewarms.push_back(from_step); }
  std::vector<int64_t> rewarms;

 private:
  int64_t saved_at_;
};

TEST(Rewarm, AJoinerStoppedAmidItsRewarmContinuesItWhereItStopped) {
  const fs::path run = fs::temp_directory_path() / ("dloco_rewarm_" + std::to_string(::getpid()));
  fs::remove_all(run);
  Config c = parse_config("");
  c.train.warmup_steps = 50;
  c.train.learner_state_interval = 10;
  EventLog events;
  // Joins a warm run at global step 1000 with fresh moments: re-warm from 1000.
  FakeJob fresh(-1);
  restore_or_rewarm(c, fresh, run, 3, 1000, events);
  EXPECT_EQ(fresh.rewarms, std::vector<int64_t>{1000});
  // Stopped at step 1010, its moments saved (10 own steps), back when the run is at 1100: the re-warm goes on
  // from 1100 − 10, so its lr is that of its 11th own step, not the full lr.
  FakeJob young(1010);
  restore_or_rewarm(c, young, run, 3, 1100, events);
  EXPECT_EQ(young.rewarms, std::vector<int64_t>{1090});
  // Stopped again at 1120 (30 own steps since 1090), back at 1200: on from 1170.
  FakeJob again(1120);
  restore_or_rewarm(c, again, run, 3, 1200, events);
  EXPECT_EQ(again.rewarms, std::vector<int64_t>{1170});
  // Saved at 1300, past the re-warm's 50 steps (from 1170): warm, no re-warm.
  FakeJob warm(1300);
  restore_or_rewarm(c, warm, run, 3, 1400, events);
  EXPECT_TRUE(warm.rewarms.empty());
  // A learner that started with the run (no re-warm on record) is warm too, whatever its step.
  FakeJob original(5);
  restore_or_rewarm(c, original, run, 4, 30, events);
  EXPECT_TRUE(original.rewarms.empty());
  fs::remove_all(run);
}

}  // namespace
}  // namespace dloco
