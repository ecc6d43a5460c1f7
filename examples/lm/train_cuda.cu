#include "train_impl.hpp"

int lm::train_cuda(const Config& c, dtrain::World& world, const dtrain::hf::LmConfig& config, const Tokens& t) {
  return train<dtrain::Cuda>(c, world, config, t);
}
