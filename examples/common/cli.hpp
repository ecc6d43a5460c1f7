#pragma once
// Command lines of the examples: `--config FILE.yaml` and `key=value`
// overrides, both through one setter per key, the common keys here and each
// example's own beside them. g++ only: yaml-cpp and range-v3 do not go
// through nvcc.
//
//   auto c = examples::parse_cli<gpt::Config>(argc, argv, "train_gpt", gpt::usage,
//                                             [](gpt::Config& c, const std::string& key, const YAML::Node& v) {
//                                               if (key == "n_layer") return c.n_layer = examples::as<int>(v, key), true;
//                                               return false;
//                                             });

#include <yaml-cpp/yaml.h>

#include <range/v3/algorithm/all_of.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/split.hpp>
#include <range/v3/view/transform.hpp>

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

namespace examples {

// What a key of type T takes, for messages.
template <class T>
constexpr const char* expected_form() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else return "a single value (not a list or a map)";
}

template <class T>
T as(const YAML::Node& n, std::string_view key) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    std::string value = n.IsScalar() ? n.Scalar() : n.IsSequence() ? "a list" : n.IsMap() ? "a map" : "nothing";
    if (n.IsScalar()) value = "'" + value + "'";
    throw dtrain::config_error("config key '" + std::string(key) + "' = " + value + " is not " + expected_form<T>(),
                               "give " + std::string(key) + " " + expected_form<T>() +
                                   " (examples/configs/ has every key in use)");
  }
}

// A list of integers, as a YAML sequence or "256,256".
inline std::vector<std::int64_t> int_list(const YAML::Node& v, std::string_view key) {
  if (v.IsSequence()) {
    std::vector<std::int64_t> out;
    for (const auto& w : v) out.push_back(as<std::int64_t>(w, key));
    return out;
  }
  const std::string text = as<std::string>(v, key);
  const auto to_int = [&](auto&& part) {
    const std::string s = part | ranges::to<std::string>();
    if (s.empty() || !ranges::all_of(s, [](char ch) { return ch >= '0' && ch <= '9'; }))
      throw dtrain::config_error(std::string(key) + " = '" + text + "' is not a list of integers",
                                 "write e.g. " + std::string(key) + "=256,256");
    return static_cast<std::int64_t>(std::stoll(s));
  };
  return text | ranges::views::split(',') | ranges::views::transform(to_int) | ranges::to<std::vector<std::int64_t>>();
}

// Sets a key every example takes; false for any other key.
inline bool set_common(Common& c, const std::string& key, const YAML::Node& v) {
  if (key == "strategy") c.strategy = as<std::string>(v, key);
  else if (key == "shard_group") c.shard_group = as<int>(v, key);
  else if (key == "prefetch") c.prefetch = as<int>(v, key);
  else if (key == "precision") c.precision = as<std::string>(v, key);
  else if (key == "reduce_dtype") c.reduce_dtype = as<std::string>(v, key);
  else if (key == "accumulate") c.accumulate = as<int>(v, key);
  else if (key == "device") c.device = as<std::string>(v, key);
  else if (key == "batch_size") c.batch_size = as<std::int64_t>(v, key);
  else if (key == "steps") c.steps = as<std::int64_t>(v, key);
  else if (key == "optimizer") c.optimizer = as<std::string>(v, key);
  else if (key == "lr") c.lr = as<float>(v, key);
  else if (key == "weight_decay") c.weight_decay = as<float>(v, key);
  else if (key == "momentum") c.momentum = as<float>(v, key);
  else if (key == "schedule") c.schedule = as<std::string>(v, key);
  else if (key == "warmup_steps") c.warmup_steps = as<std::int64_t>(v, key);
  else if (key == "lr_scaling") c.lr_scaling = as<std::string>(v, key);
  else if (key == "clip") c.clip = as<float>(v, key);
  else if (key == "seed") c.seed = as<std::uint64_t>(v, key);
  else if (key == "num_workers") c.num_workers = as<int>(v, key);
  else if (key == "log_every") c.log_every = as<std::int64_t>(v, key);
  else if (key == "metrics") c.metrics = as<std::string>(v, key);
  else if (key == "tensorboard") c.tensorboard = as<std::string>(v, key);
  else if (key == "save_params") c.save_params = as<std::string>(v, key);
  else if (key == "checkpoint_dir") c.checkpoint_dir = as<std::string>(v, key);
  else if (key == "save_every") c.save_every = as<std::int64_t>(v, key);
  else if (key == "keep_last") c.keep_last = as<int>(v, key);
  else if (key == "consolidated") c.consolidated = as<bool>(v, key);
  else if (key == "resume") c.resume = as<std::string>(v, key);
  else if (key == "init_from") c.init_from = as<std::string>(v, key);
  else if (key == "init_strict") c.init_strict = as<bool>(v, key);
  else if (key == "activation_checkpointing") c.activation_checkpointing = as<bool>(v, key);
  else if (key == "dump_batches") c.dump_batches = as<std::string>(v, key);
  else if (key == "bucket_mb") c.bucket_mb = as<double>(v, key);
  else if (key == "timeout_s") c.timeout_s = as<double>(v, key);
  else if (key == "peak_tflops") c.peak_tflops = as<double>(v, key);
  else return false;
  return true;
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
  require(c.optimizer == "adamw" || c.optimizer == "sgd", "optimizer = '" + c.optimizer + "' is unknown",
          "use adamw or sgd");
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

// "ddp | fsdp-full | ...": dtrain::builtin_strategies' names.
inline std::string strategy_names() {
  return []<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    std::string out;
    ((out += (out.empty() ? "" : " | ") + std::string(Kind::name)), ...);
    return out;
  }(std::type_identity<dtrain::builtin_strategies>{});
}

