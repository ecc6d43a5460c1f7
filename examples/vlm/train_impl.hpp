#pragma once
// train_vlm's training function for one device, included by train_host.cpp
// and train_cuda.cu.

#include <cstdio>
#include <string>

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "common/windows.hpp"
#include "vlm.hpp"

namespace vlm {

template <class Dev>
int train(const Config& c, dtrain::World& world, const dtrain::hf::Llava& built, const Records& records) {
  return examples::with_precision(c, [&]<class Prec>() {
    dtrain::hf::Llava model = built;
    const Samples train(records, true), held_out(records, false);
    const auto start = [&](auto& trainer) {
      if (c.model.empty()) return;
      const auto r = dtrain::hf::load_pretrained(trainer, c.model, model);
      if (world.rank() == 0) std::printf("model %s: loaded %zu tensor(s)\n", c.model.c_str(), r.loaded.size());
    };
    const auto finish = [&](auto& trainer) {
      examples::held_out_loss(world, held_out, 1, c.batch_size, c.eval_batches, trainer,
                              "one image and " + std::to_string(records.tokens) + " tokens");
      if (c.save_hf.empty()) return;
      // Adapters merged into their weights; the tower's tensors the model
      // does not run copied from the checkpoint it was loaded from.
      dtrain::hf::save_pretrained(trainer, c.save_hf, model, c.model);
      if (world.rank() == 0) std::printf("saved the model as a transformers directory: %s\n", c.save_hf.c_str());
    };
    return examples::run_training<Dev, Prec>(c, world, model, train, start, finish);
  });
}

}  // namespace vlm
