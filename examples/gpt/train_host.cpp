#include "train_impl.hpp"

int gpt::train_host(const Config& c, dtrain::World& world, const Corpus& corpus) {
  return train<dtrain::Host>(c, world, corpus);
}
