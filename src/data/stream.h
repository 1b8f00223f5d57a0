// Data streams (docs/protocol.md §7, "Data streams"): the train split is cut into S contiguous,
// disjoint streams; a learner slot reads one stream through a cursor that only moves forward, so no token of a
// stream is trained twice or skipped within an epoch. The cursor is plain data, persisted before each step and
// restored exactly on resume.
// A batch is a window of B·T + 1 consecutive tokens: inputs are window[0 : B·T], targets window[1 : B·T + 1],
// both viewed as (B, T). At the end of its range the stream wraps to its start and counts an epoch.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include <nlohmann/json.hpp>

#include "data/shards.h"

namespace dloco {

/// Where a stream stands. Units: tokens.
struct StreamCursor {
  int64_t stream = 0;         // stream index s, 0 ≤ s < S
  int64_t position = 0;       // offset of the next window from the stream's first token
  int64_t epoch = 0;          // completed passes over the stream
  int64_t tokens_served = 0;  // B·T per batch since the stream began (all epochs)

  nlohmann::json to_json() const;
  /// Throws InputError if a field is missing or negative.
  static StreamCursor from_json(const nlohmann::json& j);
  bool operator==(const StreamCursor&) const = default;
};

class DataStream {
 public:
  /// Stream `index` of `count` over `split`: tokens [index·L, (index+1)·L) with L = size / count.
  /// Throws InputError if a stream is shorter than one window (B·T + 1 tokens: use fewer streams or a smaller
  /// batch) or the cursor belongs to another stream or lies outside it.
  DataStream(std::shared_ptr<const TokenSplit> split, int64_t index, int64_t count, int64_t batch_size,
             int64_t seq_len, StreamCursor cursor);

  /// Fills `window` (exactly B·T + 1 int64 values) with the next batch and advances the cursor by B·T.
  void next(std::span<int64_t> window);
  /// Advances the cursor by one batch without reading it (a restarted learner skips the batch its previous
  /// incarnation took: stream_log.h).
  void skip();

  const StreamCursor& cursor() const { return cursor_; }
  int64_t tokens_per_batch() const { return batch_size_ * seq_len_; }
  int64_t begin() const { return begin_; }
  int64_t length() const { return length_; }

 private:
  std::shared_ptr<const TokenSplit> split_;
  int64_t begin_ = 0, length_ = 0, batch_size_ = 0, seq_len_ = 0;
  StreamCursor cursor_;
};

}  // namespace dloco
