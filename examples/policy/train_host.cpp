#include "train_impl.hpp"

int policy::train_host(const Config& c, dtrain::World& world, const DataSets& data) {
  return train<dtrain::Host>(c, world, data);
}
