// Atomic, durable file replacement: temp file in the same directory, fsync, rename, fsync the directory.
#include "process/atomic_file.h"
#include "process/private_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/check.h"

namespace dloco {
namespace {

std::atomic<uint64_t> temp_counter{0};

[[noreturn]] void fail(const std::filesystem::path& path, const char* step, int error) {
  throw InputError("cannot write " + path.string() + ": " + step + " failed: " + std::strerror(error));
}

}  // namespace

namespace {
void write_with_mode(const std::filesystem::path& path, std::span<const std::byte> bytes, mode_t mode);
}  // namespace

void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  write_with_mode(path, bytes, 0644);
}

void write_private_file_atomically(const std::filesystem::path& path, std::string_view text) {
  write_with_mode(path, std::as_bytes(std::span(text.data(), text.size())), 0600);
}

namespace {
void write_with_mode(const std::filesystem::path& path, std::span<const std::byte> bytes, mode_t mode) {
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const std::filesystem::path temp = path.string() + ".tmp." + std::to_string(::getpid()) + "." +
                                     std::to_string(temp_counter.fetch_add(1));
  // 1. Write the temporary file.
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) fail(path, ("creating " + temp.filename().string()).c_str(), errno);
  auto abandon = [&](const char* step) {
    const int error = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    fail(path, step, error);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      abandon("write");
    }
    done += static_cast<size_t>(n);
  }
  // 2. Make the data durable before the name points at it.
  if (::fsync(fd) != 0) abandon("fsync");
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    fail(path, "close", error);
  }
  // 3. Atomically replace the target.
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    fail(path, "rename", error);
  }
  // 4. Make the rename durable.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) fail(path, "opening the directory for fsync", errno);
  if (::fsync(dir_fd) != 0) {
    const int error = errno;
    ::close(dir_fd);
    fail(path, "fsync of the directory", error);
  }
  ::close(dir_fd);
}

}  // namespace

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  write_file_atomically(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

}  // namespace dloco
