#pragma once
// The train_mlp example: configuration, model, data, and the training loop,
// written once and instantiated for each policy combination the config can
// ask for (policies are compile-time types; the config picks one at run time).

#include <dtrain/trainer.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace mlp {

struct Config {
  std::string strategy = "ddp";
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

template <class... Policies>
int train(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  Model model(c, data.features, classes);
  dtrain::TrainerOptions opts;
  opts.seed = c.seed;
  opts.clip.max_norm = c.clip;
  opts.buckets.bucket_bytes = static_cast<std::size_t>(c.bucket_mb * (1 << 20));
  opts.lr_scaling = c.lr_scaling == "linear" ? dtrain::LrScaling::linear
                    : c.lr_scaling == "sqrt" ? dtrain::LrScaling::sqrt
                                             : dtrain::LrScaling::none;
  opts.schedule = dtrain::make_schedule(
      c.schedule, {.lr = c.lr, .warmup_steps = c.warmup_steps, .total_steps = c.schedule == "cosine" ? c.steps : 0});

  auto run = [&](auto optimizer) {
    dtrain::Trainer<Model, Policies...> trainer(world, model, optimizer, opts);
    dtrain::DistributedSampler sampler(data.rows, world, {.shuffle = true, .seed = c.seed});
    dtrain::DataLoader loader(data, sampler, {.batch_size = c.batch_size, .num_workers = c.num_workers});
    std::ofstream metrics;
    if (world.rank() == 0 && !c.metrics.empty()) {
      metrics.open(c.metrics);
      if (!metrics)
        throw dtrain::config_error("cannot write the metrics file '" + c.metrics + "'",
                                   "check that its folder exists and is writable");
    }
    std::vector<dtrain::Batch> micro(static_cast<std::size_t>(c.accumulate));
    for (std::int64_t s = 0; s < c.steps; ++s) {
      for (auto& b : micro) b = loader.next();
      const auto st = trainer.step(micro);
      const double sps = st.samples / (st.step_ms / 1000.0);
      if (world.rank() != 0) continue;
      if (metrics.is_open())
        metrics << "{\"step\": " << st.step << ", \"loss\": " << st.loss << ", \"lr\": " << st.lr
                << ", \"grad_norm\": " << st.grad_norm << ", \"samples_per_s\": " << sps
                << ", \"step_ms\": " << st.step_ms << ", \"world_size\": " << world.size()
                << ", \"loss_scale\": " << st.loss_scale << ", \"skipped\": " << (st.skipped ? "true" : "false")
                << "}\n";
      if (st.step == 1 || st.step % c.log_every == 0 || s + 1 == c.steps)
        std::printf("step %5lld/%lld | loss %.4f | lr %.2e | %8.0f samples/s | step %7.2f ms | scale %g%s\n",
                    static_cast<long long>(st.step), static_cast<long long>(c.steps), st.loss, st.lr, sps,
                    st.step_ms, st.loss_scale, st.skipped ? " | skipped (inf/nan)" : "");
    }
    if (!c.save_params.empty()) trainer.save_params(c.save_params);
    std::fflush(stdout);
  };
  if (c.optimizer == "sgd")
    run(dtrain::SGD{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
  else
    run(dtrain::AdamW{.lr = c.lr, .weight_decay = c.weight_decay});
  return 0;
}

// Instantiates train<> for the precision and accumulation the config names.
template <class Dev>
int dispatch(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  using namespace dtrain;
  auto with_accumulate = [&]<class Prec>(std::type_identity<Prec>) {
    switch (c.accumulate) {
      case 1: return train<Device<Dev>, Prec, Accumulate<1>>(c, world, data, classes);
      case 2: return train<Device<Dev>, Prec, Accumulate<2>>(c, world, data, classes);
      case 4: return train<Device<Dev>, Prec, Accumulate<4>>(c, world, data, classes);
      case 8: return train<Device<Dev>, Prec, Accumulate<8>>(c, world, data, classes);
    }
    throw config_error("accumulate = " + std::to_string(c.accumulate) + " is not built into train_mlp",
                       "use 1, 2, 4 or 8");
  };
  const bool same = c.reduce_dtype == "same";
  if (c.precision == "fp32") return with_accumulate(std::type_identity<Precision<fp32>>{});
  if (c.precision == "bf16")
    return same ? with_accumulate(std::type_identity<Precision<bf16, bf16>>{})
                : with_accumulate(std::type_identity<Precision<bf16>>{});
  if (c.precision == "fp16")
    return same ? with_accumulate(std::type_identity<Precision<fp16, fp16>>{})
                : with_accumulate(std::type_identity<Precision<fp16>>{});
  throw config_error("precision = '" + c.precision + "' is unknown", "use fp32, bf16 or fp16");
}

int train_host(const Config&, dtrain::World&, const dtrain::Dataset&, std::int64_t classes);
int train_cuda(const Config&, dtrain::World&, const dtrain::Dataset&, std::int64_t classes);

}  // namespace mlp
