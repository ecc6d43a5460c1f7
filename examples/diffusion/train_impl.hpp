#pragma once
// train_diffusion's training function for one device, included by
// train_host.cpp and train_cuda.cu.

#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "common/windows.hpp"
#include "diffusion.hpp"

namespace diffusion_example {

// The held-out loss at fixed noise and timesteps (the records' own where the
// file has them): each rank evaluates every world-size-th held-out record,
// eval_batches batches of batch_size.
template <class Trainer>
void evaluate(const Config& c, const Setup& s, dtrain::World& world, Trainer& trainer, const char* when = "") {
  if (c.eval_batches < 1 || s.held_out < 1) return;
  const dtrain::diffusion::NoisedRecords held_out = records(c, s, false);
  const double loss =
      trainer.evaluate(examples::held_out_batches(world, held_out, 1, c.batch_size, c.eval_batches)).loss;
  if (world.rank() == 0)
    std::printf("eval%s: held-out loss %.6f (%s; %lld samples of %lld held-out records at fixed noise and timesteps)\n",
                when, loss, dtrain::diffusion::objective_name(s.schedule.objective),
                static_cast<long long>(c.eval_batches * c.batch_size * world.size()),
                static_cast<long long>(s.held_out));
}

// The EMA file in the checkpoint a run resumes from, if any.
inline std::filesystem::path resumed_ema(const Config& c) {
  if (c.resume.empty()) return {};
  std::filesystem::path dir = c.resume;
  if (c.resume == "latest") {
    const auto latest = c.checkpoint_dir.empty() ? std::nullopt : dtrain::latest_checkpoint(c.checkpoint_dir);
    if (!latest) return {};
    dir = *latest;
  }
  return std::filesystem::exists(dir / "ema.safetensors") ? dir / "ema.safetensors" : std::filesystem::path{};
}

template <class Dev>
int train(const Config& c, dtrain::World& world, const Setup& s) {
  return examples::with_precision(c, [&]<class Prec>() {
    dtrain::models::UNet2DCondition model(s.unet, s.lora);
    const dtrain::diffusion::NoisedRecords train = records(c, s, true);
    // The EMA (ema_decay > 0): updated after the due steps, saved into each
    // checkpoint and continued from the resumed one's, saved beside the results.
    std::optional<dtrain::ParamEma> ema;
    if (c.ema_decay > 0) ema.emplace(dtrain::EmaOptions{.decay = c.ema_decay, .every = c.ema_every});
    std::function<void(std::int64_t)> ema_step;
    std::function<void(const std::filesystem::path&)> ema_save;
    dtrain::FitCallbacks callbacks;
    callbacks.on_step = [&](const dtrain::StepStats& st, dtrain::FitControl&) {
      if (ema_step && !st.skipped) ema_step(st.step);
    };
    callbacks.on_save = [&](const std::filesystem::path& dir) {
      if (ema_save) ema_save(dir / "ema.safetensors");
    };
    const auto start = [&](auto& trainer) {
      if (ema) {
        ema_step = [&](std::int64_t step) {
          if (ema->due(step)) ema->update(trainer);
        };
        ema_save = [&](const std::filesystem::path& file) { ema->save(trainer, file); };
        if (const auto file = resumed_ema(c); !file.empty()) {
          ema->load(trainer, file);
          if (world.rank() == 0)
            std::printf("ema: continued from %s (%lld updates)\n", file.c_str(),
                        static_cast<long long>(ema->updates()));
        }
      }
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
      if (!c.save_diffusers.empty()) {
        dtrain::diffusion::save_diffusers(trainer, c.save_diffusers, model, s.config_json);
        if (world.rank() == 0) std::printf("saved the UNet as a diffusers folder: %s\n", c.save_diffusers.c_str());
      }
      if (!ema || ema->updates() == 0) return;
      // the average into the model (the trained weights are saved above), then evaluated and saved beside them
      // through a file every rank can read: beside the results, or the checkpoints (temp: one node)
      const std::filesystem::path shared =
          !c.save_lora.empty()        ? std::filesystem::path(c.save_lora + ".ema.safetensors")
          : !c.save_diffusers.empty() ? std::filesystem::path(c.save_diffusers + ".ema.safetensors")
          : !c.checkpoint_dir.empty() ? std::filesystem::path(c.checkpoint_dir) / "ema-final.safetensors"
                                      : std::filesystem::temp_directory_path() / "dtrain_ema_final.safetensors";
      ema->save(trainer, shared);
      world.barrier("train-diffusion-ema-written");
      trainer.load_params(shared, {.strict = false});
      world.barrier("train-diffusion-ema-read");
      if (world.rank() == 0) std::filesystem::remove(shared);
      evaluate(c, s, world, trainer, " (EMA)");
      if (!c.save_lora.empty())
        dtrain::diffusion::save_lora(trainer, std::filesystem::path(c.save_lora) / "ema", model);
      if (!c.save_diffusers.empty())
        dtrain::diffusion::save_diffusers(trainer, std::filesystem::path(c.save_diffusers) / "ema", model,
                                          s.config_json);
      if (world.rank() == 0 && (!c.save_lora.empty() || !c.save_diffusers.empty()))
        std::printf("saved the EMA weights (%lld updates, decay %g) beside them: ema/\n",
                    static_cast<long long>(ema->updates()), c.ema_decay);
    };
    return examples::run_training<Dev, Prec>(c, world, model, train, start, finish, callbacks);
  });
}

}  // namespace diffusion_example
