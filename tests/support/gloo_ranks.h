// Ranks as threads: runs a test's body on M ranks of this one process, each rank a thread that joins one real Gloo
// group (collective/process_group.h) through a c10d FileStore in a fresh file, and collects what each rank threw.
// Shared by the tests of the c10d adapter, of the baselines' merge and of the parallel layers, so every one of them
// forms its groups the same way.
// Deliberately not here: separate processes and killing them (tests/support/process_checks.h), and a rank that is
// told to leave early (a test that needs one starts its own threads).
#pragma once

#include <unistd.h>

#include <atomic>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "collective/process_group.h"

namespace dloco::testing_support {

/// A rendezvous file no group of this process has used yet: <tmp>/dloco_<tag>_<pid>/store_<n>. A FileStore's keys
/// outlive the group that wrote them, so every group needs its own. The directory is created, the file is not.
inline std::filesystem::path fresh_store(const std::string& tag = "ranks") {
  static std::atomic<int> serial{0};
  const auto dir = std::filesystem::temp_directory_path() / ("dloco_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto file = dir / ("store_" + std::to_string(serial++));
  std::filesystem::remove(file);
  return file;
}

/// Runs body(group) on `world` ranks, one thread each, joined into one group at `store` on 127.0.0.1 with the
/// deadline timeout_s (seconds, of the join and of every collective). Returns each rank's error message, "" when
/// its join and body threw nothing. Returns when every rank's body has returned and its group is destroyed.
inline std::vector<std::string> on_ranks(const std::filesystem::path& store, int world,
                                         const std::function<void(Collective&)>& body, double timeout_s = 60) {
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      try {
        Collective group({store, r, world, "127.0.0.1", timeout_s});
        body(group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

/// The same through a fresh_store() of its own.
inline std::vector<std::string> on_ranks(int world, const std::function<void(Collective&)>& body,
                                         double timeout_s = 60) {
  return on_ranks(fresh_store(), world, body, timeout_s);
}

/// Fails the test (without stopping it) for every rank whose error is not "".
inline void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace dloco::testing_support
