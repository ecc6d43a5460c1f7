#pragma once
// The train_mlp example: its configuration (the ready model's keys,
// dtrain/models/mlp.hpp, plus the data's), model, data, and the dispatch
// from the config's strategy name to a compiled strategy
// (examples/common/loop.hpp runs the training).

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/dispatch.hpp"

#include <dtrain/models/mlp.hpp>
#include <dtrain/trainer.hpp>

namespace mlp {

// The model's keys (dtrain/models/mlp.hpp, which dtrain-estimate reads too)
// and the data's.
struct Config : dtrain::models::MlpConfig {
  // data: "synthetic", a .safetensors file with x and y, or "X.npy,Y.npy"
  std::string data = "synthetic";
  std::int64_t samples = 16384;  // synthetic
};

Config load_config(int argc, char** argv);  // train_mlp.cpp: --config FILE key=value...

// Linear + activation per hidden width, then a Linear head, with softmax cross-entropy.
using Model = dtrain::models::MlpClassifier;

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
      for (std::int64_t j = 0; j < hidden; ++j)
        acc += h[static_cast<std::size_t>(j)] * w2[static_cast<std::size_t>(j * classes + c)];
      if (acc > best_v) best_v = acc, best = c;
    }
    d.y[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(best);
  }
  return d;
}

dtrain::Dataset load_data(const Config& c);  // train_mlp.cpp

// Trains on the host or a GPU (train_impl.hpp; a translation unit each).
int train_host(const Config&, dtrain::World&, const dtrain::Dataset&, std::int64_t classes);
int train_cuda(const Config&, dtrain::World&, const dtrain::Dataset&, std::int64_t classes);

}  // namespace mlp
