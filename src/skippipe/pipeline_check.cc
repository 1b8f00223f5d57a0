// The pre-flight checks of a SkipPipe pipeline; see pipeline_check.h.
#include "skippipe/pipeline_check.h"

#include "core/check.h"
#include "skippipe/simulator.h"

namespace dloco::skippipe {

CheckedPipeline load_checked_pipeline(const std::string& setting_path, const std::string& schedule_path,
                                      int64_t n_layer) {
  CheckedPipeline out;
  out.setting = load_setting(setting_path);
  out.schedule = load_schedule(schedule_path, out.setting);
  for (int64_t n = 0; n < out.setting.node_count(); ++n) {
    if (out.schedule.stage_of_node[static_cast<size_t>(n)] < 0) {
      throw InputError(schedule_path + ": the setting " + setting_path + " has " +
                       std::to_string(out.setting.node_count()) + " nodes but node " + std::to_string(n) +
                       " is in no stage of the schedule's placement (one process per node)");
    }
  }
  const auto S = static_cast<int64_t>(out.schedule.placement.size());
  if (n_layer % S != 0) {
    throw InputError(schedule_path + ": " + std::to_string(S) + " stages do not divide model.n_layer = " +
                     std::to_string(n_layer) + " (each stage holds n_layer / S blocks)");
  }
  out.iteration_time_s = simulate_exact(out.setting, out.schedule).iteration_time_s;  // throws on a deadlock
  return out;
}

CheckedPipeline check_skippipe_learner(const Config& c, const ParallelConfig& g, const std::string& key) {
  CheckedPipeline out = load_checked_pipeline(g.skippipe_setting, g.skippipe_schedule, c.model.n_layer);
  if (g.skippipe_nodes != out.setting.node_count()) {
    throw InputError("config: " + key + ".skippipe_nodes = " + std::to_string(g.skippipe_nodes) + " but the setting '" +
                     g.skippipe_setting + "' has " + std::to_string(out.setting.node_count()) +
                     " nodes (leave skippipe_nodes out: it is read from the setting)");
  }
  const auto W = static_cast<int64_t>(out.schedule.micro_batches.size());
  if (W != c.train.grad_accum) {
    throw InputError("config: " + key + ".skippipe_schedule = '" + g.skippipe_schedule + "' routes " +
                     std::to_string(W) + " micro-batches per step but train.grad_accum = " +
                     std::to_string(c.train.grad_accum) + ": a SkipPipe learner's step is one window of " +
                     "train.batch_size sequences per micro-batch, so set train.grad_accum = " + std::to_string(W));
  }
  return out;
}

}  // namespace dloco::skippipe
