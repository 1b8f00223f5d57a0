// Offload of optimizer state (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021, §5) on this
// CPU build: the state lives in a memory-mapped file on local disk instead of anonymous memory, and the optimizer
// step streams through it chunk by chunk, handing each chunk's pages back (msync + madvise(MADV_DONTNEED)) once it
// is updated, so a rank's resident memory no longer holds the state between steps (the page cache may keep it;
// the kernel reclaims it under pressure, writing it to the file). On a CUDA build the same interface would hold
// the state in pinned host memory instead.
// Deliberately not here: the optimizer arithmetic (parallel/zero.cc), asynchronous prefetch of the next chunk.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>

namespace dloco {

/// A file of n fp32 values, zero-filled, mapped shared; a tensor view over it. Not copyable.
class MappedState {
 public:
  /// Creates (or truncates) `file` to n floats, maps it and unlinks it (the mapping keeps the blocks, and nothing is
  /// left on disk when the process dies). Throws InputError when the file cannot be created, sized or mapped (the
  /// message names the file and errno's text).
  MappedState(const std::filesystem::path& file, int64_t n);
  ~MappedState();
  MappedState(const MappedState&) = delete;
  MappedState& operator=(const MappedState&) = delete;

  /// (n) fp32 over the mapping; valid while this object lives.
  const torch::Tensor& tensor() const { return tensor_; }
  /// Writes elements [begin, begin + count) back to the file (MS_ASYNC) and drops their whole pages from this
  /// process's resident set (MADV_DONTNEED on a shared file mapping keeps the data). Partial pages at the ends stay.
  void release(int64_t begin, int64_t count);
  /// Drops every page (release of all n).
  void release_all() { release(0, n_); }
  /// Bytes of the mapping resident in this process now (its "Rss:" in /proc/self/smaps); −1 when unreadable.
  int64_t resident_bytes() const;
  const std::filesystem::path& file() const { return file_; }

 private:
  std::filesystem::path file_;
  int64_t n_ = 0;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  torch::Tensor tensor_;
};

}  // namespace dloco
