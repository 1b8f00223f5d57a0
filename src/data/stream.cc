// Data streams with exact cursors; see stream.h.
#include "data/stream.h"

#include <algorithm>

#include "core/check.h"
#include "core/json_read.h"
#include "core/splitmix.h"

namespace dloco {

nlohmann::json StreamCursor::to_json() const {
  return {{"stream", stream}, {"position", position}, {"epoch", epoch}, {"tokens_served", tokens_served}};
}

StreamCursor StreamCursor::from_json(const nlohmann::json& j) {
  StreamCursor c;
  try {
    c.stream = json_integer(j.at("stream"), "malformed data stream cursor: stream");
    c.position = json_integer(j.at("position"), "malformed data stream cursor: position");
    c.epoch = json_integer(j.at("epoch"), "malformed data stream cursor: epoch");
    c.tokens_served = json_integer(j.at("tokens_served"), "malformed data stream cursor: tokens_served");
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("malformed data stream cursor: ") + e.what());
  }
  if (c.stream < 0 || c.position < 0 || c.epoch < 0 || c.tokens_served < 0) {
    throw InputError("malformed data stream cursor: negative field in " + j.dump());
  }
  return c;
}

DataStream::DataStream(std::shared_ptr<const TokenSplit> split, int64_t index, int64_t count, int64_t batch_size,
                       int64_t seq_len, StreamCursor cursor, DataOrder order)
    : split_(std::move(split)), index_(index), count_(count), batch_size_(batch_size), seq_len_(seq_len),
      order_(order), cursor_(cursor) {
  DLOCO_CHECK(split_ != nullptr);
  DLOCO_CHECK(index >= 0 && index < count);
  const int64_t step = batch_size * seq_len;
  const int64_t window = step + 1;  // the tokens a batch spans (contiguous)
  if (order_ == DataOrder::kShuffled) {
    const int64_t n = (split_->size() - 1) / seq_len;  // row slots of T tokens, each row one token past its slot
    slots_ = n > index ? (n - index + count - 1) / count : 0;
    length_ = slots_ / batch_size * step + 1;
    while ((uint64_t{1} << (2 * half_bits_)) < static_cast<uint64_t>(slots_)) ++half_bits_;
    if (slots_ < batch_size) {
      throw InputError("data stream " + std::to_string(index) + " of " + std::to_string(count) +
                       " (data.order = \"shuffled\") gets " + std::to_string(slots_) +
                       " row slots, fewer than one batch of B = " + std::to_string(batch_size) + ": the split's " +
                       std::to_string(split_->size()) + " tokens hold " + std::to_string(n) + " slots of T = " +
                       std::to_string(seq_len) + " tokens; use fewer streams, a smaller batch, or more data");
    }
  } else {
    length_ = split_->size() / count;
    begin_ = index * length_;
    if (length_ < window) {
      throw InputError("data stream " + std::to_string(index) + " of " + std::to_string(count) + " holds " +
                       std::to_string(length_) + " tokens, fewer than one batch window of " + std::to_string(window) +
                       ": use fewer streams, a smaller batch, or more data");
    }
  }
  if (cursor_.stream != index || cursor_.position > length_ - window ||  // not position + window: it may overflow
      (order_ == DataOrder::kShuffled && cursor_.position % step != 0)) {
    throw InputError("data stream cursor " + cursor_.to_json().dump() + " does not belong to stream " +
                     std::to_string(index) + " of length " + std::to_string(length_) + " (batch windows of " +
                     std::to_string(step) + " tokens)");
  }
  draw_permutation();
}

void DataStream::draw_permutation() {
  if (order_ != DataOrder::kShuffled) return;
  key_ = splitmix64(splitmix64(static_cast<uint64_t>(index_)) ^ static_cast<uint64_t>(cursor_.epoch));
}

// π(k): a 4-round Feistel network on 2·half_bits_ bits keyed by key_, walked until it lands below n_s (a bijection
// of [0, 2^bits) restricted by cycle-walking is a bijection of [0, n_s); 2^bits < 4·n_s, so under 4 walks expected).
int64_t DataStream::permuted(int64_t k) const {
  DLOCO_CHECK(k >= 0 && k < slots_);  // else the walk never lands in range: the bits above 2·half_bits_ stay set
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  auto x = static_cast<uint64_t>(k);
  do {
    uint64_t left = x >> half_bits_, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = splitmix64(right ^ splitmix64(key_ + round)) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<uint64_t>(slots_));
  return static_cast<int64_t>(x);
}

int64_t DataStream::row_begin(int64_t r) const {
  DLOCO_CHECK(r >= 0 && r < batch_size_);
  if (order_ != DataOrder::kShuffled) return begin_ + cursor_.position + r * seq_len_;
  const int64_t k = cursor_.position / (batch_size_ * seq_len_);
  return (index_ + count_ * permuted(k * batch_size_ + r)) * seq_len_;
}

void DataStream::next(std::span<int64_t> window) {
  const int64_t row = seq_len_ + 1;
  DLOCO_CHECK_EQ(static_cast<int64_t>(window.size()), window_tokens(batch_size_, seq_len_));
  if (order_ != DataOrder::kShuffled) {
    // B·T + 1 consecutive tokens, then spread into rows from the back (row r starts at r·T of them, lands at r·(T+1))
    split_->copy(row_begin(0), window.first(static_cast<size_t>(batch_size_ * seq_len_ + 1)));
    for (int64_t r = batch_size_ - 1; r > 0; --r) {
      std::copy_backward(window.begin() + r * seq_len_, window.begin() + r * seq_len_ + row,
                         window.begin() + r * row + row);
    }
  } else {
    for (int64_t r = 0; r < batch_size_; ++r) {
      split_->copy(row_begin(r), window.subspan(static_cast<size_t>(r * row), static_cast<size_t>(row)));
    }
  }
  skip();
}

void DataStream::skip() {
  const int64_t step = batch_size_ * seq_len_;
  cursor_.position += step;
  cursor_.tokens_served += step;
  if (cursor_.position + step + 1 > length_) {  // the next window would not fit: wrap
    cursor_.position = 0;
    cursor_.epoch += 1;
    draw_permutation();
  }
}

DataStream config_stream(std::shared_ptr<const TokenSplit> split, int64_t index, int64_t count, const Config& config,
                         StreamCursor cursor) {
  return DataStream(std::move(split), index, count, config.train.batch_size, config.model.seq_len, cursor,
                    config.data.order);
}

}  // namespace dloco
