#include "train_impl.hpp"

int mlp::train_cuda(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  return train<dtrain::Cuda>(c, world, data, classes);
}
