#include "policy.hpp"

int policy::train_host(const Config& c, dtrain::World& world, const DataSets& data) {
  return dispatch<dtrain::Host>(c, world, data);
}
