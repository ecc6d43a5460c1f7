#pragma once
// Command lines of the examples: dtrain::ConfigReader (the library's config
// reader) with the keys every example takes, declared here, and each
// example's own beside them. g++ only: yaml-cpp does not go through nvcc.
//
//   auto c = examples::parse_cli<gpt::Config>(argc, argv, "train_gpt", gpt::about,
//                                             [](dtrain::ConfigReader& r, gpt::Config& c) {
//                                               r.add("n_layer", c.n_layer, "transformer blocks");
//                                             },
//                                             [](const gpt::Config&) {});

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "common/config.hpp"
#include "common/dispatch.hpp"

#include <dtrain/models/lora_keys.hpp>
#include <dtrain/run/config.hpp>

namespace examples {

// "ddp | fsdp-full | ...": dtrain::builtin_strategies' names.
inline std::string strategy_names() {
  return []<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    std::string out;
    ((out += (out.empty() ? "" : " | ") + std::string(Kind::name)), ...);
    return out;
  }(std::type_identity<dtrain::builtin_strategies>{});
}

// Declares the keys every example takes.
inline void declare_common(dtrain::ConfigReader& r, Common& c) {
  r.add("strategy", c.strategy, strategy_names());
  r.add("shard_group", c.shard_group, "fsdp-hybrid: ranks per shard group (0 = the ranks of a node)");
  r.add("prefetch", c.prefetch, "fsdp-*, zero1: unit all-gathers issued ahead");
  r.add("offload", c.offload,
        "none | optimizer (master weights, optimizer state, fp32 gradients in host memory; any strategy) | params "
        "(the parameter shards too; fsdp-*) | nvme:DIR (as optimizer, the optimizer state in files in DIR)");
  r.add("device", c.device, "host | cuda");
  r.add("precision", c.precision, "fp32 | bf16 | fp16");
  r.add("reduce_dtype", c.reduce_dtype, "fp32 | same (reduce in the compute dtype)");
  r.add("accumulate", c.accumulate, "micro-batches per optimizer step");
  r.add("batch_size", c.batch_size, "rows per rank per micro-batch");
  r.add("steps", c.steps, "optimizer steps");
  r.add("optimizer", c.optimizer, "adamw | sgd | lion");
  r.add("lr", c.lr, "learning rate (the schedule's peak)");
  r.add("weight_decay", c.weight_decay, "weight decay");
  r.add("momentum", c.momentum, "sgd's momentum");
  r.add("no_decay", c.no_decay, "true: no weight decay on biases and norms; false: decay every parameter");
  r.add("schedule", c.schedule, "constant | cosine | linear | inverse_sqrt");
  r.add("warmup_steps", c.warmup_steps, "steps of linear warmup");
  r.add("lr_scaling", c.lr_scaling, "none | linear | sqrt: scale lr with the world size");
  r.add("clip", c.clip, "max gradient norm (0 = off)");
  r.add("seed", c.seed, "initialisation and shuffle seed");
  r.add("num_workers", c.num_workers, "data loader threads per rank");
  r.add("log_every", c.log_every, "a progress line every N steps");
  r.add("metrics", c.metrics, "JSONL file written by rank 0 (one object per step)");
  r.add("tensorboard", c.tensorboard,
        "a folder: rank 0 writes the same values as TensorBoard scalars (view with tensorboard --logdir)");
  r.add("save_params", c.save_params, "safetensors file written at the end (fp32, \"<unit>.<param>\")");
  r.add("checkpoint_dir", c.checkpoint_dir, "where checkpoints go, as step-<n> directories");
  r.add("save_every", c.save_every, "save a resumable checkpoint every N steps and at the end (0 = never)");
  r.add("keep_last", c.keep_last, "keep only the newest K checkpoints (0 = all)");
  r.add("consolidated", c.consolidated, "checkpoints also hold model.safetensors (fp32, readable by Python)");
  r.add("resume", c.resume, "latest (the newest complete checkpoint in checkpoint_dir) | a checkpoint directory");
  r.add("on_save_error", c.on_save_error, "a failed save (full disk) stops the run, or is reported",
        dtrain::save_error_policy_names);
  r.add("preempt_signals", c.preempt_signals,
        "signals that make every rank save a checkpoint and exit with 75 (TERM, USR1, USR2, INT, HUP)");
  r.check([&c] { dtrain::preemption_signal_numbers(c.preempt_signals); });
  r.add("straggler_factor", c.straggler_factor,
        "progress lines name a rank that computes this many times the median rank's time (0: off)");
  r.add("on_nonfinite", c.on_nonfinite,
        "a step with an inf/NaN loss or gradient stops the run, is skipped, or rolls back to the newest checkpoint "
        "and skips that step's batches",
        dtrain::nonfinite_policy_names);
  r.add("init_from", c.init_from, "initial weights from a safetensors file (F32/BF16/F16, \"<unit>.<param>\")");
  r.add("init_strict", c.init_strict, "false: load the tensors that match, list the rest");
  r.add("activation_checkpointing", c.activation_checkpointing, "true: recompute units' inner activations in backward");
  r.add("checkpoint_every", c.checkpoint_every,
        "with activation_checkpointing: recompute every k-th unit that keeps activations (2: every second block)");
  r.add("checkpoint_units", c.checkpoint_units,
        "with activation_checkpointing: recompute exactly these units, e.g. 2,3,4 (default: per checkpoint_every)");
  r.add("checkpoint_budget_mib", c.checkpoint_budget_mib,
        "with activation_checkpointing: recompute the fewest units for which what units keep for backward fits "
        "this many MiB per micro-batch (0: per checkpoint_every)");
  r.add("dump_batches", c.dump_batches,
        "a directory: each rank writes rank-<r>.safetensors with every micro-batch it trained on "
        "(\"<step>.<micro>.<tensor>\"), kept in memory until the end: for short runs");
  r.add("bucket_mb", c.bucket_mb, "ddp: gradient bucket size in MiB");
  r.add("timeout_s", c.timeout_s,
        "seconds a collective may wait before the job fails naming the missing ranks "
        "(0: DTRAIN_COMM_TIMEOUT_S, else 600)");
  r.add("peak_tflops", c.peak_tflops,
        "one rank's peak TFLOP/s: the progress line adds TFLOP/s per rank and MFU (0 = not shown)");
}

