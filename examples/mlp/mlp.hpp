#pragma once
// The train_mlp example: configuration, model, data, and the dispatch from the
// config's strategy name to a compiled strategy (train_impl.hpp holds the
// training loop).

#include <dtrain/trainer.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace mlp {

struct Config {
  std::string strategy = "ddp";       // ddp | fsdp-full | fsdp-grad-op | fsdp-no-shard | fsdp-hybrid | zero1
  int shard_group = 0;                // fsdp-hybrid: ranks per shard group (0: the ranks of a node)
  int prefetch = 1;                   // fsdp-*, zero1: unit all-gathers issued ahead
  std::string precision = "fp32";     // fp32 | bf16 | fp16
  std::string reduce_dtype = "fp32";  // fp32 | same (reduce in the compute dtype)
  int accumulate = 1;                 // 1 | 2 | 4 | 8
  std::string device = "host";        // host | cuda
  std::int64_t batch_size = 64;       // per rank, per micro-batch
  std::int64_t steps = 300;
  std::string optimizer = "adamw";    // adamw | sgd
  float lr = 1e-3f;
  float weight_decay = 0.f;
  float momentum = 0.9f;              // sgd only
  std::string schedule = "constant";  // constant | cosine
  std::int64_t warmup_steps = 0;
  std::string lr_scaling = "none";    // none | linear | sqrt
  float clip = 0.f;                   // max grad norm, 0 = off
  std::uint64_t seed = 0;
  std::vector<std::int64_t> hidden = {256, 256};
  std::string activation = "gelu";    // gelu | relu
  int num_workers = 2;
  std::int64_t log_every = 20;
  std::string metrics;                // JSONL path, rank 0 writes
  std::string save_params;            // safetensors path, rank 0 writes at the end
  std::string checkpoint_dir = "checkpoints";  // where save_every and resume=latest look
  std::int64_t save_every = 0;        // checkpoint every N steps and at the end (0: never)
  int keep_last = 0;                  // keep the newest K checkpoints (0: all)
  bool consolidated = false;          // checkpoints also hold model.safetensors (fp32, Python-readable)
  std::string resume;                 // latest | a checkpoint directory ("" : start fresh)
  std::string init_from;              // initial weights from a safetensors file
  bool init_strict = true;            // false: load the matching tensors, list the rest
  // data: "synthetic", a .safetensors file with x and y, or "X.npy,Y.npy"
  std::string data = "synthetic";
  std::int64_t samples = 16384;       // synthetic
  std::int64_t features = 32;         // synthetic
  std::int64_t classes = 10;          // synthetic (files: 1 + the largest label)
  double bucket_mb = 25;
};

Config load_config(int argc, char** argv);  // train_mlp.cpp: --config FILE key=value...

// A network whose layer list comes from the config: Linear + activation per
// hidden width, then a Linear head, with softmax cross-entropy.
struct Model {
  std::vector<dtrain::nn::AnyUnit> layers;
  dtrain::nn::SoftmaxCrossEntropy loss;

  Model(const Config& c, std::int64_t features, std::int64_t classes) {
    std::int64_t in = features;
    for (auto h : c.hidden) {
      layers.emplace_back(dtrain::nn::Linear(in, h));
      if (c.activation == "relu")
        layers.emplace_back(dtrain::nn::ReLU{});
      else
        layers.emplace_back(dtrain::nn::GELU{});
      in = h;
    }
    layers.emplace_back(dtrain::nn::Linear(in, classes));
  }
  auto units() { return std::tie(layers); }
};

// A classification task a correct trainer visibly learns: x ~ N(0, 1), and
// the label is the argmax of a fixed random two-layer teacher network.
inline dtrain::Dataset synthetic_dataset(std::int64_t samples, std::int64_t features, std::int64_t classes,
                                         std::uint64_t seed) {
  const std::int64_t hidden = 64;
  std::vector<float> w1(static_cast<std::size_t>(features * hidden)), w2(static_cast<std::size_t>(hidden * classes));
  dtrain::init_values(w1, dtrain::Init::normal(0.f, 1.f / std::sqrt(static_cast<float>(features))), seed ^ 0x7e1);
  dtrain::init_values(w2, dtrain::Init::normal(0.f, 1.f / std::sqrt(static_cast<float>(hidden))), seed ^ 0x7e2);
  dtrain::Dataset d;
  d.rows = samples;
  d.features = features;
  d.x.resize(static_cast<std::size_t>(samples * features));
  dtrain::init_values(d.x, dtrain::Init::normal(0.f, 1.f), seed ^ 0xda7a);
  d.y.resize(static_cast<std::size_t>(samples));
  std::vector<float> h(static_cast<std::size_t>(hidden));
  for (std::int64_t r = 0; r < samples; ++r) {
    const float* x = &d.x[static_cast<std::size_t>(r * features)];
    for (std::int64_t j = 0; j < hidden; ++j) {
      float acc = 0;
      for (std::int64_t i = 0; i < features; ++i) acc += x[i] * w1[static_cast<std::size_t>(i * hidden + j)];
      h[static_cast<std::size_t>(j)] = std::tanh(acc);
    }
    std::int64_t best = 0;
    float best_v = -1e30f;
    for (std::int64_t c = 0; c < classes; ++c) {
      float acc = 0;
      for (std::int64_t j = 0; j < hidden; ++j) acc += h[static_cast<std::size_t>(j)] * w2[static_cast<std::size_t>(j * classes + c)];
      if (acc > best_v) best_v = acc, best = c;
    }
    d.y[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(best);
  }
  return d;
}

dtrain::Dataset load_data(const Config& c);  // train_mlp.cpp

// The strategies train_mlp offers; each name is Kind::name (strategy=...).
using Strategies = std::tuple<dtrain::DDP, dtrain::FSDP<dtrain::FullShard>, dtrain::FSDP<dtrain::ShardGradOp>,
                              dtrain::FSDP<dtrain::NoShard>, dtrain::FSDP<dtrain::HybridShard>, dtrain::ZeRO1>;

// Trains with strategy Kind on device Dev, in the precision and accumulation
// the config names. Defined in train_impl.hpp and explicitly instantiated
// once per (device, strategy) in generated translation units
// (examples/CMakeLists.txt), which the build compiles in parallel.
template <class Dev, class Kind>
int train_strategy(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes);

// Throws unless `name` is one of Strategies' names.
inline void check_strategy_name(const std::string& name) {
  std::string known;
  const bool found = [&]<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    ((known += (known.empty() ? "" : ", ") + std::string(Kind::name)), ...);
    return ((name == Kind::name) || ...);
  }(std::type_identity<Strategies>{});
  if (!found) throw dtrain::config_error("strategy = '" + name + "' is unknown", "use one of " + known);
}

template <class Dev>
int dispatch(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  check_strategy_name(c.strategy);
  return [&]<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    int rc = 0;
    ((c.strategy == Kind::name && (rc = train_strategy<Dev, Kind>(c, world, data, classes), true)) || ...);
    return rc;
  }(std::type_identity<Strategies>{});
}

int train_host(const Config&, dtrain::World&, const dtrain::Dataset&, std::int64_t classes);
int train_cuda(const Config&, dtrain::World&, const dtrain::Dataset&, std::int64_t classes);

}  // namespace mlp
