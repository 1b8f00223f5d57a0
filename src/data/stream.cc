// Data streams with exact cursors; see stream.h.
#include "data/stream.h"

#include "core/check.h"
#include "core/json_read.h"

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
                       int64_t seq_len, StreamCursor cursor)
    : split_(std::move(split)), batch_size_(batch_size), seq_len_(seq_len), cursor_(cursor) {
  DLOCO_CHECK(split_ != nullptr);
  DLOCO_CHECK(index >= 0 && index < count);
  length_ = split_->size() / count;
  begin_ = index * length_;
  const int64_t window = batch_size * seq_len + 1;
  if (length_ < window) {
    throw InputError("data stream " + std::to_string(index) + " of " + std::to_string(count) + " holds " +
                     std::to_string(length_) + " tokens, fewer than one batch window of " + std::to_string(window) +
                     ": use fewer streams, a smaller batch, or more data");
  }
  if (cursor_.stream != index || cursor_.position + window > length_) {
    throw InputError("data stream cursor " + cursor_.to_json().dump() + " does not belong to stream " +
                     std::to_string(index) + " of length " + std::to_string(length_));
  }
}

void DataStream::next(std::span<int64_t> window) {
  const int64_t step = batch_size_ * seq_len_;
  DLOCO_CHECK_EQ(static_cast<int64_t>(window.size()), step + 1);
  split_->copy(begin_ + cursor_.position, window);
  skip();
}

void DataStream::skip() {
  const int64_t step = batch_size_ * seq_len_;
  cursor_.position += step;
  cursor_.tokens_served += step;
  if (cursor_.position + step + 1 > length_) {  // the next window would not fit: wrap
    cursor_.position = 0;
    cursor_.epoch += 1;
  }
}

}  // namespace dloco
