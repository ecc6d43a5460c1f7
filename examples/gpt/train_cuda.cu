#include "train_impl.hpp"

int gpt::train_cuda(const Config& c, dtrain::World& world, const Corpus& corpus) {
  return train<dtrain::Cuda>(c, world, corpus);
}
