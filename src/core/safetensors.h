// safetensors writer and reader (the checkpoint format, loadable by Python's safetensors and PyTorch).
//
// Format: 8-byte little-endian u64 N, then N bytes of a JSON header, then the raw little-endian data.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (byte offsets relative to
// the start of the data, contiguous, covering it without holes) and may hold "__metadata__", a string → string
// map. The writer lists tensors in offset order and pads the header with spaces to a multiple of 8 bytes so the
// data is aligned. Files are written atomically (process/atomic_file.h).
//
// The reader trusts nothing: every bound, offset, dtype and size is checked and a bad file is refused with an
// InputError naming the file and the problem. Only little-endian hosts are supported (checked at compile time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dloco {

enum class Dtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

/// Size of one element in bytes.
size_t dtype_size(Dtype dtype);
/// The safetensors name: "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL".
const char* dtype_name(Dtype dtype);
/// Parses a safetensors dtype name; throws InputError for an unknown one.
Dtype parse_dtype(std::string_view name);

/// A tensor to write: the bytes are borrowed, not copied, and must be shape-product × dtype_size long.
struct SafetensorsEntry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;  // {} is a scalar (1 element); a 0 anywhere gives an empty tensor
  std::span<const std::byte> data;
};

/// Convenience: an F32 entry viewing `values` (values.size() must equal the shape product).
SafetensorsEntry f32_entry(std::string name, std::vector<int64_t> shape, std::span<const float> values);

/// A tensor read from a file (owns its bytes).
struct SafetensorsTensor {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;

  int64_t numel() const;
  /// The values as fp32: exact for F32/BF16/F16, rounded for F64; InputError for integer dtypes.
  std::vector<float> to_floats() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // "__metadata__", empty if absent
  std::vector<SafetensorsTensor> tensors;       // in data-offset order

  /// The tensor named `name`, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
  /// The tensor named `name`; throws InputError naming it if absent.
  const SafetensorsTensor& at(std::string_view name) const;
};

/// Serialises to the in-memory file image. Throws InputError on an empty or duplicate name, the reserved name
/// "__metadata__", a negative dimension, or a data size that does not match shape × dtype.
std::vector<std::byte> encode_safetensors(std::span<const SafetensorsEntry> tensors,
                                          const std::map<std::string, std::string>& metadata = {});

/// Parses a file image. `source` names it in error messages (usually the path). Throws InputError if the image is
/// shorter than 8 bytes, the header length exceeds the image or 100 MB, the header is not valid JSON of the
/// expected form (or has a key twice: a tensor named twice), a dtype is unknown, a shape is negative, offsets are
/// not contiguous from 0 to the end of the data, or a tensor's byte length differs from shape product × dtype size.
SafetensorsFile decode_safetensors(std::span<const std::byte> image, std::string_view source = "<memory>");

}  // namespace dloco
