#include "train_impl.hpp"

int diffusion_example::train_cuda(const Config& c, dtrain::World& world, const Setup& s) {
  return train<dtrain::Cuda>(c, world, s);
}
