// A file only its owner may read (mode 0600), written as process/atomic_file.h writes: the run's saved config.toml,
// which holds run.secret, the bearer token of every call (docs/protocol.md §12). Its own header so the many users of
// atomic_file.h do not rebuild.
#pragma once

#include <filesystem>
#include <string_view>

namespace dloco {

/// write_file_atomically with mode 0600 (owner read/write; the umask may only narrow it). Throws InputError naming
/// the path and the step that failed.
void write_private_file_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace dloco
