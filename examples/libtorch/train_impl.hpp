#pragma once
// train_libtorch's training function for one device, included by
// train_host.cpp and train_cuda.cu.

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "libtorch.hpp"

namespace libtorch_example {

template <class Dev>
int train(const Config& c, dtrain::World& world, Model& model, const Samples& data, const Finish& finish) {
  return examples::with_precision(c, [&]<class Prec>() {
    auto start = [&](auto& trainer) {
      finish.load(
          [&](const dtrain::ParamSources& s, const dtrain::LoadParamsOptions& o) { return trainer.load_params(s, o); });
    };
    return examples::run_training<Dev, Prec>(c, world, model, data, start, [&](auto& trainer) {
      finish.held_out([&](const std::vector<dtrain::Batch>& b) { return trainer.evaluate(b).loss; });
      finish.save([&](const auto& f) { trainer.visit_parameters(f); });
    });
  });
}

}  // namespace libtorch_example
