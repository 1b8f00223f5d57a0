// Fuzz target: safetensors images (core/safetensors.h decode_safetensors: checkpoints, the syncer's fragment
// files, `dloco generate` and `eval` inputs). Input: the file's bytes. Refused with InputError or parsed; a
// parsed file's tensors are then read as floats where they are floats and encoded again, which must give an
// image that decodes to the same tensors.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "core/check.h"
#include "core/safetensors.h"

using namespace dloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SafetensorsFile file;
  try {
    file = decode_safetensors(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz");
  } catch (const InputError&) {
    return 0;
  }
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : file.tensors) {
    try {
      if (static_cast<int64_t>(t.to_floats().size()) != t.numel()) std::abort();
    } catch (const InputError&) {  // an integer dtype
    }
    entries.push_back({t.name, t.dtype, t.shape, t.data});
  }
  std::vector<std::byte> image;
  try {
    image = encode_safetensors(entries, file.metadata);
  } catch (const InputError& e) {
    std::fprintf(stderr, "a decoded file does not encode again: %s\n", e.what());
    std::abort();
  }
  const SafetensorsFile again = decode_safetensors(image, "re-encoded");
  if (again.tensors.size() != file.tensors.size()) std::abort();
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    if (again.tensors[i].data != file.tensors[i].data || again.tensors[i].shape != file.tensors[i].shape) std::abort();
  }
  return 0;
}
