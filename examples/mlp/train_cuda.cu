#include "mlp.hpp"

int mlp::train_cuda(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  return dispatch<dtrain::Cuda>(c, world, data, classes);
}
