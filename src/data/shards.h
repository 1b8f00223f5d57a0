// Token shards: the on-disk format of a tokenized corpus, and a read-only memory-mapped view of a split.
// Format (little-endian), one file per shard:
//   offset  0: magic "DLOCOTOK" (8 bytes)
//   offset  8: uint32 version (1)
//   offset 12: uint32 bytes per token (2 = uint16, 4 = uint32)
//   offset 16: uint32 vocabulary size
//   offset 20: uint32 header size in bytes (64)
//   offset 24: uint64 token count
//   offset 32: reserved, zero, up to byte 64; then the tokens.
// Deliberately not here: compression, random access by document (streams read contiguous ranges).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace dloco {

inline constexpr char kShardMagic[8] = {'D', 'L', 'O', 'C', 'O', 'T', 'O', 'K'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint32_t kShardHeaderBytes = 64;

/// Header fields of a shard file.
struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;  // 2 or 4
  uint32_t vocab_size = 0;
  uint64_t token_count = 0;
};

/// Writes tokens (each < vocab_size) as a shard, atomically (temp file, fsync, rename). Uses uint16 when
/// vocab_size ≤ 65536. Throws InputError if a token is out of range or the file cannot be written.
void write_shard(const std::filesystem::path& path, std::span<const int32_t> tokens, uint32_t vocab_size);

/// Reads and validates a shard's header (magic, version, token size, file length). Throws InputError naming
/// the file and what is wrong (e.g. "wrong magic: not a dloco token shard").
ShardHeader read_shard_header(const std::filesystem::path& path);

/// A read-only view of one split (train or val): its shards memory-mapped and concatenated.
/// Token i of the split is token(i), 0 ≤ i < size(). Thread-safe for reads.
class TokenSplit {
 public:
  /// Maps every shard. Throws InputError if a shard is invalid, the list is empty, or vocab sizes differ.
  explicit TokenSplit(const std::vector<std::filesystem::path>& shards);
  ~TokenSplit();
  TokenSplit(const TokenSplit&) = delete;
  TokenSplit& operator=(const TokenSplit&) = delete;

  int64_t size() const { return total_; }
  uint32_t vocab_size() const { return vocab_size_; }
  int64_t token(int64_t i) const;
  /// Copies tokens [begin, begin + out.size()) into out (int64, ready for an embedding lookup).
  /// Precondition (checked): the range lies inside the split.
  void copy(int64_t begin, std::span<int64_t> out) const;

 private:
  struct Mapped {
    const unsigned char* base = nullptr;  // whole file mapping
    size_t length = 0;
    uint32_t token_bytes = 2;
    int64_t count = 0;
    int64_t first = 0;  // index of its first token within the split
  };
  std::vector<Mapped> shards_;
  int64_t total_ = 0;
  uint32_t vocab_size_ = 0;
};

/// The shard files of a split in a prepared data folder, e.g. split "train" -> train_000.bin, train_001.bin…
/// Throws InputError (with the `dloco data prepare` command to run) if there are none.
std::vector<std::filesystem::path> split_shards(const std::filesystem::path& data_dir, const std::string& split);

}  // namespace dloco
