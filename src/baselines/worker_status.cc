// status.json of the baselines' workers; see worker_status.h.
#include "baselines/worker_status.h"

#include <fstream>

#include "core/check.h"

namespace dloco {

nlohmann::json stamp_worker_status(nlohmann::json fields) {
  DLOCO_CHECK(fields.is_object());
  fields["format"] = kWorkerStatusFormat;
  fields["format_version"] = kWorkerStatusVersion;
  return fields;
}

nlohmann::json read_worker_status(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return nullptr;
  nlohmann::json status;
  try {
    status = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
  const auto format = status.is_object() ? status.find("format") : status.end();
  const auto version = status.is_object() ? status.find("format_version") : status.end();
  const bool ours = status.is_object() && format != status.end() && *format == kWorkerStatusFormat &&
                    version != status.end() && version->is_number_integer();
  if (ours && version->get<int64_t>() == kWorkerStatusVersion) return status;
  const std::string found = !ours ? std::string("no \"") + kWorkerStatusFormat + "\" format_version"
                                  : "format_version " + std::to_string(version->get<int64_t>());
  throw InputError("'" + file.string() + "' has " + found + ", but this dloco reads format_version " +
                   std::to_string(kWorkerStatusVersion) +
                   ": its workers ran another dloco build. Rebuild dloco (the launcher and the workers are the same "
                   "binary) and train into a fresh run.name");
}

}  // namespace dloco
