// Exact-data stream logs; see stream_log.h.
#include "data/stream_log.h"

#include "core/json_read.h"

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

// `line_number` is 1-based, as an editor shows it.
StreamRecord parse_record(const std::string& line, const fs::path& path, size_t line_number) {
  const std::string where = "stream log " + path.string() + ", line " + std::to_string(line_number);
  try {
    const auto j = parse_json(line, where);
    const int64_t learner = json_integer_or(j, "learner", -1, where);
    if (learner < -1 || learner > INT32_MAX) throw InputError(where + ": learner " + std::to_string(learner) + " is out of range");
    return {StreamCursor::from_json(j), static_cast<int>(learner), json_integer_or(j, "step", 0, where)};
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where + ": not JSON (" + e.what() + ")");
  } catch (const InputError& e) {
    if (std::string(e.what()).rfind(where, 0) == 0) throw;
    throw InputError(where + ": " + e.what());
  }
}

nlohmann::json header_json() { return {{"format", kStreamLogFormat}, {"version", kStreamLogVersion}}; }

// The format version of a log whose complete lines are `lines`; removes the header line from them. A first line
// without a "format" key is a record: a legacy log. Throws InputError for another format or an unknown version.
int strip_header(std::vector<std::string>& lines, const fs::path& path) {
  if (lines.empty()) return kStreamLogLegacyVersion;
  const std::optional<nlohmann::json> header = try_parse_json(lines.front(), "stream log " + path.string());
  if (!header) return kStreamLogLegacyVersion;  // not JSON: parse_record names the line
  const nlohmann::json& j = *header;
  if (!j.is_object() || !j.contains("format")) return kStreamLogLegacyVersion;
  const std::string where = "stream log " + path.string() + ", line 1: ";
  const std::string expected =
      std::string("\"") + kStreamLogFormat + "\" version " + std::to_string(kStreamLogVersion);
  if (j["format"] != kStreamLogFormat) {
    throw InputError(where + "format " + j["format"].dump() + ", expected " + expected + " (is it a stream log?)");
  }
  const auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer()) {
    throw InputError(where + "format version " + (version == j.end() ? std::string("missing") : version->dump()) +
                     ", expected " + expected);
  }
  if (version->get<int64_t>() != kStreamLogVersion) {
    throw InputError(where + "format version " + version->dump() + ", expected " + expected +
                     " (or a legacy log without a header): written by another dloco; read it with that one");
  }
  lines.erase(lines.begin());
  return kStreamLogVersion;
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
  auto lines = complete_lines(path_, &complete);
  if (complete != fs::file_size(path_)) fs::resize_file(path_, complete);  // torn last line: never trained
  if (lines.empty()) {  // a new log, or one whose header was torn: start it with the header
    append_line(header_json().dump());
    version_ = kStreamLogVersion;
    return;
  }
  version_ = strip_header(lines, path_);
  const size_t first_record_line = version_ == kStreamLogLegacyVersion ? 1 : 2;
  if (!lines.empty()) last_ = parse_record(lines.back(), path_, first_record_line + lines.size() - 1).cursor;
}

void StreamLog::append_line(const std::string& line) {
  if (std::fputs((line + "\n").c_str(), file_) == EOF || std::fflush(file_) != 0) {
    throw InputError("cannot write stream log " + path_.string() + ": " + std::strerror(errno));
  }
}

StreamLog::~StreamLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void StreamLog::take(const StreamCursor& cursor, int learner, int64_t step) {
  nlohmann::json j = cursor.to_json();
  j["learner"] = learner;
  j["step"] = step;
  append_line(j.dump());
  last_ = cursor;
}

std::vector<StreamRecord> read_stream_log(const fs::path& path, int* version) {
  if (!fs::exists(path)) throw InputError("stream log " + path.string() + " not found");
  size_t complete = 0;
  auto lines = complete_lines(path, &complete);
  const int v = strip_header(lines, path);
  if (version != nullptr) *version = v;
  const size_t first_record_line = v == kStreamLogLegacyVersion ? 1 : 2;
  std::vector<StreamRecord> out;
  for (size_t i = 0; i < lines.size(); ++i) out.push_back(parse_record(lines[i], path, first_record_line + i));
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
