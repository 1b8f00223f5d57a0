// safetensors files on disk: core/safetensors.h's in-memory image written atomically and read back. The format
// (and every check of it) is core/safetensors.h; this file only adds the file I/O.
#pragma once

#include <filesystem>
#include <map>
#include <span>
#include <string>

#include "core/safetensors.h"

namespace dloco {

/// encode_safetensors + write_file_atomically. Throws InputError as those do.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Reads and parses `path`; throws InputError if it cannot be read or decode_safetensors refuses it.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

}  // namespace dloco
