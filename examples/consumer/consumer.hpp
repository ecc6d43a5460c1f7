#pragma once
// The consumer's model, data and training loop, written once as a template
// over the device: main.cpp instantiates it for dtrain::Host (g++), and
// train_cuda.cu for dtrain::Cuda (nvcc). Only <dtrain/...> headers of the
// installed package are used; nothing here may pull range-v3 into nvcc.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "affine.hpp"

#include <dtrain/trainer.hpp>

namespace consumer {

inline constexpr std::int64_t features = 8;
inline constexpr std::int64_t hidden = 16;
inline constexpr std::int64_t classes = 3;

// Linear -> the consumer's own Affine -> GELU -> Linear, with dtrain's
// softmax cross-entropy as the loss.
struct Model {
  dtrain::nn::Linear fc1{features, hidden};
  Affine affine{hidden};
  dtrain::nn::GELU act;
  dtrain::nn::Linear head{hidden, classes};
  dtrain::nn::SoftmaxCrossEntropy loss;

  auto units() { return std::tie(fc1, affine, act, head); }
};
static_assert(dtrain::Model<Model>);

// A task the model can visibly learn in a few steps: x ~ N(0, 1) and the label
// is the argmax of a fixed random linear map of x. Every rank builds the same
// data from the same seed; the DistributedSampler gives each its own rows.
inline dtrain::Dataset make_dataset(std::int64_t rows, std::uint64_t seed) {
  std::vector<float> teacher(static_cast<std::size_t>(features * classes));
  dtrain::init_values(teacher, dtrain::Init::normal(0.f, 1.f), seed ^ 0x7eac);
  dtrain::Dataset d;
  d.rows = rows;
  d.features = features;
  d.x.resize(static_cast<std::size_t>(rows * features));
  dtrain::init_values(d.x, dtrain::Init::normal(0.f, 1.f), seed ^ 0xda7a);
  d.y.resize(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int32_t best = 0;
    float best_logit = -INFINITY;
    for (std::int64_t c = 0; c < classes; ++c) {
      float logit = 0.f;
      for (std::int64_t i = 0; i < features; ++i)
        logit += d.x[static_cast<std::size_t>(r * features + i)] * teacher[static_cast<std::size_t>(i * classes + c)];
      if (logit > best_logit) best_logit = logit, best = static_cast<std::int32_t>(c);
    }
    d.y[static_cast<std::size_t>(r)] = best;
  }
  d.validate(classes);
  return d;
}

struct Losses {
  double first = 0;  // mean loss of the first optimizer step, over all ranks
  double last = 0;   // ... and of the last
};

// Trains the model for `steps` DDP steps on device Dev and reports the losses.
// Every rank gets the same (all-reduced) numbers, so every rank reaches the
// same verdict in main().
template <class Dev>
Losses train(dtrain::World& world, const dtrain::Dataset& data, std::int64_t steps) {
  Model model;
  dtrain::Trainer<Model, dtrain::Device<Dev>> trainer{world, model, dtrain::AdamW{.lr = 2e-2f}};
  dtrain::DistributedSampler sampler{data.rows, world, {.shuffle = true, .seed = 1}};
  dtrain::DataLoader loader{data, sampler, {.batch_size = 32, .num_workers = 0}};
  Losses losses;
  for (std::int64_t s = 0; s < steps; ++s) {
    const dtrain::Batch batch = loader.next();
    const auto stats = trainer.step(std::span(&batch, 1));
    if (s == 0) losses.first = stats.loss;
    losses.last = stats.loss;
    if (world.rank() == 0) std::printf("step %2lld  loss %.4f\n", static_cast<long long>(stats.step), stats.loss);
  }
  return losses;
}

Losses train_host(dtrain::World& world, const dtrain::Dataset& data, std::int64_t steps);  // main.cpp
#if CONSUMER_WITH_CUDA
Losses train_cuda(dtrain::World& world, const dtrain::Dataset& data, std::int64_t steps);  // train_cuda.cu
int cuda_device_count();                                                                   // train_cuda.cu
#endif

}  // namespace consumer
