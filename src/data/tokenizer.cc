// Tokenizer client; see tokenizer.h.
#include "data/tokenizer.h"
#include "process/file_hash.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/hash.h"

extern char** environ;

namespace dloco {

namespace fs = std::filesystem;

uint64_t tokenizer_file_hash(const fs::path& model_file) { return file_fnv1a64(model_file, "tokenizer"); }

fs::path data_tool_path() {
  if (const char* env = std::getenv("DLOCO_DATA_BIN"); env && *env) return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return (ec ? fs::path(".") : self.parent_path()) / "dloco-data";
}

Tokenizer::Tokenizer(const fs::path& model_file) : model_file_(model_file) {
  if (!fs::exists(model_file)) {
    throw InputError("tokenizer '" + model_file.string() +
                     "' is missing: prepare the corpus first (`dloco data prepare --kjv --out DIR`)");
  }
  hash_ = tokenizer_file_hash(model_file);
  fs::path vocab = model_file;
  vocab.replace_extension(".vocab");
  std::ifstream in(vocab);
  if (!in) throw InputError("tokenizer vocabulary '" + vocab.string() + "' is missing (re-run `dloco data prepare`)");
  std::string line;
  while (std::getline(in, line)) {
    const auto tab = line.find('\t');
    if (tab == std::string::npos) throw InputError("malformed tokenizer vocabulary line in '" + vocab.string() + "'");
    pieces_.push_back(line.substr(0, tab));
    if (pieces_.back() == "</s>") eos_id_ = static_cast<int32_t>(pieces_.size() - 1);
  }
  if (pieces_.empty() || eos_id_ < 0) {
    throw InputError("tokenizer vocabulary '" + vocab.string() + "' is empty or has no </s> piece");
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const std::string tool = data_tool_path().string();
  const std::string model = model_file_.string();
  const std::string input(text);
  std::vector<const char*> argv = {tool.c_str(), "encode", "--model", model.c_str(), "--text", input.c_str(), nullptr};
  int out[2];
  if (::pipe(out) != 0) throw InputError(std::string("cannot create a pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, tool.c_str(), &actions, nullptr, const_cast<char**>(argv.data()), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    throw InputError("cannot run the tokenizer helper '" + tool + "': " + std::strerror(rc) +
                     " (build it with the project, or set DLOCO_DATA_BIN)");
  }
  std::string output;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) output.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw InputError("'" + tool + " encode' failed");
  std::vector<int32_t> ids;
  std::istringstream is(output);
  int32_t id;
  while (is >> id) ids.push_back(id);
  return ids;
}

namespace {
// Replaces every byte that does not start or continue a valid UTF-8 sequence with U+FFFD, so samples from an
// untrained model (which may emit half a multi-byte character) stay printable and JSON-safe.
std::string valid_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size() && !(len == 2 && c < 0xC2);
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}
}  // namespace

std::string Tokenizer::decode(std::span<const int64_t> ids) const {
  static const std::string kSpace = "\xe2\x96\x81";  // U+2581 "▁", SentencePiece's word boundary
  std::string out;
  bool line_start = true;
  for (int64_t id : ids) {
    if (id == eos_id_) {
      out += '\n';
      line_start = true;
      continue;
    }
    if (id < 0 || id >= vocab_size()) continue;
    const std::string& piece = pieces_[static_cast<size_t>(id)];
    std::string text;
    if (piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece.back() == '>') {
      text.push_back(static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    } else if (piece.size() > 2 && piece.front() == '<' && piece.back() == '>') {
      continue;  // <unk>, <s>: control pieces print nothing
    } else {
      for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, kSpace.size(), kSpace) == 0) {
          text += ' ';
          i += kSpace.size();
        } else {
          text += piece[i++];
        }
      }
    }
    if (line_start && !text.empty() && text.front() == ' ') text.erase(0, 1);  // the dummy prefix
    if (!text.empty()) line_start = false;
    out += text;
  }
  return valid_utf8(out);
}

}  // namespace dloco
