// JSON files on disk, read with core/json_read.h's parse_json (duplicate keys refused): hand-written inputs (the
// SkipPipe setting and schedule) and files other processes write atomically (state.json, report.json, a node's
// result), which a reader may find absent or, if someone else wrote it, broken.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace dloco {

/// The JSON document in file `path`. Throws InputError "PATH: a folder, not a JSON file", "PATH: cannot open the
/// file", "PATH: cannot read the file", or parse_json's "PATH: not valid JSON (…)" / "PATH: duplicate key …".
nlohmann::json read_json_file(const std::filesystem::path& path);

/// read_json_file that does not throw: nullopt when the file is absent, unreadable or not valid JSON, with the
/// reason in `*why` when given. For a file another process writes (atomically) and this one polls.
std::optional<nlohmann::json> try_read_json_file(const std::filesystem::path& path, std::string* why = nullptr);

}  // namespace dloco
