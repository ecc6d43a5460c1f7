#include "train_impl.hpp"

int libtorch_example::train_cuda(const Config& c, dtrain::World& world, Model& model, const Samples& data,
                                 const Finish& finish) {
  return train<dtrain::Cuda>(c, world, model, data, finish);
}
