// Stream logs (data/stream_log.h): the format version header (written, checked, legacy logs without it read and
// continued, unknown versions refused with what was found and expected), and that a refused open leaves the log
// unlocked. The resume-after-a-torn-line and exactly-once checks run in tests/chaos/chaos_report_test.cc.
#include "data/stream_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

  std::vector<std::string> file_lines(const fs::path& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  // The message of the InputError `f` throws ("" if none).
  template <typename F>
  std::string input_error(F&& f) {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

StreamCursor batch(int64_t b) { return {0, b * 100, 0, b * 100}; }

TEST_F(StreamLogTest, NewLogStartsWithTheVersionHeaderAndReadsBack) {
  const fs::path path = stream_log_path(dir_, 0);
  {
    StreamLog log(path);
    EXPECT_EQ(log.version(), kStreamLogVersion);
    log.take(batch(0), 3, 10);
    log.take(batch(1), 3, 11);
  }
  const auto lines = file_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(lines[0]), (nlohmann::json{{"format", "dloco.stream_log"}, {"version", 1}}));
  int version = -1;
  const auto records = read_stream_log(path, &version);
  EXPECT_EQ(version, 1);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].cursor, batch(1));
  EXPECT_EQ(records[1].learner, 3);
  EXPECT_EQ(records[1].step, 11);
  StreamLog reopened(path);  // the header is not a record: the last one is
  EXPECT_EQ(reopened.version(), kStreamLogVersion);
  ASSERT_TRUE(reopened.last_taken().has_value());
  EXPECT_EQ(*reopened.last_taken(), batch(1));
  EXPECT_EQ(file_lines(path).size(), 3u);  // no second header
}

TEST_F(StreamLogTest, HeaderOnlyOrTornHeaderIsALogWithNoBatches) {
  const fs::path path = stream_log_path(dir_, 0);
  { StreamLog log(path); }
  int version = -1;
  EXPECT_TRUE(read_stream_log(path, &version).empty());
  EXPECT_EQ(version, kStreamLogVersion);
  EXPECT_FALSE(StreamLog(path).last_taken().has_value());

  write_file(path, "{\"format\":\"dloco.str");  // killed while writing the header of a new log
  {
    StreamLog log(path);
    EXPECT_EQ(log.version(), kStreamLogVersion);
    EXPECT_FALSE(log.last_taken().has_value());
    log.take(batch(0), 0, 0);
  }
  EXPECT_EQ(read_stream_log(path, &version).size(), 1u);
  EXPECT_EQ(version, kStreamLogVersion);
}

// Logs written before the header existed: the same records, no first line. They are read as they are and a
// restarted learner continues them without a header (records of both versions have the same fields).
TEST_F(StreamLogTest, LegacyLogWithoutHeaderIsReadAndContinued) {
  const fs::path path = stream_log_path(dir_, 2);
  fs::create_directories(path.parent_path());
  write_file(path,
             "{\"epoch\":0,\"learner\":1,\"position\":0,\"step\":0,\"stream\":2,\"tokens_served\":0}\n"
             "{\"epoch\":0,\"learner\":1,\"position\":100,\"step\":1,\"stream\":2,\"tokens_served\":100}\n");
  int version = -1;
  auto records = read_stream_log(path, &version);
  EXPECT_EQ(version, kStreamLogLegacyVersion);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].cursor, (StreamCursor{2, 100, 0, 100}));
  {
    StreamLog log(path);
    EXPECT_EQ(log.version(), kStreamLogLegacyVersion);
    ASSERT_TRUE(log.last_taken().has_value());
    EXPECT_EQ(log.last_taken()->tokens_served, 100);
    log.take({2, 200, 0, 200}, 1, 2);
  }
  records = read_stream_log(path, &version);
  EXPECT_EQ(version, kStreamLogLegacyVersion);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_TRUE(check_stream_log(records, 100).ok());
  EXPECT_EQ(file_lines(path).size(), 3u);
}

