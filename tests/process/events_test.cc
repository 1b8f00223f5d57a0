// Structured events: one JSON object per line with the common schema, from several threads at once.
#include "process/events.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "core/check.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

fs::path fresh_file(const char* name) {
  const fs::path path = fs::temp_directory_path() / (std::string(name) + "_" + std::to_string(::getpid()) + ".jsonl");
  fs::remove(path);
  return path;
}

TEST(EventLog, WritesTheSchemaOneLinePerEvent) {
  const fs::path path = fresh_file("dloco_events_schema");
  const double before =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    EventLog log(path, Role::kSyncer, 0);
    EXPECT_TRUE(log.enabled());
    log.emit("quorum_reached", {{"fragment", 3}, {"step", 48}, {"reason", "quorum 1/1 reached"}});
    log.emit("started");
    // Readable while the log is still open: every line is flushed.
    EXPECT_EQ(read_lines(path).size(), 2u);
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["role"], "syncer");
  EXPECT_EQ(lines[0]["id"], 0);
  EXPECT_EQ(lines[0]["event"], "quorum_reached");
  EXPECT_EQ(lines[0]["fragment"], 3);
  EXPECT_EQ(lines[0]["reason"], "quorum 1/1 reached");
  EXPECT_GE(lines[0]["t"].get<double>(), before - 1.0);
  EXPECT_LE(lines[0]["t"].get<double>(), before + 60.0);
  EXPECT_EQ(lines[1]["event"], "started");
  // Schema keys come first, in a fixed order.
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first.rfind("{\"t\":", 0), 0u) << first;
  EXPECT_NE(first.find("\"role\":\"syncer\",\"id\":0,\"event\":\"quorum_reached\""), std::string::npos) << first;
  // Appends, never truncates.
  {
    EventLog again(path, Role::kLearner, 2);
    again.emit("joined", nullptr);
  }
  const auto all = read_lines(path);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[2]["role"], "learner");
  EXPECT_EQ(all[2]["id"], 2);
  fs::remove(path);
}

TEST(EventLog, ManyThreadsNeverInterleaveLines) {
  const fs::path path = fresh_file("dloco_events_threads");
  constexpr int kThreads = 4, kEach = 500;
  {
    EventLog log(path, Role::kLearner, 1);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&log, t] {
        for (int i = 0; i < kEach; ++i) log.emit("step", {{"thread", t}, {"i", i}, {"pad", std::string(100, 'x')}});
      });
    }
    for (auto& th : threads) th.join();
  }
  const auto lines = read_lines(path);  // parse throws on an interleaved line
  ASSERT_EQ(lines.size(), static_cast<size_t>(kThreads * kEach));
  std::set<std::pair<int, int>> seen;
  for (const auto& l : lines) seen.insert({l["thread"].get<int>(), l["i"].get<int>()});
  EXPECT_EQ(seen.size(), static_cast<size_t>(kThreads * kEach));
  fs::remove(path);
}

TEST(EventLog, DisabledLogAndBadUse) {
  EventLog disabled;
  EXPECT_FALSE(disabled.enabled());
  EXPECT_NO_THROW(disabled.emit("anything", {{"x", 1}}));
  EXPECT_THROW(EventLog(fs::path("/nonexistent_dir_dloco/events.jsonl"), Role::kEvaluator, 0), InputError);
  const fs::path path = fresh_file("dloco_events_bad");
  EventLog log(path, Role::kLauncher, 0);
  EXPECT_THROW(log.emit("x", {{"event", "shadowed"}}), InvariantError);  // reserved key: a bug
  EXPECT_THROW(log.emit("x", nlohmann::json::array({1, 2})), InvariantError);
  EXPECT_STREQ(to_string(Role::kEvaluator), "evaluator");
  fs::remove(path);
}

}  // namespace
}  // namespace dloco
