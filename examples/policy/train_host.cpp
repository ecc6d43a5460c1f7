#include "train_act.hpp"
#include "train_impl.hpp"

int policy::train_host(const Config& c, dtrain::World& world, const DataSets& data) {
  return train<dtrain::Host>(c, world, data);
}

int policy::train_act_host(const Config& c, dtrain::World& world, const ActRun& run) {
  return train_act<dtrain::Host>(c, world, run);
}
