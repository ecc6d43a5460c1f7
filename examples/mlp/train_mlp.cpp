// train_mlp: trains an MLP classifier with dtrain on every rank it was
// launched with (dtrain-run, torchrun, srun, mpirun, or alone).
//
//   dtrain-run --nproc-per-node 2 train_mlp --config examples/configs/ddp_host.yaml steps=500 precision=bf16
//
// Compiled by g++ only: range-v3 and yaml-cpp stay out of the nvcc translation unit.

#include "mlp.hpp"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <range/v3/algorithm/all_of.hpp>
#include <range/v3/range/conversion.hpp>
#include <range/v3/view/split.hpp>
#include <range/v3/view/transform.hpp>
#include <string>
#include <string_view>

namespace mlp {
namespace {

std::vector<std::int64_t> parse_widths(const std::string& text) {
  const auto to_int = [&](auto&& part) {
    const std::string s = part | ranges::to<std::string>();
    if (s.empty() || !ranges::all_of(s, [](char ch) { return ch >= '0' && ch <= '9'; }))
      throw dtrain::config_error("hidden = '" + text + "' is not a list of widths", "write e.g. hidden=256,256");
    return static_cast<std::int64_t>(std::stoll(s));
  };
  return text | ranges::views::split(',') | ranges::views::transform(to_int) | ranges::to<std::vector<std::int64_t>>();
}

template <class T>
T as(const YAML::Node& n, std::string_view key) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    throw dtrain::config_error("config key '" + std::string(key) + "' has a value of the wrong type",
                               "see examples/configs/ for the expected forms");
  }
}

// One setter for both the YAML file and key=value overrides.
void set(Config& c, const std::string& key, const YAML::Node& v) {
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
  else if (key == "activation") c.activation = as<std::string>(v, key);
  else if (key == "num_workers") c.num_workers = as<int>(v, key);
  else if (key == "log_every") c.log_every = as<std::int64_t>(v, key);
  else if (key == "metrics") c.metrics = as<std::string>(v, key);
  else if (key == "save_params") c.save_params = as<std::string>(v, key);
  else if (key == "checkpoint_dir") c.checkpoint_dir = as<std::string>(v, key);
  else if (key == "save_every") c.save_every = as<std::int64_t>(v, key);
  else if (key == "keep_last") c.keep_last = as<int>(v, key);
  else if (key == "consolidated") c.consolidated = as<bool>(v, key);
  else if (key == "resume") c.resume = as<std::string>(v, key);
  else if (key == "init_from") c.init_from = as<std::string>(v, key);
  else if (key == "init_strict") c.init_strict = as<bool>(v, key);
  else if (key == "data") c.data = as<std::string>(v, key);
  else if (key == "samples") c.samples = as<std::int64_t>(v, key);
  else if (key == "features") c.features = as<std::int64_t>(v, key);
  else if (key == "classes") c.classes = as<std::int64_t>(v, key);
  else if (key == "bucket_mb") c.bucket_mb = as<double>(v, key);
  else if (key == "hidden") {
    if (v.IsSequence()) {
      c.hidden.clear();
      for (const auto& w : v) c.hidden.push_back(as<std::int64_t>(w, key));
    } else {
      c.hidden = parse_widths(as<std::string>(v, key));
    }
  } else {
    throw dtrain::config_error("unknown config key '" + key + "'", "run train_mlp --help for the list of keys");
  }
}

void validate(const Config& c) {
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
  require(c.batch_size >= 1 && c.steps >= 1, "batch_size and steps must be at least 1", "set positive values");
  require(!c.hidden.empty(), "hidden is empty", "give at least one hidden width, e.g. hidden=256");
  require(c.activation == "gelu" || c.activation == "relu", "activation = '" + c.activation + "' is unknown",
          "use gelu or relu");
  require(c.log_every >= 1, "log_every must be at least 1", "set log_every=20");
  require(c.save_every >= 0 && c.keep_last >= 0, "save_every and keep_last must be >= 0",
          "set save_every=N to checkpoint every N steps, keep_last=K to keep the newest K");
  require(c.resume.empty() || c.resume == "latest" || std::filesystem::exists(c.resume),
          "resume = '" + c.resume + "' is neither latest nor an existing directory",
          "use resume=latest (the newest checkpoint in checkpoint_dir) or a checkpoint's path");
}

constexpr const char* usage = R"(usage: train_mlp [--config FILE.yaml] [key=value ...]

