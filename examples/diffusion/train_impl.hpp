#pragma once
// train_diffusion's training function for one device, included by
// train_host.cpp and train_cuda.cu.

#include <cstdio>
#include <vector>

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "diffusion.hpp"

namespace diffusion_example {

// The held-out loss at fixed noise and timesteps (the records' own where the
// file has them): each rank evaluates every world-size-th held-out record,
// eval_batches batches of batch_size.
template <class Trainer>
void evaluate(const Config& c, const Setup& s, dtrain::World& world, Trainer& trainer, const char* when = "") {
  if (c.eval_batches < 1 || s.held_out < 1) return;
  const dtrain::diffusion::NoisedRecords held_out = records(c, s, false);
  std::vector<dtrain::Batch> batches;
  std::int64_t next = world.rank();
  for (std::int64_t k = 0; k < c.eval_batches; ++k) {
    std::vector<std::int64_t> idx;
    for (std::int64_t i = 0; i < c.batch_size; ++i, next += world.size()) idx.push_back(next % held_out.size());
    batches.push_back(held_out.gather(idx));
  }
  const double loss = trainer.evaluate(batches).loss;
  if (world.rank() == 0)
    std::printf("eval%s: held-out loss %.6f (%s; %lld samples of %lld held-out records at fixed noise and timesteps)\n",
                when, loss, dtrain::diffusion::objective_name(s.schedule.objective),
                static_cast<long long>(c.eval_batches * c.batch_size * world.size()),
                static_cast<long long>(s.held_out));
}

template <class Dev>
int train(const Config& c, dtrain::World& world, const Setup& s) {
  return examples::with_precision(c, [&]<class Prec>() {
    dtrain::models::UNet2DCondition model(s.unet, s.lora);
    const dtrain::diffusion::NoisedRecords train = records(c, s, true);
    const auto start = [&](auto& trainer) {
      const auto r = dtrain::diffusion::load_diffusers(trainer, s.unet_dir, model);
      if (world.rank() == 0) std::printf("model %s: loaded %zu tensor(s)\n", s.unet_dir.c_str(), r.loaded.size());
      if (!c.adapter.empty()) {
        const auto a = dtrain::diffusion::load_lora(trainer, c.adapter, model);
        if (world.rank() == 0) std::printf("adapter %s: loaded %zu tensor(s)\n", c.adapter.c_str(), a.loaded.size());
      }
      if (trainer.steps_taken() == 0 && c.resume.empty()) evaluate(c, s, world, trainer, " (before training)");
    };
    const auto finish = [&](auto& trainer) {
      evaluate(c, s, world, trainer);
      if (!c.save_lora.empty()) {
        dtrain::diffusion::save_lora(trainer, c.save_lora, model);
        if (world.rank() == 0)
          std::printf("saved the adapters for diffusers' load_lora_weights: %s\n", c.save_lora.c_str());
      }
      if (c.save_diffusers.empty()) return;
      dtrain::diffusion::save_diffusers(trainer, c.save_diffusers, model, s.config_json);
      if (world.rank() == 0) std::printf("saved the UNet as a diffusers folder: %s\n", c.save_diffusers.c_str());
    };
    return examples::run_training<Dev, Prec>(c, world, model, train, start, finish);
  });
}

}  // namespace diffusion_example
