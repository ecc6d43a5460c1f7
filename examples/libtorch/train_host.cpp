#include "train_impl.hpp"

int libtorch_example::train_host(const Config& c, dtrain::World& world, Model& model, const Samples& data,
                                 const Finish& finish) {
  return train<dtrain::Host>(c, world, model, data, finish);
}
