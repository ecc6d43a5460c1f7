#include "train_act.hpp"
#include "train_impl.hpp"

int policy::train_cuda(const Config& c, dtrain::World& world, const DataSets& data) {
  return train<dtrain::Cuda>(c, world, data);
}

int policy::train_act_cuda(const Config& c, dtrain::World& world, const ActRun& run) {
  return train_act<dtrain::Cuda>(c, world, run);
}
