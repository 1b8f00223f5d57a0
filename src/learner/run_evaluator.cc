// The evaluator process (issue: "one thread, low priority"): evaluates consistent snapshots of the global
// model Θ (taken under the syncer's lock, with their version vector) every train.eval_interval global steps
// and reports the validation loss to the syncer.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <thread>

#include <spdlog/spdlog.h>

#include "learner/learner.h"
#include "learner/link.h"
#include "process/events.h"
#include "train/fragment_io.h"
#include "train/threads.h"
#include "train/trainer.h"
#include "transport/codec.h"
#include "transport/handshake.h"

namespace dloco {

namespace fs = std::filesystem;

int run_evaluator(const Config& config, const LearnerOptions& options, wire::Transport& transport) {
  ::setpriority(PRIO_PROCESS, 0, 5);  // lower priority than the learners, which come first
  apply_thread_budget(ThreadBudget{1, 1});
  fs::create_directories(options.run_dir / "events");
  EventLog events(options.run_dir / "events" / "evaluator.jsonl", Role::kEvaluator, 0);
  TokenSplit val(split_shards(fs::path(config.data.dir), "val"));
  torch::manual_seed(config.run.seed);
  GPT model(config.model);
  const FragmentLayout layout = model_layout(model, config.diloco);
  const auto params = layout_parameters(model, layout);
  LearnerLink link(transport.connect_syncer(options.syncer), options.syncer, make_handshake(config, layout), -1,
                   "evaluator", config.run.seed ^ 0xE7A1u);
  link.join(options.bootstrap_timeout_s);
  spdlog::info("[evaluator] joined {}: the global model every {} global steps on {} validation tokens",
               options.syncer, static_cast<long long>(config.train.eval_interval),
               static_cast<long long>(config.train.eval_tokens));

  int64_t next_eval = config.train.eval_interval;
  auto heard = std::chrono::steady_clock::now();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const auto status = link.status();
    if (!status) {  // the syncer is away: try again, as long as a joiner would wait for it
      const double away = std::chrono::duration<double>(std::chrono::steady_clock::now() - heard).count();
      if (away < options.bootstrap_timeout_s) continue;
      // A syncer that finished and exited between two polls leaves its report: then nothing was missed.
      const bool finished = fs::exists(options.run_dir / "report.json");
      events.emit("syncer_lost", {{"away_s", away}, {"report", finished}});
      spdlog::warn("[evaluator] the syncer at {} has not answered for {:.0f} s: stopping ({})", options.syncer, away,
                   finished ? "the run finished, its report is written" : "no report: the syncer is gone");
      return finished ? 0 : 1;
    }
    heard = std::chrono::steady_clock::now();
    if (status->finished) break;
    if (config.train.eval_interval <= 0 || status->global_step < next_eval) continue;
    const auto t0 = std::chrono::steady_clock::now();
    const auto snap = link.snapshot();
    if (!snap) continue;
    std::vector<int64_t> versions;
    for (const auto& f : snap->fragments) {
      scatter_parameters(params, layout, f.fragment, wire::fragment_values(f));
      versions.push_back(f.version);
    }
    const double loss = evaluate_loss(model, val, config.train.eval_tokens, config.train.batch_size, torch::kCPU);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    link.report_eval({0, snap->global_step, loss, versions, secs});
    events.emit("eval", {{"global_step", snap->global_step}, {"val_loss", loss}, {"versions", versions},
                         {"seconds", secs}});
    spdlog::info("[evaluator] global step {}: validation loss {:.4f} (perplexity {:.1f}) on {} tokens, {:.1f} s",
                 static_cast<long long>(snap->global_step), loss, std::exp(loss),
                 static_cast<long long>(config.train.eval_tokens), secs);
    while (next_eval <= snap->global_step) next_eval += config.train.eval_interval;
  }
  return 0;
}

}  // namespace dloco
