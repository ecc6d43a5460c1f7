#pragma once
// What every Trainer takes and reports, whatever its strategy: TrainerOptions
// (a strategy's own settings are its options struct, given beside these:
// DdpOptions, FsdpOptions, Zero1Options) and StepStats.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/device/device.hpp"
#include "dtrain/optim/config.hpp"
#include "dtrain/optim/param_groups.hpp"
#include "dtrain/optim/schedule.hpp"
#include "dtrain/policy/offload.hpp"

namespace dtrain {

// Dynamic loss scaling for fp16 (PyTorch GradScaler's defaults): a step whose
// gradients hold inf/NaN is skipped and the scale shrinks; after `window`
// good steps in a row it grows again.
struct LossScaleOptions {
  float initial = 65536.f;
  float growth = 2.f;
  float backoff = 0.5f;
  std::int64_t window = 2000;
};

// What a step with a non-finite loss or gradient norm does (fp16's loss
// scaling skips such steps on its own and lowers the scale, whatever this
// says). The norm is looked at when it is computed (grad_norm, clipping);
// otherwise the loss alone. The Trainer stops or skips; dtrain::fit
// (FitOptions::on_nonfinite) stops or rolls back to the last checkpoint.
enum class nonfinite_policy {
  stop,      // throw nonfinite_error naming the step and the first unit with a non-finite gradient (default)
  skip,      // the Trainer's: leave the parameters as they were (StepStats::skipped) and go on
  rollback,  // fit's: reload the newest checkpoint and skip the failed step's batches
};

// What dtrain::fit does when a checkpoint cannot be written (a full disk).
enum class save_error_policy {
  stop,        // throw checkpoint_error (default); the previous checkpoint is untouched
  keep_going,  // report it, count it (FitResult::failed_saves) and train on
};

// The names configs use for these (ConfigReader, the examples' keys).
inline constexpr std::pair<std::string_view, nonfinite_policy> nonfinite_policy_names[] = {
    {"stop", nonfinite_policy::stop}, {"skip", nonfinite_policy::skip}, {"rollback", nonfinite_policy::rollback}};
inline constexpr std::pair<std::string_view, save_error_policy> save_error_policy_names[] = {
    {"stop", save_error_policy::stop}, {"continue", save_error_policy::keep_going}};

struct TrainerOptions {
  std::uint64_t seed = 0;                              // parameter initialisation (checked equal on every rank)
  ClipOptions clip{};                                  // max_norm 0: no clipping
  std::optional<Schedule> schedule{};                  // absent: the optimizer's constant lr
  lr_scaling_rule lr_scaling = lr_scaling_rule::none;  // scales the schedule by the world size
  LossScaleOptions loss_scale{};
  // Drop the activations units keep from forward for backward (saved_size)
  // after each unit's forward and recompute them right before its backward:
  // one unit's worth of them in memory instead of every unit's, for one more
  // forward of each such unit; results are bit-identical.
  bool activation_checkpointing = false;
  // Which units activation checkpointing recomputes (the others keep their
  // activations), one of: every `checkpoint_every`-th of the units that keep
  // any (1: all of them; 2: every second transformer block); exactly the
  // unit numbers `checkpoint_units`; or, with `checkpoint_budget_bytes`, the
  // fewest units (largest first) for which what the units keep for backward
  // fits that many bytes per micro-batch (chosen per batch shape; a budget
  // below one unit's share is refused). train/recompute.hpp has the rule.
  std::size_t checkpoint_every = 1;
  std::vector<std::size_t> checkpoint_units{};
  std::size_t checkpoint_budget_bytes = 0;
  // Report StepStats::grad_norm every step. It costs a pass over the
  // gradients (and a scalar all-reduce under sharded strategies); false skips
  // it when nothing needs it, and grad_norm is then NaN. Clipping and fp16
  // loss scaling compute it regardless.
  bool grad_norm = true;
  // Parameters with their own lr and weight decay (optim/param_groups.hpp);
  // {no_decay_group()} is the usual recipe. Empty: one group.
  std::vector<ParamGroup> param_groups{};
  // Model states kept in host memory (policy/offload.hpp): what Offload<...>
  // sets in a Trainer's policies, or a program chooses at run time.
  nonfinite_policy on_nonfinite = nonfinite_policy::stop;
  offload_kind offload = offload_kind::none;
  // With an offload: keep the optimizer state in files in this directory (a
  // local NVMe disk) instead of host memory. Empty: host memory.
  std::filesystem::path offload_dir{};
};

struct StepStats {
  std::int64_t step = 0;  // optimizer steps taken, this one included
  // the step's loss: the sum over every counted target (the loss's count),
  // all ranks, divided by their number
  double loss = 0.0;
  float lr = 0.f;
  double grad_norm = 0.0;  // global L2 norm of the averaged gradient, before clipping
  bool skipped = false;    // inf/NaN loss or gradients: step not applied (fp16, or on_nonfinite = skip)
  float loss_scale = 1.f;
  std::int64_t samples = 0;     // samples in the step over all ranks (rows of "x")
  std::int64_t positions = 0;   // samples x sequence length (tokens for a language model)
  double count = 0.0;           // the loss normaliser over all ranks (samples, or targets not ignored)
  bool stop_requested = false;  // some rank called Trainer::request_stop before this step (the same on every rank)
  double step_ms = 0.0;
  double wait_ms = 0.0;     // of step_ms, this rank's time blocked waiting for host collectives (its peers)
  MemoryUsage memory;       // this rank's bytes by category on the compute device (Trainer::memory())
  MemoryUsage host_memory;  // offloaded states in host memory (Trainer::host_memory()); zero without offload
  // The loss's own figures (LossMetricSums: a preference loss's rewards),
  // each its sum over every rank divided by their count; none for most losses.
  struct Metric {
    std::string name;
    double value = 0;
    bool logged = false;  // also on fit's progress line
    std::string label{};  // its name there, when not `name`
  };
  std::vector<Metric> metrics;
};

}  // namespace dtrain
