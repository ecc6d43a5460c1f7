#include "policy.hpp"

int policy::train_cuda(const Config& c, dtrain::World& world, const DataSets& data) {
  return dispatch<dtrain::Cuda>(c, world, data);
}
