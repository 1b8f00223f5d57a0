// JSON files on disk; see json_file.h.
#include "process/json_file.h"

#include <fstream>
#include <sstream>
#include <system_error>

#include "core/check.h"
#include "core/json_read.h"

namespace dloco {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(name + ": a folder, not a JSON file");
  std::ifstream in(path);
  if (!in) throw InputError(name + ": cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(name + ": cannot read the file");
  return parse_json(text.str(), name);
}

std::optional<nlohmann::json> try_read_json_file(const std::filesystem::path& path, std::string* why) {
  try {
    return read_json_file(path);
  } catch (const InputError& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

}  // namespace dloco