inline void validate_common(const Common& c) {
  auto require = [](bool ok, const std::string& what, const std::string& fix) {
    if (!ok) throw dtrain::config_error(what, fix);
  };
  check_strategy_name(c.strategy);
  require(c.shard_group >= 0, "shard_group must be >= 0", "set shard_group=K, K dividing the world size (0: a node)");
  require(c.prefetch >= 0, "prefetch must be >= 0", "set prefetch=1 (0: no look-ahead)");
  require(c.device == "host" || c.device == "cuda", "device = '" + c.device + "' is unknown", "use host or cuda");
  require(c.reduce_dtype == "fp32" || c.reduce_dtype == "same", "reduce_dtype = '" + c.reduce_dtype + "' is unknown",
          "use fp32 or same");
  require(c.optimizer == "adamw" || c.optimizer == "sgd" || c.optimizer == "lion",
          "optimizer = '" + c.optimizer + "' is unknown", "use adamw, sgd or lion");
  require(c.accumulate >= 1, "accumulate = " + std::to_string(c.accumulate) + " is not at least 1",
          "set accumulate=N, the micro-batches per optimizer step");
  require(c.batch_size >= 1, "batch_size = " + std::to_string(c.batch_size) + " is not at least 1",
          "set batch_size=B, the rows per rank per micro-batch");
  require(c.steps >= 1, "steps = " + std::to_string(c.steps) + " is not at least 1",
          "set steps=N, the optimizer steps to train");
  require(c.peak_tflops >= 0, "peak_tflops is negative",
          "set peak_tflops=P, one rank's peak TFLOP/s in the compute dtype (e.g. 989 for an H100's bf16), or 0");
  require(c.timeout_s >= 0 && c.timeout_s <= 86400 * 7, "timeout_s is out of range (0 to 604800 seconds)",
          "set timeout_s=S, the seconds a collective may wait (e.g. 60; 0: DTRAIN_COMM_TIMEOUT_S, else 600)");
  require(c.log_every >= 1, "log_every must be at least 1", "set log_every=20");
  require(c.save_every >= 0 && c.keep_last >= 0, "save_every and keep_last must be >= 0",
          "set save_every=N to checkpoint every N steps, keep_last=K to keep the newest K");
  // The non-throwing exists(): a path the system refuses to look up (a name
  // too long, a file where a folder should be) is a usage error naming the
  // key, not an escaped std::filesystem_error (found by fuzzing).
  std::error_code looked;
  const bool resume_ok = c.resume.empty() || c.resume == "latest" || std::filesystem::exists(c.resume, looked);
  require(resume_ok,
          "resume = '" + c.resume + "' is neither latest nor an existing directory" +
              (looked ? " (" + looked.message() + ")" : ""),
          "use resume=latest (the newest checkpoint in checkpoint_dir) or a checkpoint's path");
}