Trains an MLP classifier on every rank this process was launched with.
Keys (YAML file and key=value overrides alike):
  strategy      ddp | fsdp-full | fsdp-grad-op | fsdp-no-shard | fsdp-hybrid | zero1
  shard_group   fsdp-hybrid: ranks per shard group (0 = the ranks of a node)
  prefetch      fsdp-*, zero1: unit all-gathers issued ahead (default 1)
  device        host | cuda
  precision     fp32 | bf16 | fp16       reduce_dtype fp32 | same
  accumulate    1 | 2 | 4 | 8            batch_size   per rank, per micro-batch
  steps         optimizer steps          optimizer    adamw | sgd
  lr, weight_decay, momentum (sgd), clip (max grad norm, 0 = off)
  schedule      constant | cosine        warmup_steps, lr_scaling none | linear | sqrt
  hidden        widths, e.g. [256, 256] or 256,256      activation gelu | relu
  seed, num_workers, log_every, bucket_mb
  metrics       JSONL file written by rank 0 (one object per step)
  save_params   safetensors file written by rank 0 at the end (fp32, "<unit>.<param>")
  checkpoint_dir  where checkpoints go (default checkpoints), as step-<n> directories
  save_every    save a resumable checkpoint every N steps and at the end (0 = never)
  keep_last     keep only the newest K checkpoints (0 = all)
  consolidated  true: checkpoints also hold model.safetensors (fp32, readable by Python)
  resume        latest (the newest complete checkpoint in checkpoint_dir) | a checkpoint directory
  init_from     initial weights from a safetensors file (F32/BF16/F16, "<unit>.<param>")
  init_strict   false: load the tensors that match, list the rest (default true)
  data          synthetic | FILE.safetensors (tensors x, y) | X.npy,Y.npy
  samples, features, classes   size of the synthetic task
)";

}  // namespace

Config load_config(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (arg == "--config") {
      if (i + 1 >= argc) throw dtrain::config_error("--config needs a file", "pass --config FILE.yaml");
      YAML::Node root;
      try {
        root = YAML::LoadFile(argv[++i]);
      } catch (const YAML::Exception& e) {
        throw dtrain::config_error(std::string("cannot read config '") + argv[i] + "': " + e.what(),
                                   "check the path and the YAML syntax");
      }
      for (const auto& kv : root) set(c, kv.first.as<std::string>(), kv.second);
      continue;
    }
    const auto eq = arg.find('=');
    if (eq == std::string::npos || eq == 0)
      throw dtrain::config_error("argument '" + arg + "' is neither --config FILE nor key=value",
                                 "run train_mlp --help");
    set(c, arg.substr(0, eq), YAML::Load(arg.substr(eq + 1)));
  }
  validate(c);
  return c;
}

dtrain::Dataset load_data(const Config& c) {
  if (c.data == "synthetic") return synthetic_dataset(c.samples, c.features, c.classes, c.seed);
  const auto comma = c.data.find(',');
  if (comma != std::string::npos) return dtrain::load_npy_dataset(c.data.substr(0, comma), c.data.substr(comma + 1));
  return dtrain::load_safetensors_dataset(c.data);
}

}  // namespace mlp

int main(int argc, char** argv) {
  try {
    const mlp::Config cfg = mlp::load_config(argc, argv);
    auto world = dtrain::init();
    const dtrain::Dataset data = mlp::load_data(cfg);
    std::int64_t classes = cfg.classes;
    if (cfg.data != "synthetic") {
      classes = 0;
      for (auto y : data.y) classes = std::max<std::int64_t>(classes, y + 1);
    }
    data.validate(classes);
    if (world.rank() == 0)
      std::printf("train_mlp: %d rank(s), strategy=%s device=%s precision=%s accumulate=%d batch=%lld/rank, %lld "
                  "samples x %lld features, %lld classes\n",
                  world.size(), cfg.strategy.c_str(), cfg.device.c_str(), cfg.precision.c_str(), cfg.accumulate,
                  static_cast<long long>(cfg.batch_size), static_cast<long long>(data.rows),
                  static_cast<long long>(data.features), static_cast<long long>(classes));
    if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
      return mlp::train_cuda(cfg, world, data, classes);
#else
      throw dtrain::config_error("this train_mlp was built without CUDA", "use device=host, or rebuild with CUDA");
#endif
    }
    return mlp::train_host(cfg, world, data, classes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: error: %s\n", e.what());
    return 1;
  }
}
