// Data streams (docs/protocol.md §7, "Data streams"): the train split is cut into S disjoint streams; a learner
// slot reads one stream through a cursor that only moves forward, so no token of a stream is trained twice within an
// epoch, and none skipped but a tail shorter than a batch (shuffled: the n_s mod B row slots π puts last). The cursor is plain data, persisted before each step and
// restored exactly on resume.
// A batch is a window of B rows of T + 1 tokens, (B, T + 1) int64 stored row after row: row r's inputs are its
// tokens [0 : T], its targets [1 : T + 1] (window_tokens(B, T) values; train/trainer.h window_batch reads it). At the
// end of its range the stream wraps to its start and counts an epoch.
//
// Two layouts (data.order, DataOrder in core/config.h):
//   contiguous  stream s of S is tokens [s·L, (s+1)·L), L = size / S, its batches read in order: row r of the batch
//               at position p is tokens [p + r·T, p + r·T + T] (consecutive rows share one token: together the
//               B·T + 1 tokens from p), so a learner trains one stretch of text after the other (one book for many
//               steps).
//   shuffled    the split is cut into n = (size − 1) / T row slots of T tokens (a row reads one token past its slot,
//               as a target); stream s owns the slots j ≡ s (mod S), n_s of them, so every stream samples the whole
//               split; row r of its k-th batch of epoch e is slot s + S·π(k·B + r), π a pseudo-random permutation of
//               [0, n_s) keyed by splitmix64 of (s, e): a 4-round Feistel network, cycle-walked into range. An epoch
//               is ⌊n_s / B⌋ batches: each slot is read at most once an epoch (the n_s mod B that π puts last are
//               left out, other ones each epoch), and every row of a batch comes from an unrelated place of the
//               text. The cursor's position is still k·B·T, so restarts, skips and the stream log are exact.
// A shuffled stream's rows depend on B and T: a run's streams must be read with one batch size (the handshake
// compares train.batch_size and model.seq_len).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "data/shards.h"

namespace dloco {

/// Tokens in one batch window: B rows of T + 1 (see the top of this file).
inline int64_t window_tokens(int64_t batch_size, int64_t seq_len) { return batch_size * (seq_len + 1); }

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
  /// Stream `index` of `count` over `split`, laid out as `order` says (see the top of this file).
  /// Throws InputError if a stream is shorter than one batch (contiguous: B·T + 1 tokens; shuffled: B row slots; use
  /// fewer streams or a smaller batch) or the cursor belongs to another stream or lies outside it.
  DataStream(std::shared_ptr<const TokenSplit> split, int64_t index, int64_t count, int64_t batch_size,
             int64_t seq_len, StreamCursor cursor, DataOrder order = DataOrder::kContiguous);

  /// Fills `window` (exactly window_tokens(B, T) int64 values: B rows of T + 1) with the next batch and advances the
  /// cursor by B·T.
  void next(std::span<int64_t> window);
  /// Advances the cursor by one batch without reading it (a restarted learner skips the batch its previous
  /// incarnation took: stream_log.h).
  void skip();

  const StreamCursor& cursor() const { return cursor_; }
  int64_t tokens_per_batch() const { return batch_size_ * seq_len_; }
  /// The first token of row r (0 ≤ r < B) of the batch the cursor points at, in the split.
  int64_t row_begin(int64_t r) const;
  /// Tokens the cursor ranges over: contiguous, the stream's length; shuffled, ⌊n_s / B⌋·B·T + 1.
  int64_t length() const { return length_; }

 private:
  void draw_permutation();            // key_ for the cursor's epoch (shuffled)
  int64_t permuted(int64_t k) const;  // π(k) (shuffled)

  std::shared_ptr<const TokenSplit> split_;
  int64_t index_ = 0, count_ = 1, begin_ = 0, length_ = 0, batch_size_ = 0, seq_len_ = 0;
  DataOrder order_ = DataOrder::kContiguous;
  int64_t slots_ = 0;  // shuffled: n_s row slots
  uint64_t key_ = 0;   // shuffled: π's key for the cursor's epoch
  int half_bits_ = 1;  // shuffled: π works on 2·half_bits_ bits, the fewest with 2^bits ≥ n_s
  StreamCursor cursor_;
};

/// Stream `index` of `count` with the run's batch windows and layout: B = train.batch_size, T = model.seq_len,
/// data.order. Throws as the constructor does.
DataStream config_stream(std::shared_ptr<const TokenSplit> split, int64_t index, int64_t count, const Config& config,
                         StreamCursor cursor);

}  // namespace dloco
