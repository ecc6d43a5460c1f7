#include "train_impl.hpp"

int vlm::train_cuda(const Config& c, dtrain::World& world, const dtrain::hf::Llava& model, const Records& r) {
  return train<dtrain::Cuda>(c, world, model, r);
}
