#pragma once
// The train_libtorch example: a model written with LibTorch's torch::nn
// (models.hpp), trained by dtrain. Its configuration, its data (a token
// stream or images, made here) and the training function per device
// (train_impl.hpp). This header is free of LibTorch: nvcc compiles the GPU
// training loop that includes it.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>

#include "common/config.hpp"

#include <dtrain/nn/cross_entropy.hpp>
#include <dtrain/torch/block.hpp>
#include <dtrain/trainer.hpp>

namespace libtorch_example {

struct Config : examples::Common {
  std::string model = "lm";  // lm | resnet
  // lm
  std::int64_t vocab = 64, block_size = 32, dim = 64, heads = 4, layers = 2;
  std::int64_t tokens = 200000;  // of the synthetic stream
  // resnet
  std::int64_t image = 16, channels = 16, depth = 2, classes = 10;
  std::int64_t samples = 4096;  // synthetic images
  std::int64_t eval_batches = 4;
};

Config load_config(int argc, char** argv);  // train_libtorch.cpp

using Model = dtrain::libtorch::Model<dtrain::nn::SoftmaxCrossEntropy>;

// The samples, whatever the model: size() and gather(rows) (dtrain::fit's BatchSource).
struct Samples {
  std::int64_t count = 0;
  std::function<dtrain::Batch(std::span<const std::int64_t>)> rows;
  std::int64_t size() const { return count; }
  dtrain::Batch gather(std::span<const std::int64_t> indices) const { return rows(indices); }
};

// What the end of training does beside the loop (held-out loss, the state
// dict by LibTorch's names): train_libtorch.cpp, where LibTorch is.
struct Finish {
  std::function<void(const std::function<double(const std::vector<dtrain::Batch>&)>& evaluate)> held_out;
  // save(visit): visit(f) calls f(name, shape, values) for every parameter
  std::function<void(std::function<void(const std::function<void(const dtrain::ParamSlot&, std::vector<float>&&)>&)>)>
      save;
  // load(params): init_from= by LibTorch's names, through params (Trainer::load_params)
  std::function<void(
      std::function<dtrain::LoadParamsReport(const dtrain::ParamSources&, const dtrain::LoadParamsOptions&)>)>
      load;
};

int train_host(const Config&, dtrain::World&, Model&, const Samples&, const Finish&);
int train_cuda(const Config&, dtrain::World&, Model&, const Samples&, const Finish&);

}  // namespace libtorch_example
