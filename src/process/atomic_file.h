// Atomic file replacement: a reader sees either the old file or the complete new one, never a torn write
// (docs/protocol.md §7: "a checkpoint cut off mid-write is detected and skipped"). Used for safetensors
// checkpoints and JSON manifests.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

namespace dloco {

/// Writes `bytes` to `path` atomically and durably:
///  1. write a temporary file in the same directory (`<name>.tmp.<pid>.<n>`), 2. fsync it, 3. rename it over
///  `path`, 4. fsync the directory.
/// The directory must exist. On any failure the temporary file is removed and InputError is thrown naming the path
/// and the errno text; `path` is then left as it was.
void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes);

/// Same, for text (e.g. a JSON manifest).
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace dloco
