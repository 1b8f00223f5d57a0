// The run folder's lock; see run_lock.h.
#include "process/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "core/check.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

// This process's command line, arguments joined by spaces (as /proc/self/cmdline has them, NUL-separated).
std::string own_command() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : cmd) {
    if (c == '\0') c = ' ';
  }
  while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
  return cmd.substr(0, 512);
}

}  // namespace

RunLock::RunLock(const fs::path& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const fs::path path = run_dir / ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw InputError("cannot open " + path.string() + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder;
    std::getline(std::ifstream(path), holder);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw InputError("cannot lock " + path.string() + ": " + std::strerror(err));
    throw InputError("run folder '" + run_dir.string() + "' is in use by a live run (" +
                     (holder.empty() ? std::string("another process") : holder) +
                     "): stop that run first (Ctrl-C on its launcher), or pick another run.name");
  }
  const std::string me = "pid " + std::to_string(::getpid()) + ": " + own_command() + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t written = ::pwrite(fd_, me.data(), me.size(), 0);
    (void)written;  // the holder's name is for the message only
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace dloco
