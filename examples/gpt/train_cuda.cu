#include "gpt.hpp"

int gpt::train_cuda(const Config& c, dtrain::World& world, const Corpus& corpus) {
  return dispatch<dtrain::Cuda>(c, world, corpus);
}
