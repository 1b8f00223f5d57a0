// Optimizer state in a mapped file; see offload.h.
#include "parallel/offload.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "core/check.h"

namespace dloco {

MappedState::MappedState(const std::filesystem::path& file, int64_t n)
    : file_(file), n_(n), bytes_(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float)) {
  std::filesystem::create_directories(file.parent_path());
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) throw InputError("offload: cannot create '" + file.string() + "': " + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
    const int e = errno;
    ::close(fd);
    throw InputError("offload: cannot size '" + file.string() + "' to " + std::to_string(bytes_) +
                     " bytes: " + std::strerror(e));
  }
  base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the file
  ::unlink(file.c_str());  // and its blocks: nothing is left on disk when the rank dies, however it dies
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw InputError("offload: cannot map '" + file.string() + "': " + std::strerror(e));
  }
  tensor_ = torch::from_blob(base_, {n}, torch::kFloat);  // no deleter: the mapping lives as long as this object
}

MappedState::~MappedState() {
  tensor_ = torch::Tensor();
  if (base_) ::munmap(base_, bytes_);
}

void MappedState::release(int64_t begin, int64_t count) {
  DLOCO_CHECK(begin >= 0 && count >= 0 && begin + count <= n_);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(base_) + static_cast<uintptr_t>(begin) * sizeof(float);
  const auto end = start + static_cast<uintptr_t>(count) * sizeof(float);
  const uintptr_t map_end = reinterpret_cast<uintptr_t>(base_) + bytes_;
  uintptr_t first = (start + page - 1) / page * page, last = end / page * page;  // whole pages inside
  if (end == map_end) last = (end + page - 1) / page * page;  // the mapping's last page is all ours
  if (begin == 0) first = start;                               // the mapping starts on a page
  if (first >= last) return;
  auto* p = reinterpret_cast<void*>(first);
  ::msync(p, last - first, MS_ASYNC);
  ::madvise(p, last - first, MADV_DONTNEED);
}

int64_t MappedState::resident_bytes() const {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  const auto start = reinterpret_cast<uintptr_t>(base_);
  std::string line;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    // A mapping's header: "7f12a000-7f12b000 rw-s 00000000 08:01 1234 /path".
    const auto dash = line.find('-');
    if (dash != std::string::npos && dash > 0 && line.find(' ') > dash && std::isxdigit(line[0])) {
      in_mapping = std::stoull(line.substr(0, dash), nullptr, 16) == start;
      continue;
    }
    if (in_mapping && line.rfind("Rss:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      int64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

}  // namespace dloco
