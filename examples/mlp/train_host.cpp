#include "train_impl.hpp"

int mlp::train_host(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  return train<dtrain::Host>(c, world, data, classes);
}
