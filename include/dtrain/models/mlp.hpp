#pragma once
// Ready models: multilayer perceptrons, and train_mlp's classifier with its
// keys (examples/mlp trains it). Mlp<Loss> is the network: Linear +
// activation per hidden width, then a Linear head, with the loss Loss;
// train_policy's policy is one too (models/policy.hpp).
//
//   units: the layers in order (Linear, activation, ..., Linear)
//   batch: x float [B, in]; y as the loss reads it (class ids int32 [B] for
//          softmax cross-entropy)

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "dtrain/models/run_config.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/any_unit.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/linear.hpp"

namespace dtrain::models {

template <class Loss>
struct Mlp {
  std::vector<nn::AnyUnit> layers;
  Loss loss;

  // `activation` is "relu" or GELU's (anything else).
  Mlp(std::int64_t in, const std::vector<std::int64_t>& hidden, std::int64_t out, std::string_view activation) {
    for (auto h : hidden) {
      layers.emplace_back(nn::Linear(in, h));
      if (activation == "relu")
        layers.emplace_back(nn::ReLU{});
      else
        layers.emplace_back(nn::GELU{});
      in = h;
    }
    layers.emplace_back(nn::Linear(in, out));
  }
  auto units() { return std::tie(layers); }
};

// train_mlp's keys: the network's shape, and the size of its synthetic task.
struct MlpConfig : RunConfig {
  std::vector<std::int64_t> hidden = {256, 256};
  std::string activation = "gelu";  // gelu | relu
  std::int64_t features = 32;       // synthetic data
  std::int64_t classes = 10;        // synthetic data (files: 1 + the largest label)
};

// train_mlp's classifier: the config's hidden widths and activation between
// `features` inputs and `classes` logits (a data file's, or the config's),
// with softmax cross-entropy.
struct MlpClassifier : Mlp<nn::SoftmaxCrossEntropy> {
  MlpClassifier(const MlpConfig& c, std::int64_t features, std::int64_t classes)
      : Mlp(features, c.hidden, classes, c.activation) {}
};

}  // namespace dtrain::models
