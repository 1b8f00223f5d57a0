// safetensors writer and validating reader.
#include "core/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/check.h"
#include "core/json_read.h"

namespace dloco {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; big-endian hosts are not supported");

namespace {

// A header larger than this is refused (the official implementation uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {
    {Dtype::kF64, "F64", 8}, {Dtype::kF32, "F32", 4}, {Dtype::kF16, "F16", 2}, {Dtype::kBF16, "BF16", 2},
    {Dtype::kI64, "I64", 8}, {Dtype::kI32, "I32", 4}, {Dtype::kI16, "I16", 2}, {Dtype::kI8, "I8", 1},
    {Dtype::kU8, "U8", 1},   {Dtype::kBool, "BOOL", 1},
};

const DtypeInfo& info(Dtype dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  DLOCO_CHECK(false && "unknown Dtype enumerator");
  return kDtypes[0];
}

// Product of a shape, refusing negative dimensions and overflow. `what` names the tensor in the message.
uint64_t shape_numel(const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw InputError(what + ": negative dimension " + std::to_string(d));
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d) / 8) throw InputError(what + ": shape too large");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

[[noreturn]] void refuse(std::string_view source, const std::string& problem) {
  throw InputError("not a valid safetensors file: " + std::string(source) + ": " + problem);
}

}  // namespace

size_t dtype_size(Dtype dtype) { return info(dtype).size; }
const char* dtype_name(Dtype dtype) { return info(dtype).name; }

Dtype parse_dtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  throw InputError("unknown safetensors dtype '" + std::string(name) + "'");
}

SafetensorsEntry f32_entry(std::string name, std::vector<int64_t> shape, std::span<const float> values) {
  return SafetensorsEntry{std::move(name), Dtype::kF32, std::move(shape), std::as_bytes(values)};
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> SafetensorsTensor::to_floats() const {
  const size_t n = static_cast<size_t>(numel());
  DLOCO_CHECK_EQ(n * dtype_size(dtype), data.size());
  std::vector<float> out(n);
  switch (dtype) {
    case Dtype::kF32:
      if (n) std::memcpy(out.data(), data.data(), n * 4);
      break;
    case Dtype::kF64:
      for (size_t i = 0; i < n; ++i) {
        double x;
        std::memcpy(&x, data.data() + 8 * i, 8);
        out[i] = static_cast<float>(x);
      }
      break;
    case Dtype::kBF16:
    case Dtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data.data() + 2 * i, 2);
        out[i] = dtype == Dtype::kBF16 ? bf16_to_float(bits) : f16_to_float(bits);
      }
      break;
    default:
      throw InputError("tensor '" + name + "' has dtype " + dtype_name(dtype) + ", not a floating-point type");
  }
  return out;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  const SafetensorsTensor* t = find(name);
  if (t == nullptr) throw InputError("safetensors file has no tensor named '" + std::string(name) + "'");
  return *t;
}

std::vector<std::byte> encode_safetensors(std::span<const SafetensorsEntry> tensors,
                                          const std::map<std::string, std::string>& metadata) {
  // 1. Header, tensors in the given order = offset order; __metadata__ first.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    if (t.name.empty()) throw InputError("safetensors: a tensor has an empty name");
    if (t.name == "__metadata__") throw InputError("safetensors: '__metadata__' is reserved, not a tensor name");
    if (!names.insert(t.name).second) throw InputError("safetensors: duplicate tensor name '" + t.name + "'");
    const uint64_t bytes = shape_numel(t.shape, "safetensors tensor '" + t.name + "'") * dtype_size(t.dtype);
    if (bytes != t.data.size()) {
      throw InputError("safetensors tensor '" + t.name + "': shape and dtype " + dtype_name(t.dtype) + " need " +
                       std::to_string(bytes) + " bytes, got " + std::to_string(t.data.size()));
    }
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // 2. Pad with spaces so the data starts 8-byte aligned (8 + header length ≡ 0 mod 8).
  text.append((8 - text.size() % 8) % 8, ' ');

  // 3. u64 LE header length, header, data.
  std::vector<std::byte> image(8 + text.size() + offset);
  const uint64_t header_len = text.size();
  std::memcpy(image.data(), &header_len, 8);
  std::memcpy(image.data() + 8, text.data(), text.size());
  size_t pos = 8 + text.size();
  for (const SafetensorsEntry& t : tensors) {
    if (!t.data.empty()) std::memcpy(image.data() + pos, t.data.data(), t.data.size());
    pos += t.data.size();
  }
  return image;
}


