#pragma once
// The train_diffusion example: fine-tunes a diffusers UNet (Stable Diffusion
// 1.x/2.x, SDXL: models::UNet2DCondition) on cached latents and text
// embeddings (diffusion/data.hpp), in full or with LoRA adapters, and writes
// the result as diffusers loads it (save_lora=, save_diffusers=).
//
//   units: models::UNet2DCondition (built for the records' latent size)
//   batch: diffusion::NoisedRecords: x the noisy latents, y the objective's
//          target, timesteps, weight, encoder_hidden_states (SDXL: pooled,
//          time_ids)
//   data:  a records file (diffusion/data.hpp); the last tenth is held out

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/config.hpp"

#include <dtrain/diffusion/data.hpp>
#include <dtrain/diffusion/lora.hpp>
#include <dtrain/diffusion/schedule.hpp>
#include <dtrain/diffusion/unet.hpp>
#include <dtrain/models/lora_keys.hpp>
#include <dtrain/models/unet.hpp>
#include <dtrain/run/ema.hpp>

namespace diffusion_example {

struct Config : examples::Common, dtrain::models::LoraKeys {
  std::string model;                          // a diffusers UNet folder, or a pipeline folder holding unet/
  std::string data;                           // the records file
  std::string objective;                      // eps | v | flow; "" = the scheduler config's
  std::string scheduler;                      // a scheduler_config.json (default: the pipeline's, if any)
  std::string timestep_sampling = "uniform";  // flow: uniform | logit_normal | mode
  double logit_mean = 0.0, logit_std = 1.0, mode_scale = 1.29;
  double snr_gamma = 0.0;         // Min-SNR-gamma weighting (eps, v); 0 = off
  double noise_offset = 0.0;      // 0 = off
  double drop_text = 0.0;         // classifier-free guidance: drop a caption with this probability
  std::string adapter;            // LoRA adapters to load and train on (diffusers' or PEFT's files)
  std::string save_lora;          // at the end, the adapters as diffusers' save_lora_weights writes them
  std::string save_diffusers;     // at the end, the whole UNet (adapters merged) as save_pretrained writes it
  std::int64_t eval_batches = 4;  // held-out batches per rank at the end (fixed noise and timesteps)
  double ema_decay = 0.0;         // > 0: an EMA of the trained weights (dtrain::ParamEma), saved beside them
  std::int64_t ema_every = 1;     // its update interval in optimizer steps

  Config() {
    lr = 1e-4f;
    batch_size = 4;
    steps = 100;
    weight_decay = 1e-2f;
  }
};

// Everything a run needs that is read before the ranks train: the UNet's
// config (built for the records' size), the schedule, the adapters, the
// records and their split.
struct Setup {
  dtrain::models::UNetConfig unet;
  std::string unet_dir;     // the UNet folder
  std::string config_json;  // its config.json, for save_diffusers
  dtrain::hf::LoraConfig lora;
  dtrain::diffusion::ScheduleConfig schedule;
  std::string schedule_from;  // where the schedule came from, for the first line
  std::int64_t records = 0, held_out = 0;
};

// Reads and checks the model, the scheduler, the adapters and the records:
// every refusal (config_error, exit 2) comes before anything is written.
Setup read_setup(const Config& c);
// The records of one side of the split: the first `records - held_out` train.
inline dtrain::diffusion::NoisedRecords records(const Config& c, const Setup& s, bool train) {
  dtrain::diffusion::Options draws;
  draws.sampling = dtrain::diffusion::parse_timestep_sampling(c.timestep_sampling);
  draws.logit_mean = c.logit_mean;
  draws.logit_std = c.logit_std;
  draws.mode_scale = c.mode_scale;
  draws.snr_gamma = c.snr_gamma;
  draws.noise_offset = c.noise_offset;
  const std::int64_t split = s.records - s.held_out;
  return dtrain::diffusion::NoisedRecords(c.data, {.schedule = dtrain::diffusion::make_schedule(s.schedule),
                                                   .draws = draws,
                                                   .seed = c.seed,
                                                   .drop_text = train ? c.drop_text : 0.0,
                                                   .first = train ? 0 : split,
                                                   .count = train ? split : s.held_out});
}

int train_host(const Config&, dtrain::World&, const Setup&);
int train_cuda(const Config&, dtrain::World&, const Setup&);

}  // namespace diffusion_example
