// Exact-data stream logs; see stream_log.h.
#include "data/stream_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

// Reads the whole file; returns the complete lines and the length of the prefix they span.
std::vector<std::string> complete_lines(const fs::path& path, size_t* complete_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t end = text.rfind('\n');
  *complete_bytes = end == std::string::npos ? 0 : end + 1;
  std::vector<std::string> lines;
  std::stringstream body(text.substr(0, *complete_bytes));
  for (std::string line; std::getline(body, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

StreamRecord parse_record(const std::string& line, const fs::path& path, size_t index) {
  try {
    const auto j = nlohmann::json::parse(line);
    return {StreamCursor::from_json(j), j.value("learner", -1), j.value("step", int64_t{0})};
  } catch (const nlohmann::json::exception& e) {
    throw InputError("stream log " + path.string() + ", line " + std::to_string(index + 1) + ": not JSON (" +
                     e.what() + ")");
  }
}

}  // namespace

fs::path stream_log_path(const fs::path& run_dir, int64_t stream) {
  return run_dir / "streams" / ("stream_" + std::to_string(stream) + ".jsonl");
}

StreamLog::StreamLog(const fs::path& path) : path_(path) {
  fs::create_directories(path.parent_path());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError("cannot open stream log " + path.string() + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // before reading: the holder may still be appending
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) throw StreamBusy("stream log " + path.string() + " is held by another live process");
    throw InputError("cannot lock stream log " + path.string() + ": " + std::strerror(err));
  }
  file_ = ::fdopen(fd, "a");
  if (file_ == nullptr) {
    ::close(fd);
    throw InputError("cannot open stream log " + path.string() + ": " + std::strerror(errno));
  }
  try {
    resume();
  } catch (...) {  // no destructor runs for a half-built object: close the file, which also drops the lock
    std::fclose(file_);
    file_ = nullptr;
    throw;
  }
}

void StreamLog::resume() {
  size_t complete = 0;
  const auto lines = complete_lines(path_, &complete);
  if (complete != fs::file_size(path_)) fs::resize_file(path_, complete);  // torn last line: never trained
  if (!lines.empty()) last_ = parse_record(lines.back(), path_, lines.size() - 1).cursor;
}

StreamLog::~StreamLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void StreamLog::take(const StreamCursor& cursor, int learner, int64_t step) {
  nlohmann::json j = cursor.to_json();
  j["learner"] = learner;
  j["step"] = step;
  const std::string line = j.dump() + "\n";
  if (std::fputs(line.c_str(), file_) == EOF || std::fflush(file_) != 0) {
    throw InputError("cannot write stream log " + path_.string() + ": " + std::strerror(errno));
  }
  last_ = cursor;
}

std::vector<StreamRecord> read_stream_log(const fs::path& path) {
  if (!fs::exists(path)) throw InputError("stream log " + path.string() + " not found");
  size_t complete = 0;
  const auto lines = complete_lines(path, &complete);
  std::vector<StreamRecord> out;
  for (size_t i = 0; i < lines.size(); ++i) out.push_back(parse_record(lines[i], path, i));
  return out;
}

ExactDataCheck check_stream_log(const std::vector<StreamRecord>& records, int64_t tokens_per_batch) {
  ExactDataCheck c;
  int64_t expected = 0;
  for (const auto& r : records) {
    ++c.batches;
    const int64_t served = r.cursor.tokens_served;
    if (served < expected) {
      ++c.duplicates;
      continue;
    }
    if (served > expected) {
      ++c.gaps;
      c.skipped_tokens += served - expected;
    }
    expected = served + tokens_per_batch;
  }
  return c;
}

}  // namespace dloco
