// Stream logs (data/stream_log.h): what opening a log refuses, and that a refused open leaves the log unlocked.
// The resume-after-a-torn-line and exactly-once checks run in tests/chaos/chaos_report_test.cc.
#include "data/stream_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "core/check.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

class StreamLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dloco_stream_log_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_file(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
  }

  fs::path dir_;
};

// A log whose last complete line is not a cursor is refused; the refused open must close the file and release
// its lock (no destructor runs for an object whose constructor threw), or this process could never open the
// log again, even after it is repaired.
TEST_F(StreamLogTest, RefusedOpenReleasesTheFileAndItsLock) {
  const fs::path path = stream_log_path(dir_, 0);
  fs::create_directories(path.parent_path());
  write_file(path, "not a cursor\n");
  EXPECT_THROW(StreamLog log(path), InputError);
  write_file(path, "");
  StreamLog log(path);  // StreamBusy if the refused open still held the lock
  EXPECT_FALSE(log.last_taken().has_value());
}

}  // namespace
}  // namespace dloco
