// status.json of the baselines' workers; see worker_status.h.
#include "baselines/worker_status.h"

#include <fstream>
#include <string>

#include "core/check.h"

namespace dloco {

namespace fs = std::filesystem;

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

nlohmann::json worker_summaries(const fs::path& run_dir, int M) {
  nlohmann::json out = nlohmann::json::array();
  for (int rank = 0; rank < M; ++rank) {
    std::ifstream in(run_dir / "events" / ("worker_" + std::to_string(rank) + ".jsonl"));
    nlohmann::json last_stop = {{"rank", rank}};
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("\"stopped\"") == std::string::npos) continue;
      try {
        auto j = nlohmann::json::parse(line);
        last_stop = {{"rank", rank}, {"steps", j.value("step", 0)}, {"syncs", j.value("syncs", 0)},
                     {"wait_s", j.value("wait_s", 0.0)}, {"bytes_sent", j.value("bytes_sent", int64_t{0})}};
      } catch (const nlohmann::json::exception&) {
      }
    }
    // dp over learner groups: what ranks 1 … R − 1 sent to the same rank of the other workers (their own
    // group's traffic stays inside the worker) adds to the worker's bytes (docs/parallel.md).
    int64_t replica_bytes = 0;
    for (int r = 1;; ++r) {
      const fs::path file = run_dir / "events" / ("learner_" + std::to_string(rank) + "_rank_" + std::to_string(r) + ".jsonl");
      if (!fs::exists(file)) break;
      std::ifstream rank_in(file);
      int64_t last = 0;
      while (std::getline(rank_in, line)) {
        if (line.find("\"rank_stopped\"") == std::string::npos) continue;
        try {
          last = nlohmann::json::parse(line).value("replica_bytes_sent", int64_t{0});
        } catch (const nlohmann::json::exception&) {
        }
      }
      replica_bytes += last;
    }
    if (replica_bytes > 0) last_stop["bytes_sent"] = last_stop.value("bytes_sent", int64_t{0}) + replica_bytes;
    out.push_back(last_stop);
  }
  return out;
}

}  // namespace dloco
