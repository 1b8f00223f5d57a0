// A SkipPipe pipeline as a learner's group (docs/skippipe.md "A SkipPipe learner"; issue 13 part 6): the rank
// engine (parallel/rank_engine.h) of one node, so that learner/group_inner_job.h drives the pipeline as it drives
// a tensor- or pipeline-parallel group and the syncer sees one learner. Rank r of the group is node r of the
// setting. A step is one SkipPipeNode iteration on the leader's W = train.grad_accum windows (row i = micro-batch
// i of the schedule); a parameter is gathered to the leader from the first node of the stage that holds it; a
// written fragment is set on every replica of its stage (the leader broadcasts it whole), so replicas stay bitwise
// equal. Deliberately not here: the dp baseline over SkipPipe learners (set_replicas refuses), re-routing around a
// dead node (a CollectiveError stops the learner; the launcher restarts its whole group).
#include <map>

#include "skippipe/engine.h"

#include "parallel/rank_engine_internal.h"
#include "skippipe/node.h"
#include "skippipe/pipeline_check.h"

namespace dloco {
namespace {

using namespace rank_engine_detail;

// The tag of gather_parameter's send, above every iteration tag (2·i + direction, i < W).
constexpr int kGatherTag = 1 << 24;

class SkipPipeEngine final : public RankEngine {
 public:
  SkipPipeEngine(GPT full, const ParallelConfig& parallel, const TrainConfig& train, Collective& group,
                 skippipe::CheckedPipeline checked)
      : checked_(std::move(checked)), group_(group), description_() {
    const ModelConfig cfg = full->config();
    node_ = std::make_unique<SkipPipeNode>(full, checked_.setting, checked_.schedule, group, train,
                                           LrSchedule{});  // unused: the leader gives every step its lr
    node_->set_link_time_scale(parallel.skippipe_link_scale);
    node_->set_compute_time_scale(parallel.skippipe_compute_scale);
    // Who holds each parameter: the first node of its stage (stage 0 for the embedding, final norm and head).
    const auto S = static_cast<int64_t>(checked_.schedule.placement.size());
    const int64_t per_stage = cfg.n_layer / S;
    for (const auto& item : full->named_parameters()) {
      const std::string& name = item.key();
      int64_t stage = 0;
      if (name.rfind("h.", 0) == 0) stage = std::stoll(name.substr(2, name.find('.', 2) - 2)) / per_stage;
      owner_[name] = checked_.schedule.placement[static_cast<size_t>(stage)].front();
      shape_[name] = item.value().sizes().vec();
    }
    held_ = node_->named_parameters();
    description_ = "SkipPipe pipeline of " + std::to_string(group.world()) + " nodes in " + std::to_string(S) +
                   " stages, " + std::to_string(checked_.schedule.micro_batches.size()) + " micro-batches per step (" +
                   parallel.skippipe_schedule + ")";
  }

  EngineStep step(const torch::Tensor& windows, double lr) override {
    const SkipIterationStats s = node_->run_iteration(windows, lr);
    return EngineStep{s.loss, s.grad_norm, s.skipped};
  }

  torch::Tensor gather_parameter(const std::string& name) override {
    auto it = owner_.find(name);
    if (it == owner_.end()) throw InputError("SkipPipe learner: no parameter '" + name + "'");
    const int owner = it->second, me = group_.rank();
    if (owner == 0) return me == 0 ? held_.at(name).detach().clone() : torch::Tensor();
    if (me == owner) {
      auto value = held_.at(name).detach().contiguous();
      group_.isend(value, 0, kGatherTag).wait();
      return torch::Tensor();
    }
    if (me != 0) return torch::Tensor();
    auto value = torch::empty(shape_.at(name));
    group_.recv(value, owner, kGatherTag);
    return value;
  }

  void set_parameter(const std::string& name, const torch::Tensor& full) override {
    if (owner_.find(name) == owner_.end()) throw InputError("SkipPipe learner: no parameter '" + name + "'");
    auto it = held_.find(name);
    if (it != held_.end()) copy_checked(it->second, full, name);
  }

  void save_state(const std::filesystem::path& file) override { save_adamw(node_->optimizer(), file); }
  void load_state(const std::filesystem::path& file) override { load_adamw(node_->optimizer(), file); }
  void reset_state() override { node_->reset_optimizer(); }

  void set_replicas(Collective* replicas) override {
    if (replicas != nullptr) {
      throw InputError("the dp baseline over SkipPipe learners is not built (diloco.mode = \"decoupled\" only)");
    }
  }
  std::string describe() const override { return description_; }

 private:
  skippipe::CheckedPipeline checked_;  // before node_: the node keeps references to its setting and schedule
  Collective& group_;
  std::unique_ptr<SkipPipeNode> node_;
  std::map<std::string, int> owner_;                  // parameter -> the node that gathers it to the leader
  std::map<std::string, std::vector<int64_t>> shape_;  // parameter -> its full-model shape
  std::map<std::string, torch::Tensor> held_;          // this node's parameters
  std::string description_;
};

}  // namespace

std::unique_ptr<RankEngine> make_skippipe_engine(GPT full, const ParallelConfig& parallel, const TrainConfig& train,
                                                 Collective& group) {
  Config c;  // only what check_skippipe_learner reads: the model's depth and the batch
  c.model = full->config();
  c.train = train;
  auto checked = skippipe::check_skippipe_learner(c, parallel, "parallel");
  return std::make_unique<SkipPipeEngine>(full, parallel, train, group, std::move(checked));
}

}  // namespace dloco
