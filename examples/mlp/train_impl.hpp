#pragma once
// train_mlp's training function for one (device, strategy), included only by
// the generated per-strategy translation units.

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "mlp.hpp"

namespace mlp {

template <class Dev, class Kind>
int train_strategy(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  return examples::with_policies<Dev, Kind>(c, [&]<class... Policies>() {
    Model model(c, data.features, classes);
    return examples::run_training<Policies...>(c, world, model, data, [](auto&) {});
  });
}

}  // namespace mlp
