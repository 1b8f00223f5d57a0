// What the fuzz targets share (fuzz/README.md): a scratch folder of this process and a file written from the
// fuzzer's bytes, for the decoders that read files (shards, stream logs, the syncer's store).
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace dloco::fuzz {

/// A folder of this process under the system's temp folder (created once, reused by every input).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("dloco_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

/// Writes `bytes` to `path` (truncating).
inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Aborts (a finding) with `what` when an invariant does not hold.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

/// The input as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Splits `in` at the first occurrence of `separator`: returns the part before it and leaves the rest in `in`
/// (all of `in`, and `in` empty, when there is none).
inline std::string_view take_until(std::string_view& in, std::string_view separator) {
  const size_t at = in.find(separator);
  if (at == std::string_view::npos) {
    std::string_view head = in;
    in = {};
    return head;
  }
  std::string_view head = in.substr(0, at);
  in.remove_prefix(at + separator.size());
  return head;
}

}  // namespace dloco::fuzz