SafetensorsFile decode_safetensors(std::span<const std::byte> image, std::string_view source) {
  // 1. Header length.
  if (image.size() < 8) refuse(source, std::to_string(image.size()) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, image.data(), 8);
  if (header_len > kMaxHeaderBytes) refuse(source, "header length " + std::to_string(header_len) + " exceeds 100 MB");
  if (header_len > image.size() - 8) {
    refuse(source, "header length " + std::to_string(header_len) + " exceeds the " + std::to_string(image.size() - 8) +
                       " bytes after it (truncated file?)");
  }
  const uint64_t data_size = image.size() - 8 - header_len;
  const std::byte* data = image.data() + 8 + header_len;

  // 2. JSON header.
  const char* text = reinterpret_cast<const char*>(image.data() + 8);
  nlohmann::json header;
  try {
    header = parse_json(std::string_view(text, header_len), "header");  // a tensor named twice is refused too
  } catch (const InputError& e) {
    refuse(source, e.what());
  }
  if (!header.is_object()) refuse(source, "header is not a JSON object");

  SafetensorsFile file;
  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) refuse(source, "__metadata__ is not an object");
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) refuse(source, "__metadata__ value of '" + mkey + "' is not a string");
        file.metadata[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor '" + key + "'";
    if (!value.is_object()) refuse(source, what + " entry is not an object");
    for (const auto& [field, _] : value.items()) {
      if (field != "dtype" && field != "shape" && field != "data_offsets") refuse(source, what + " has unknown field '" + field + "'");
    }
    if (!value.contains("dtype") || !value["dtype"].is_string()) refuse(source, what + " has no dtype string");
    if (!value.contains("shape") || !value["shape"].is_array()) refuse(source, what + " has no shape array");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() || value["data_offsets"].size() != 2 ||
        !value["data_offsets"][0].is_number_unsigned() || !value["data_offsets"][1].is_number_unsigned()) {
      refuse(source, what + " has no data_offsets [begin, end] of unsigned integers");
    }
    SafetensorsTensor t;
    t.name = key;
    const std::string dtype = value["dtype"].get<std::string>();
    bool known = false;
    for (const DtypeInfo& d : kDtypes) {
      if (dtype == d.name) {
        t.dtype = d.dtype;
        known = true;
      }
    }
    if (!known) refuse(source, what + " has unknown dtype '" + dtype + "'");
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) refuse(source, what + " has a shape entry that is not an unsigned integer");
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    const uint64_t begin = value["data_offsets"][0].get<uint64_t>(), end = value["data_offsets"][1].get<uint64_t>();
    if (begin > end || end > data_size) {
      refuse(source, what + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                         "] out of range of the " + std::to_string(data_size) + " data bytes (truncated file?)");
    }
    uint64_t expected = 0;
    try {
      expected = shape_numel(t.shape, what) * dtype_size(t.dtype);
    } catch (const InputError& e) {
      refuse(source, e.what());
    }
    if (end - begin != expected) {
      refuse(source, what + " holds " + std::to_string(end - begin) + " bytes but its shape and dtype " + dtype +
                         " need " + std::to_string(expected));
    }
    ranges.push_back({begin, end, file.tensors.size()});
    file.tensors.push_back(std::move(t));
  }

  // 3. Offsets contiguous from 0 to the end of the data, no holes, no overlaps.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected_begin = 0;
  for (const Range& r : ranges) {
    if (r.begin != expected_begin) {
      refuse(source, "tensor '" + file.tensors[r.index].name + "' starts at byte " + std::to_string(r.begin) +
                         ", expected " + std::to_string(expected_begin) + " (offsets must be contiguous)");
    }
    expected_begin = r.end;
  }
  if (expected_begin != data_size) {
    refuse(source, "tensors cover " + std::to_string(expected_begin) + " data bytes but the file holds " +
                       std::to_string(data_size) + " (truncated or trailing bytes)");
  }

  // 4. Copy the data out, in offset order.
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(ranges.size());
  for (const Range& r : ranges) {
    SafetensorsTensor& t = file.tensors[r.index];
    t.data.assign(data + r.begin, data + r.end);
    ordered.push_back(std::move(t));
  }
  file.tensors = std::move(ordered);
  return file;
}


}  // namespace dloco
