#pragma once
// What train_mlp, train_gpt and train_policy share: the keys every example
// takes (strategy, precision, accumulation, optimizer, checkpoints, ...), and
// the TrainerOptions they make. Each example adds its own keys on top
// (examples/<name>/...: struct Config : examples::Common).
//
// This header is free of yaml-cpp: nvcc compiles the CUDA training code that
// includes it (examples/common/cli.hpp parses, in g++-only files).

#include <dtrain/run/preemption.hpp>
#include <dtrain/trainer.hpp>

#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace examples {

struct Common {
  std::string strategy = "ddp";       // ddp | fsdp-full | fsdp-grad-op | fsdp-no-shard | fsdp-hybrid | zero1
  int shard_group = 0;                // fsdp-hybrid: ranks per shard group (0: the ranks of a node)
  int prefetch = 1;                   // fsdp-*, zero1: unit all-gathers issued ahead
  std::string offload = "none";       // none | optimizer | params | nvme:DIR: model states off the device
  std::string precision = "fp32";     // fp32 | bf16 | fp16
  std::string reduce_dtype = "fp32";  // fp32 | same (reduce in the compute dtype)
  int accumulate = 1;                 // micro-batches per optimizer step (>= 1)
  std::string device = "host";        // host | cuda
  std::int64_t batch_size = 64;       // per rank, per micro-batch
  std::int64_t steps = 300;
  std::string optimizer = "adamw";    // adamw | sgd | lion
  float lr = 1e-3f;
  float weight_decay = 0.f;
  float momentum = 0.9f;              // sgd only
  bool no_decay = true;               // no weight decay on biases and norms (dtrain::no_decay_group())
  std::string schedule = "constant";  // constant | cosine | linear | inverse_sqrt
  std::int64_t warmup_steps = 0;
  std::string lr_scaling = "none";    // none | linear | sqrt
  float clip = 0.f;                   // max grad norm, 0 = off
  std::uint64_t seed = 0;
  int num_workers = 2;
  std::int64_t log_every = 20;
  std::string metrics;                // JSONL path, rank 0 writes
  std::string tensorboard;            // folder for TensorBoard events files, rank 0 writes ("": off)
  std::string save_params;            // safetensors path, written at the end
  std::string checkpoint_dir = "checkpoints";  // where save_every and resume=latest look
  std::int64_t save_every = 0;        // checkpoint every N steps and at the end (0: never)
  int keep_last = 0;                  // keep the newest K checkpoints (0: all)
  bool consolidated = false;          // checkpoints also hold model.safetensors (fp32, Python-readable)
  std::string resume;                 // latest | a checkpoint directory ("" : start fresh)
  dtrain::save_error_policy on_save_error = dtrain::save_error_policy::stop;  // what a failed save does
  double straggler_factor = 1.5;      // progress lines name a rank computing this many times the median's (0: off)
  std::vector<std::string> preempt_signals{"TERM", "USR1"};  // signals that make every rank save and exit 75
  dtrain::nonfinite_policy on_nonfinite = dtrain::nonfinite_policy::stop;  // a step with an inf/NaN loss or gradient
  std::string init_from;              // initial weights from a safetensors file
  bool init_strict = true;            // false: load the matching tensors, list the rest
  bool activation_checkpointing = false;  // recompute units' inner activations in backward
  std::int64_t checkpoint_every = 1;      // of the units that keep activations, every k-th
  std::vector<std::int64_t> checkpoint_units;  // or exactly these
  double checkpoint_budget_mib = 0;       // or the fewest that fit this budget (0: none)
  std::string dump_batches;           // a directory: every rank writes the batches it trained on
  double bucket_mb = 25;
  double timeout_s = 0;               // collective timeout in seconds (0: DTRAIN_COMM_TIMEOUT_S, else 600)
  double peak_tflops = 0;             // one rank's device peak (TFLOP/s): MFU in the progress line (0: not shown)
};

