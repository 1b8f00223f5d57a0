// The SkipPipe path scheduler (docs/skippipe.md, "Scheduler"): given a setting and a placement (stage -> nodes,
// given or searched), it produces a schedule — one path and one injection time per micro-batch — that the
// simulators (simulator.h) accept, under these rules:
//   * stage 0 holds the data nodes and is never skipped; a path visits P = round(S·(1 − k)) stages including stage 0
//     (skip ratio k), i.e. P − 1 distinct non-zero stages, in increasing order or with at most `max_swaps` inversions
//     (each one an exchange of two neighbours in the visiting order);
//   * every non-zero stage gets exactly the same number of micro-batch visits (enforced; impossible arithmetic is
//     refused with InputError);
//   * no node lies on more than C routes (a route is one node sequence; the micro-batches of one data node are cut
//     into G equal groups and a group shares its route, as the reference's agents do);
//   * collision awareness: candidates are scored by the exact simulator (queues, memory C), so two micro-batches
//     that would meet on one node are charged the wait.
// The search: a network-aware greedy construction (per group, the cheapest feasible route by dynamic programming
// over the stages, with a load penalty, the data node with the most expensive best route first), then simulated
// annealing whose moves keep every constraint — another replica for one hop, two groups exchanging a stage (and
// their nodes there), an adjacent swap when allowed, a shifted injection time, two micro-batches exchanging routes —
// scored by the simulated (makespan, sum of finish times); with score_mode = reference, the second half of the moves
// polishes in the reference model. Micro-batch ids are 0 … M − 1 (distinct modulo 100 while M ≤ 100, so the
// reference model's id-based hold-back never fires: docs/skippipe.md, "Scheduler").
// Deterministic: std::mt19937_64 and integer draws by rejection (no std:: distributions), no unordered containers,
// no clock in any decision — a seconds budget only cuts the iteration count short.
// Also here: the baselines from the same code (the full pipeline and the network-oblivious skip schedule) and a
// placement search scored by the simulator on greedy schedules.
// Deliberately not here: the file formats (schedule.h), the simulators (simulator.h), flag parsing (apps/).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "skippipe/schedule.h"
#include "skippipe/setting.h"
#include "skippipe/simulator.h"

namespace dloco::skippipe {

/// What to schedule and how hard to search. Defaults: the reference's 33% skip, C from the setting.
struct SchedulerOptions {
  int stages = 0;                       // S, when no placement is given (the placement search's stage count)
  double skip = 1.0 / 3.0;              // k in [0, 1): a path visits round(S·(1 − k)) stages including stage 0
  int64_t micro_batches_per_data_node = 6;  // N: micro-batches each data node injects per iteration
  int64_t data_nodes = 0;               // use the first D nodes of stage 0 as data nodes (0: all of them)
  int64_t memory = 0;                   // C: routes per node at most (0: the setting's memory_capacity)
  int64_t max_swaps = 0;                // inversions of the stage order allowed per path (0: increasing order)
  uint64_t seed = 1;                    // the search's random seed
  int64_t iterations = 20000;           // annealing moves, over all route groupings tried
  double budget_s = 0.0;                // > 0: stop the whole search (placement and paths) after about this much
                                        // wall time (CLI only: results then depend on machine speed); 0:
                                        // iterations alone decide
  int64_t placement_iterations = 1000;  // placement-search moves when no placement is given
  SimMode score_mode = SimMode::kExact;  // the simulator that scores candidates (both are reported)
  std::optional<std::vector<std::vector<int>>> placement;  // stage -> nodes; none: searched
};

/// A scheduler's answer: the schedule and how it was found.
struct SchedulerResult {
  Schedule schedule;
  double exact_s = 0.0;              // simulate_exact's iteration time
  double reference_s = 0.0;          // simulate_reference's iteration time
  int64_t groups_per_data_node = 0;  // G: routes per data node (micro-batches per route = N / G)
  int64_t iterations_run = 0;        // local-search moves evaluated
  int64_t improvements = 0;          // moves accepted with a strictly better score
  double wall_s = 0.0;               // search wall time (report only; never used in a decision)
};

/// Refuses option values no search can honour (negative counts, swaps, memory or budget; --stages disagreeing with
/// the placement) with an InputError naming the flag. Every entry point below calls it first.
void check_scheduler_options(const SchedulerOptions& options);

/// Stages per path including stage 0: round(S·(1 − k)). InputError when it leaves no non-zero stage or k is not in
/// [0, 1).
int64_t path_stage_count(int64_t stages, double skip);

/// The collision-aware SkipPipe scheduler (file header). Throws InputError when the options cannot be met: fewer
/// than 2 stages, a placement that does not fit the setting, visits that cannot be equal (total visits N·D·(P − 1)
/// not divisible by S − 1, or by the group count), a stage whose replicas cannot carry its routes within C, or no
/// route choice meeting every constraint.
SchedulerResult schedule_skippipe(const Setting& setting, const SchedulerOptions& options);

/// The full-pipeline baseline: min replica count r pipelines, pipeline p = node p of every non-zero stage; data node
/// i (of the first D) sends its N micro-batches on pipeline i mod r, injected 0.1 s apart (as the reference's
/// baseline). Needs a placement in the options; InputError otherwise.
SchedulerResult schedule_full_pipeline(const Setting& setting, const SchedulerOptions& options);

/// The network-oblivious skip baseline: the same arithmetic and constraints as schedule_skippipe (equal visits,
/// routes per node ≤ C), but stage subsets and replicas drawn at random with the seed, ignoring links and the
/// simulator. Same errors as schedule_skippipe.
SchedulerResult schedule_oblivious(const Setting& setting, const SchedulerOptions& options);

/// A placement for `options.stages` stages: stage 0 gets n − (S − 1)·⌊n/S⌋ nodes, every other stage ⌊n/S⌋; a
/// local search swapping two nodes of different stages, scored by the exact time of the greedy schedule, from a
/// region-clustered start. Deterministic for the seed. `budget_s` > 0 stops the swaps after that much wall time
/// (options.budget_s is the whole search's: schedule_skippipe gives the placement half of it). InputError when
/// S < 2 or ⌊n/S⌋ = 0.
std::vector<std::vector<int>> search_placement(const Setting& setting, const SchedulerOptions& options,
                                               double budget_s = 0.0);

/// Why `schedule` breaks the scheduler's rules for `options` (equal visits over the non-zero stages, P − 1 stages
/// per path, at most max_swaps inversions, at most C distinct routes per node), or "" when it keeps them all.
/// For tests and for the CLI's own check of what it writes.
std::string check_schedule_rules(const Schedule& schedule, const Setting& setting, const SchedulerOptions& options);

/// The JSON of a schedule in the format parse_schedule reads (schedule.h), notes included.
nlohmann::json schedule_to_json(const Schedule& schedule, const std::vector<std::string>& notes);

/// A uniform integer in [0, n) from `rng` by rejection (no std:: distribution, so the same on every library).
/// DLOCO_CHECK n > 0.
uint64_t draw_below(std::mt19937_64& rng, uint64_t n);

}  // namespace dloco::skippipe
