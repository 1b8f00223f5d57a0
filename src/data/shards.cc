// Token shard files and the memory-mapped split view; see shards.h for the format.
#include "data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/check.h"
#include "process/atomic_file.h"

namespace dloco {

namespace {

template <class T>
void put(std::vector<std::byte>& out, size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}

template <class T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

ShardHeader parse_header(const unsigned char* p, size_t file_size, const std::filesystem::path& path) {
  const std::string name = "token shard '" + path.string() + "'";
  if (file_size < kShardHeaderBytes) {
    throw InputError(name + " is " + std::to_string(file_size) + " bytes, shorter than its 64-byte header (truncated?)");
  }
  if (std::memcmp(p, kShardMagic, 8) != 0) {
    throw InputError(name + " has the wrong magic: not a dloco token shard (run `dloco data prepare`)");
  }
  ShardHeader h;
  h.version = get<uint32_t>(p + 8);
  if (h.version != kShardVersion) {
    throw InputError(name + " has format version " + std::to_string(h.version) + ", this dloco reads version " +
                     std::to_string(kShardVersion) + " (re-run `dloco data prepare`)");
  }
  h.token_bytes = get<uint32_t>(p + 12);
  if (h.token_bytes != 2 && h.token_bytes != 4) {
    throw InputError(name + " has an invalid token size of " + std::to_string(h.token_bytes) + " bytes (2 or 4)");
  }
  h.vocab_size = get<uint32_t>(p + 16);
  const uint32_t header_bytes = get<uint32_t>(p + 20);
  if (header_bytes != kShardHeaderBytes) {
    throw InputError(name + " declares a " + std::to_string(header_bytes) + "-byte header, expected 64");
  }
  h.token_count = get<uint64_t>(p + 24);
  // Compared by division, not by multiplying the count: a count of 2^62 four-byte tokens wraps 64 + 4 · 2^62 around
  // to 64, and such a "header-only" shard was taken and read far past its end (found by fuzz/shard.cc).
  const uint64_t fits = (file_size - kShardHeaderBytes) / h.token_bytes;
  if (h.token_count != fits || (file_size - kShardHeaderBytes) % h.token_bytes != 0) {
    throw InputError(name + " holds " + std::to_string(file_size) + " bytes but its header promises " +
                     std::to_string(h.token_count) + " tokens of " + std::to_string(h.token_bytes) +
                     " bytes: truncated or corrupt");
  }
  return h;
}

}  // namespace

void write_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, uint32_t vocab_size) {
  const uint32_t token_bytes = vocab_size <= 65536 ? 2 : 4;
  std::vector<std::byte> out(kShardHeaderBytes + tokens.size() * token_bytes);
  std::memcpy(out.data(), kShardMagic, 8);
  put<uint32_t>(out, 8, kShardVersion);
  put<uint32_t>(out, 12, token_bytes);
  put<uint32_t>(out, 16, vocab_size);
  put<uint32_t>(out, 20, kShardHeaderBytes);
  put<uint64_t>(out, 24, tokens.size());
  size_t offset = kShardHeaderBytes;
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<uint32_t>(t) >= vocab_size) {
      throw InputError("token id " + std::to_string(t) + " is outside the vocabulary of " +
                       std::to_string(vocab_size) + " while writing '" + path.string() + "'");
    }
    if (token_bytes == 2) {
      put<uint16_t>(out, offset, static_cast<uint16_t>(t));
    } else {
      put<uint32_t>(out, offset, static_cast<uint32_t>(t));
    }
    offset += token_bytes;
  }
  write_file_atomically(path, out);
}

ShardHeader read_shard_header(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open token shard '" + path.string() + "': " + std::strerror(errno));
  unsigned char buf[kShardHeaderBytes] = {};
  in.read(reinterpret_cast<char*>(buf), sizeof(buf));
  return parse_header(buf, std::filesystem::file_size(path), path);
}

TokenSplit::TokenSplit(const std::vector<std::filesystem::path>& shards) {
  if (shards.empty()) throw InputError("a token split needs at least one shard file");
  for (const auto& path : shards) {
    const ShardHeader h = read_shard_header(path);
    if (!shards_.empty() && h.vocab_size != vocab_size_) {
      throw InputError("token shard '" + path.string() + "' has vocabulary " + std::to_string(h.vocab_size) +
                       " but the previous shards have " + std::to_string(vocab_size_));
    }
    vocab_size_ = h.vocab_size;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw InputError("cannot open token shard '" + path.string() + "': " + std::strerror(errno));
    struct stat st{};
    ::fstat(fd, &st);
    void* base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base == MAP_FAILED) throw InputError("cannot map token shard '" + path.string() + "': " + std::strerror(errno));
    shards_.push_back({static_cast<const unsigned char*>(base), static_cast<size_t>(st.st_size), h.token_bytes,
                       static_cast<int64_t>(h.token_count), total_});
    total_ += static_cast<int64_t>(h.token_count);
  }
}

TokenSplit::~TokenSplit() {
  for (auto& s : shards_) ::munmap(const_cast<unsigned char*>(s.base), s.length);
}

int64_t TokenSplit::token(int64_t i) const {
  int64_t out = 0;
  copy(i, std::span<int64_t>(&out, 1));
  return out;
}

void TokenSplit::copy(int64_t begin, std::span<int64_t> out) const {
  DLOCO_CHECK_GE(begin, 0);
  DLOCO_CHECK_LE(begin + static_cast<int64_t>(out.size()), total_);
  // First shard containing `begin`: the last with first ≤ begin.
  auto it = std::upper_bound(shards_.begin(), shards_.end(), begin,
                             [](int64_t v, const Mapped& s) { return v < s.first; });
  size_t k = static_cast<size_t>(std::distance(shards_.begin(), it)) - 1;
  int64_t pos = begin;
  size_t written = 0;
  while (written < out.size()) {
    const Mapped& s = shards_[k];
    const unsigned char* data = s.base + kShardHeaderBytes;
    const int64_t local = pos - s.first;
    const int64_t n = std::min<int64_t>(s.count - local, static_cast<int64_t>(out.size() - written));
    if (s.token_bytes == 2) {
      for (int64_t j = 0; j < n; ++j) out[written + j] = get<uint16_t>(data + 2 * (local + j));
    } else {
      for (int64_t j = 0; j < n; ++j) out[written + j] = get<uint32_t>(data + 4 * (local + j));
    }
    written += static_cast<size_t>(n);
    pos += n;
    ++k;
  }
  for (size_t i = 0; i < out.size(); ++i) {  // a corrupt shard must not reach the embedding lookup
    if (out[i] >= vocab_size_) {
      throw InputError("token shards hold token id " + std::to_string(out[i]) + " at position " +
                       std::to_string(begin + static_cast<int64_t>(i)) + ", outside their vocabulary of " +
                       std::to_string(vocab_size_) + ": a shard is corrupt (re-run `dloco data prepare`)");
    }
  }
}

std::vector<std::filesystem::path> split_shards(const std::filesystem::path& data_dir, const std::string& split) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(data_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(split + "_", 0) == 0 && entry.path().extension() == ".bin") out.push_back(entry.path());
  }
  if (ec || out.empty()) {
    throw InputError("no " + split + " shards in '" + data_dir.string() +
                     "': prepare the corpus first, e.g. `dloco data prepare --kjv --out " + data_dir.string() + "`");
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dloco