// The LoRA keys of the language-model examples (dtrain::models::LoraKeys),
// with each example's words for the rank, the targets and modules_to_save.
struct LoraHelp {
  const char* rank;
  const char* targets;
  const char* modules_to_save;
};

inline void declare_lora(dtrain::ConfigReader& r, dtrain::models::LoraKeys& c, const LoraHelp& help) {
  r.add("lora_r", c.lora_r, help.rank);
  r.add("lora_alpha", c.lora_alpha, "adapter scale alpha / r");
  r.add("lora_rslora", c.lora_rslora, "scale alpha / sqrt(r) instead (rank-stabilised LoRA)");
  r.add("lora_dropout", c.lora_dropout, "dropout on the adapters' input in training, in [0, 1) (PEFT's lora_dropout)");
  r.add("lora_targets", c.lora_targets, help.targets);
  r.add("lora_modules_to_save", c.lora_modules_to_save, help.modules_to_save);
}

// checkpoint_modules (recompute the units of these modules: hf::units_named)
// needs activation checkpointing and is one way of choosing the units.
inline void validate_checkpoint_modules(const Common& c, const std::vector<std::string>& modules) {
  if (!modules.empty() && !c.activation_checkpointing)
    throw dtrain::config_error("checkpoint_modules without activation_checkpointing=true",
                               "add activation_checkpointing=true");
  if (!modules.empty() && (!c.checkpoint_units.empty() || c.checkpoint_every != 1 || c.checkpoint_budget_mib != 0))
    throw dtrain::config_error(
        "checkpoint_modules and checkpoint_units/checkpoint_every/checkpoint_budget_mib "
        "both choose the recomputed units",
        "give one of them");
}

// Parses the command line into a Config (Common + the example's keys):
// `declare_extra(reader, config)` declares the example's own keys,
// `validate_extra(config)` checks them. --help prints every key and exits.
template <class Config, class DeclareExtra, class ValidateExtra>
Config parse_cli(int argc, char** argv, std::string_view program, std::string_view about, DeclareExtra&& declare_extra,
                 ValidateExtra&& validate_extra) {
  Config c;
  dtrain::ConfigReader reader{std::string(program), std::string(about)};
  reader.section("Keys of " + std::string(program));
  declare_extra(reader, c);
  reader.section("Keys every example takes");
  declare_common(reader, c);
  if (!reader.parse(argc, argv)) std::exit(0);
  validate_common(c);
  validate_extra(c);
  return c;
}

}  // namespace examples