// The keys every example takes after `strategy`, for --help.
inline constexpr const char* common_usage = R"(  shard_group   fsdp-hybrid: ranks per shard group (0 = the ranks of a node)
  prefetch      fsdp-*, zero1: unit all-gathers issued ahead (default 1)
  device        host | cuda
  precision     fp32 | bf16 | fp16       reduce_dtype fp32 | same
  accumulate    micro-batches per step   batch_size   per rank, per micro-batch
  steps         optimizer steps          optimizer    adamw | sgd
  lr, weight_decay, momentum (sgd), clip (max grad norm, 0 = off)
  schedule      constant | cosine        warmup_steps, lr_scaling none | linear | sqrt
  activation_checkpointing  true: recompute units' inner activations in backward
  seed, num_workers, log_every, bucket_mb
  timeout_s     seconds a collective may wait before the job fails naming the missing ranks
                (default: DTRAIN_COMM_TIMEOUT_S, else 600)
  peak_tflops   one rank's peak TFLOP/s: the progress line adds the model's TFLOP/s per rank
                (6 x parameters x tokens/s) and MFU, their share of the peak (0 = not shown)
  metrics       JSONL file written by rank 0 (one object per step)
  tensorboard   a folder: rank 0 writes the same values per step as TensorBoard scalars
                (a new events file per run; view with tensorboard --logdir FOLDER)
  save_params   safetensors file written at the end (fp32, "<unit>.<param>")
  checkpoint_dir  where checkpoints go (default checkpoints), as step-<n> directories
  save_every    save a resumable checkpoint every N steps and at the end (0 = never)
  keep_last     keep only the newest K checkpoints (0 = all)
  consolidated  true: checkpoints also hold model.safetensors (fp32, readable by Python)
  resume        latest (the newest complete checkpoint in checkpoint_dir) | a checkpoint directory
  init_from     initial weights from a safetensors file (F32/BF16/F16, "<unit>.<param>")
  init_strict   false: load the tensors that match, list the rest (default true)
  dump_batches  a directory: each rank writes rank-<r>.safetensors holding every micro-batch
                it trained on ("<step>.<micro>.<tensor>"), to replay the run elsewhere; the
                batches are kept in memory until the end: for short runs
)";

// Parses the command line into a Config (Common + the example's keys):
// `set_extra(config, key, value)` sets the example's own keys and returns
// false for a key it does not know; `validate_extra(config)` checks them.
template <class Config, class SetExtra, class ValidateExtra>
Config parse_cli(int argc, char** argv, std::string_view program, std::string_view usage, SetExtra&& set_extra,
                 ValidateExtra&& validate_extra) {
  Config c;
  auto set = [&](const std::string& key, const YAML::Node& v) {
    if (!set_common(c, key, v) && !set_extra(c, key, v))
      throw dtrain::config_error("unknown config key '" + key + "'",
                                 "run " + std::string(program) + " --help for the list of keys");
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fwrite(usage.data(), 1, usage.size(), stdout);
      std::fputs("Keys every example takes:\n", stdout);
      std::printf("  strategy      %s\n", strategy_names().c_str());
      std::fputs(common_usage, stdout);
      std::exit(0);
    }
    if (arg == "--config") {
      if (i + 1 >= argc) throw dtrain::config_error("--config needs a file", "pass --config FILE.yaml");
      YAML::Node root;
      const std::string file = argv[++i];
      try {
        root = YAML::LoadFile(file);
      } catch (const YAML::Exception& e) {
        throw dtrain::config_error("cannot read config '" + file + "': " + e.what(),
                                   "check the path and the YAML syntax");
      }
      if (!root.IsMap() && !root.IsNull())
        throw dtrain::config_error("config '" + file + "' is not a mapping of keys to values",
                                   "write one `key: value` per line (see examples/configs/)");
      for (const auto& kv : root) {
        if (!kv.first.IsScalar())
          throw dtrain::config_error("config '" + file + "' has a key that is not a plain name",
                                     "write one `key: value` per line (see examples/configs/)");
        set(kv.first.as<std::string>(), kv.second);
      }
      continue;
    }
    const auto eq = arg.find('=');
    if (eq == std::string::npos || eq == 0)
      throw dtrain::config_error("argument '" + arg + "' is neither --config FILE nor key=value",
                                 "run " + std::string(program) + " --help");
    YAML::Node value;
    try {
      value = YAML::Load(arg.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      throw dtrain::config_error("argument '" + arg + "': the value is not valid YAML: " + e.what(),
                                 "quote it, e.g. key='a: b', or write a plain value (numbers, names, 256,256)");
    }
    set(arg.substr(0, eq), value);
  }
  validate_common(c);
  validate_extra(c);
  return c;
}

}  // namespace examples
