#include "mlp.hpp"

int mlp::train_host(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  return dispatch<dtrain::Host>(c, world, data, classes);
}
