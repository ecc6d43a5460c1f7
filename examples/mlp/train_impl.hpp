#pragma once
// train_mlp's training function for one device, included by train_host.cpp
// and train_cuda.cu.

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "mlp.hpp"

namespace mlp {

template <class Dev>
int train(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  return examples::with_precision(c, [&]<class Prec>() {
    Model model(c, data.features, classes);
    return examples::run_training<Dev, Prec>(c, world, model, data, [](auto&) {});
  });
}

}  // namespace mlp
