#include "train_impl.hpp"

int diffusion_example::train_host(const Config& c, dtrain::World& world, const Setup& s) {
  return train<dtrain::Host>(c, world, s);
}