inline dtrain::TrainerOptions trainer_options(const Common& c) {
  dtrain::TrainerOptions o;
  // offload=nvme:DIR: the optimizer state offloaded, in files in DIR.
  if (c.offload.starts_with("nvme:")) {
    o.offload = dtrain::offload_kind::optimizer;
    o.offload_dir = c.offload.substr(5);
    if (o.offload_dir.empty())
      throw dtrain::config_error("offload=nvme: names no directory", "write offload=nvme:DIR, DIR on a local disk");
  } else {
    o.offload = dtrain::parse_offload(c.offload);
  }
  o.seed = c.seed;
  o.clip.max_norm = c.clip;
  // rollback: the Trainer stops on the step, fit rolls back (examples/common/loop.hpp).
  o.on_nonfinite = c.on_nonfinite == dtrain::nonfinite_policy::skip ? dtrain::nonfinite_policy::skip
                                                                     : dtrain::nonfinite_policy::stop;
  o.lr_scaling = c.lr_scaling == "linear" ? dtrain::lr_scaling_rule::linear
                 : c.lr_scaling == "sqrt" ? dtrain::lr_scaling_rule::sqrt
                                          : dtrain::lr_scaling_rule::none;
  const bool has_end = c.schedule == "cosine" || c.schedule == "linear";
  o.schedule = dtrain::make_schedule(c.schedule,
                                     {.lr = c.lr, .warmup_steps = c.warmup_steps, .total_steps = has_end ? c.steps : 0});
  if (c.no_decay && c.weight_decay > 0) o.param_groups = {dtrain::no_decay_group()};
  o.activation_checkpointing = c.activation_checkpointing;
  if (c.checkpoint_every < 1)
    throw dtrain::config_error("checkpoint_every=" + std::to_string(c.checkpoint_every) + " is below 1",
                               "give 1 (every unit) or more");
  o.checkpoint_every = static_cast<std::size_t>(c.checkpoint_every);
  for (const auto u : c.checkpoint_units) {
    if (u < 0) throw dtrain::config_error("checkpoint_units names unit " + std::to_string(u), "give unit numbers >= 0");
    o.checkpoint_units.push_back(static_cast<std::size_t>(u));
  }
  if (!(c.checkpoint_budget_mib >= 0))
    throw dtrain::config_error("checkpoint_budget_mib=" + std::to_string(c.checkpoint_budget_mib) + " is negative",
                               "give a budget in MiB, or 0 for none");
  o.checkpoint_budget_bytes = static_cast<std::size_t>(c.checkpoint_budget_mib * 1024.0 * 1024.0);
  if (c.checkpoint_budget_mib > 0 && o.checkpoint_budget_bytes == 0) o.checkpoint_budget_bytes = 1;
  if (!c.activation_checkpointing &&
      (c.checkpoint_every != 1 || !c.checkpoint_units.empty() || c.checkpoint_budget_mib != 0))
    throw dtrain::config_error("checkpoint_every/checkpoint_units/checkpoint_budget_mib without "
                               "activation_checkpointing=true",
                               "add activation_checkpointing=true");
  return o;
}

// Joins the job (dtrain::init) with the config's collective timeout, which
// wins over DTRAIN_COMM_TIMEOUT_S.
inline dtrain::World init_world(const Common& c) {
  // [snippet:preemption_start_up]
  // Preemption notices from here on are kept for dtrain::fit (which stops
  // after its first step, saves and returns preempted) instead of ending
  // the rank while it starts up: loading data, building the model. Never
  // destroyed, so a notice that comes as the program exits, its work done,
  // does not end it by the signal either. The signals are the ones fit watches.
  [[maybe_unused]] static const auto* start_up =
      new dtrain::PreemptionWatch(dtrain::preemption_signal_numbers(c.preempt_signals));
  // [/snippet:preemption_start_up]
  // Log lines reach the launcher (a pipe) and any file the job is redirected
  // to as they are printed, not when a 4 KiB buffer fills or the rank exits.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  dtrain::LaunchEnv env = dtrain::discover_env();
  if (c.timeout_s > 0) env.comm_timeout_s = c.timeout_s;
  return dtrain::init(env);
}

}  // namespace examples
