// The FNV-1a 64 of a file's bytes (core/hash.h), read whole: the tokenizer's hash in the handshake and the
// manifests. Here and not in core, which does no I/O.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/check.h"
#include "core/hash.h"

namespace dloco {

/// FNV-1a 64 of the bytes of `path`. Throws InputError "cannot read <what> '<path>'" if it cannot be opened.
inline uint64_t file_fnv1a64(const std::filesystem::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot read " + what + " '" + path.string() + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return fnv1a64(ss.str());
}

}  // namespace dloco
