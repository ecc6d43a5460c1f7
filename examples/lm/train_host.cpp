#include "train_impl.hpp"

int lm::train_host(const Config& c, dtrain::World& world, const dtrain::hf::LmConfig& config, const Tokens& t) {
  return train<dtrain::Host>(c, world, config, t);
}
