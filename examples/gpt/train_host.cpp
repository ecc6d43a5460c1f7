#include "gpt.hpp"

int gpt::train_host(const Config& c, dtrain::World& world, const Corpus& corpus) {
  return dispatch<dtrain::Host>(c, world, corpus);
}