// A header this build does not know is refused by the reader and by the writer, with what was found and what was
// expected; never read as if it were version 1.
TEST_F(StreamLogTest, UnknownFormatOrVersionIsRefusedSayingWhatWasFoundAndExpected) {
  const std::string record = "{\"epoch\":0,\"position\":0,\"stream\":0,\"tokens_served\":0}\n";
  struct Case {
    std::string header;
    std::string found;  // in the message, beside the expected format and version
  };
  const std::vector<Case> cases = {
      {R"({"format":"dloco.stream_log","version":2})", "format version 2"},
      {R"({"format":"dloco.stream_log","version":0})", "format version 0"},
      {R"({"format":"dloco.stream_log","version":"1"})", "format version \"1\""},
      {R"({"format":"dloco.stream_log"})", "format version missing"},
      {R"({"format":"dloco.events","version":1})", "format \"dloco.events\""},
  };
  const fs::path path = stream_log_path(dir_, 0);
  fs::create_directories(path.parent_path());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.header);
    write_file(path, c.header + "\n" + record);
    for (const std::string& message : {input_error([&] { read_stream_log(path); }),
                                       input_error([&] { StreamLog log(path); })}) {
      EXPECT_NE(message.find(path.string() + ", line 1: "), std::string::npos) << message;
      EXPECT_NE(message.find(c.found), std::string::npos) << message;
      EXPECT_NE(message.find("expected \"dloco.stream_log\" version 1"), std::string::npos) << message;
    }
    EXPECT_EQ(file_lines(path).size(), 2u);  // a refused log is left as it was
  }
}

TEST_F(StreamLogTest, MalformedRecordNamesItsLineCountingTheHeader) {
  const fs::path path = stream_log_path(dir_, 0);
  fs::create_directories(path.parent_path());
  write_file(path, "{\"format\":\"dloco.stream_log\",\"version\":1}\n"
                   "{\"epoch\":0,\"position\":0,\"stream\":0,\"tokens_served\":0}\n"
                   "{oops\n");
  const std::string message = input_error([&] { read_stream_log(path); });
  EXPECT_NE(message.find(", line 3: not valid JSON"), std::string::npos) << message;
  // A record with a key twice is refused too, not read as its last value.
  write_file(path, "{\"format\":\"dloco.stream_log\",\"version\":1}\n"
                   "{\"epoch\":0,\"position\":0,\"position\":64,\"stream\":0,\"tokens_served\":0}\n");
  const std::string twice = input_error([&] { read_stream_log(path); });
  EXPECT_NE(twice.find(", line 2: duplicate key 'position'"), std::string::npos) << twice;
}

// Found by fuzz/stream_log.cc: a field that is a float out of int64's range (1e38) was cast to int64 (undefined
// behaviour) instead of refused; so was a learner id out of int's range.
TEST_F(StreamLogTest, ANumberAnIntegerFieldCannotHoldIsRefusedNamingItsLine) {
  const fs::path path = stream_log_path(dir_, 0);
  fs::create_directories(path.parent_path());
  for (const char* record : {"{\"epoch\":0,\"position\":1e38,\"stream\":0,\"tokens_served\":0}",
                             "{\"epoch\":0,\"position\":0.5,\"stream\":0,\"tokens_served\":0}",
                             "{\"epoch\":0,\"position\":0,\"stream\":0,\"tokens_served\":0,\"learner\":1e300}",
                             "{\"epoch\":0,\"position\":0,\"stream\":0,\"tokens_served\":0,\"learner\":4294967296}",
                             "{\"epoch\":0,\"position\":0,\"stream\":0,\"tokens_served\":18446744073709551615}"}) {
    write_file(path, std::string("{\"format\":\"dloco.stream_log\",\"version\":1}\n") + record + "\n");
    const std::string message = input_error([&] { read_stream_log(path); });
    EXPECT_NE(message.find(", line 2: "), std::string::npos) << record << ": " << message;
  }
  write_file(path, "{\"format\":\"dloco.stream_log\",\"version\":1}\n"
                   "{\"epoch\":0,\"position\":64.0,\"stream\":0,\"tokens_served\":64,\"learner\":2,\"step\":3}\n");
  const auto records = read_stream_log(path);  // an integral float is an integer
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].cursor.position, 64);
  EXPECT_EQ(records[0].learner, 2);
}

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
