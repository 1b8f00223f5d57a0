// safetensors files on disk; see safetensors_file.h.
#include "process/safetensors_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/check.h"
#include "process/atomic_file.h"

namespace dloco {

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<std::byte> image = encode_safetensors(tensors, metadata);
  write_file_atomically(path, image);
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open safetensors file " + path.string() + ": " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw InputError("cannot read safetensors file " + path.string());
  return decode_safetensors(std::as_bytes(std::span<const char>(bytes)), path.string());
}

}  // namespace dloco
