#pragma once
// The keys of a training run of a ready model (models/*.hpp): strategy,
// precision, accumulation, optimizer, schedule, checkpoints, ... with their
// defaults. A ready model's config adds its own keys on top (struct
// MlpConfig : RunConfig). The examples read them from their command lines
// and YAML files (examples/common/cli.hpp declares the keys), and
// dtrain-estimate --config reads the same files with the same defaults.

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/train/options.hpp"

namespace dtrain::models {

struct RunConfig {
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
  std::string optimizer = "adamw";  // adamw | sgd | lion
  float lr = 1e-3f;
  float weight_decay = 0.f;
  float momentum = 0.9f;              // sgd only
  bool no_decay = true;               // no weight decay on biases and norms (no_decay_group())
  std::string schedule = "constant";  // constant | cosine | linear | inverse_sqrt
  std::int64_t warmup_steps = 0;
  std::string lr_scaling = "none";  // none | linear | sqrt
  float clip = 0.f;                 // max grad norm, 0 = off
  std::uint64_t seed = 0;
  int num_workers = 2;
  std::int64_t log_every = 20;
  std::string metrics;                         // JSONL path, rank 0 writes
  std::string tensorboard;                     // folder for TensorBoard events files, rank 0 writes ("": off)
  std::string save_params;                     // safetensors path, written at the end
  std::string checkpoint_dir = "checkpoints";  // where save_every and resume=latest look
  std::int64_t save_every = 0;                 // checkpoint every N steps and at the end (0: never)
  int keep_last = 0;                           // keep the newest K checkpoints (0: all)
  bool consolidated = false;                   // checkpoints also hold model.safetensors (fp32, Python-readable)
  std::string resume;                          // latest | a checkpoint directory ("" : start fresh)
  save_error_policy on_save_error = save_error_policy::stop;  // what a failed save does
  double straggler_factor = 1.5;  // progress lines name a rank computing this many times the median's (0: off)
  std::vector<std::string> preempt_signals{"TERM", "USR1"};  // signals that make every rank save and exit 75
  nonfinite_policy on_nonfinite = nonfinite_policy::stop;    // a step with an inf/NaN loss or gradient
  std::string init_from;                                     // initial weights from a safetensors file
  bool init_strict = true;                                   // false: load the matching tensors, list the rest
  bool activation_checkpointing = false;                     // recompute units' inner activations in backward
  std::int64_t checkpoint_every = 1;                         // of the units that keep activations, every k-th
  std::vector<std::int64_t> checkpoint_units;                // or exactly these
  double checkpoint_budget_mib = 0;                          // or the fewest that fit this budget (0: none)
  std::string dump_batches;                                  // a directory: every rank writes the batches it trained on
  double bucket_mb = 25;
  double timeout_s = 0;    // collective timeout in seconds (0: DTRAIN_COMM_TIMEOUT_S, else 600)
  double peak_tflops = 0;  // one rank's device peak (TFLOP/s): MFU in the progress line (0: not shown)
};

// The TrainerOptions the keys give: the offload (nvme:DIR: the optimizer
// state in files in DIR), the schedule, no weight decay on biases and norms,
// activation checkpointing. A config_error names a key out of range.
DTRAIN_DECL TrainerOptions trainer_options(const RunConfig& c);

}  // namespace dtrain::models

#if DTRAIN_DEFINE_IMPL
#include "dtrain/models/run_config.ipp"
#endif
