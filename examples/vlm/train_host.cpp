#include "train_impl.hpp"

int vlm::train_host(const Config& c, dtrain::World& world, const dtrain::hf::Llava& model, const Records& r) {
  return train<dtrain::Host>(c, world, model, r);
}
