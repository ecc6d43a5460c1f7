#include "train_impl.hpp"

int policy::train_cuda(const Config& c, dtrain::World& world, const DataSets& data) {
  return train<dtrain::Cuda>(c, world, data);
}
