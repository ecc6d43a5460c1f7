// train_diffusion: fine-tunes a diffusers UNet (Stable Diffusion 1.x/2.x,
// SDXL) on cached latents and text embeddings, on every rank it was
// launched with, in full or with LoRA adapters, as OneTrainer and diffusers'
// training scripts do; writes the adapters (save_lora=) or the whole UNet
// (save_diffusers=) as diffusers loads them.
//
//   dtrain-run --nproc-per-node 2 train_diffusion model=./sd15 data=cache.safetensors lora_r=16
//       lora_targets=to_q,to_k,to_v,to_out.0 save_lora=./lora
//
// Compiled by g++ only: yaml-cpp and range-v3 stay out of the nvcc translation units.

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "diffusion.hpp"

namespace diffusion_example {
namespace {

namespace fs = std::filesystem;

constexpr const char* usage = R"(Fine-tunes a diffusers UNet2DConditionModel (Stable Diffusion 1.x/2.x, SDXL)
on cached latents and text embeddings: a records file of latents [N, C, H, W]
and encoder_hidden_states [N, L, D] (SDXL: pooled [N, P], time_ids [N, 6];
optionally noise and timesteps per record), which
examples/diffusion/cache_latents.py writes with diffusers and transformers.
Each step draws a timestep and noise per record (a function of seed, epoch
and record) and regresses the objective's target. The last tenth is held
out: at the end, "eval: held-out loss X" at fixed noise and timesteps.
)";

void declare_extra(dtrain::ConfigReader& r, Config& c) {
  r.add("model", c.model,
        "a diffusers UNet folder (config.json + diffusion_pytorch_model.safetensors) or a pipeline "
        "folder holding unet/");
  r.add("data", c.data, "the records file (see above)");
  r.add("objective", c.objective,
        "eps | v | flow (default: the scheduler config's prediction_type, or eps without one)");
  r.add("scheduler", c.scheduler,
        "a diffusers scheduler_config.json (default: the pipeline's scheduler/; without one, Stable Diffusion's "
        "scaled-linear betas 0.00085 to 0.012 over 1000 steps)");
  r.add("timestep_sampling", c.timestep_sampling, "flow: uniform | logit_normal | mode");
  r.add("logit_mean", c.logit_mean, "flow, logit_normal: the normal's mean");
  r.add("logit_std", c.logit_std, "flow, logit_normal: the normal's standard deviation");
  r.add("mode_scale", c.mode_scale, "flow, mode: the scale");
  r.add("snr_gamma", c.snr_gamma, "Min-SNR-gamma loss weighting for eps and v, e.g. 5 (0: off)");
  r.add("noise_offset", c.noise_offset, "noise offset, e.g. 0.05 (0: off)");
  r.add("drop_text", c.drop_text,
        "classifier-free guidance training: the fraction of captions replaced by the empty caption's embedding");
  r.section("LoRA adapters (the format diffusers' load_lora_weights reads; the UNet frozen)");
  examples::declare_lora(
      r, c,
      {.rank = "adapter rank (0: no adapters, the whole UNet trains)",
       .targets = "PEFT's target_modules: to_q,to_k,to_v,to_out.0 (diffusers' LoRA scripts), ff.net.0.proj,ff.net.2 "
                  "(the feed-forward), proj_in,proj_out (SD 2.x/SDXL), or longer suffixes such as attn2.to_k",
       .modules_to_save = "not supported for a UNet"});
  r.add("adapter", c.adapter,
        "LoRA adapters to load onto model= and train on (pytorch_lora_weights.safetensors or PEFT's folder; their "
        "config sets the lora_ keys)");
  r.add("save_lora", c.save_lora, "at the end, write the adapters here (pytorch_lora_weights.safetensors)");
  r.add("save_diffusers", c.save_diffusers,
        "at the end, write the whole UNet here (adapters merged) for UNet2DConditionModel.from_pretrained");
  r.add("eval_batches", c.eval_batches, "held-out batches per rank evaluated at the end (0 = none)");
  r.add("ema_decay", c.ema_decay,
        "> 0: keep an exponential moving average of the trained weights (diffusers' EMAModel rule, e.g. 0.9999), "
        "evaluated at the end and saved beside them (DIR/ema of save_lora= and save_diffusers=; ema.safetensors "
        "in checkpoints, continued on resume)");
  r.add("ema_every", c.ema_every, "update the average every N optimizer steps");
}

void validate_extra(const Config& c) {
  const auto need = [](bool ok, const std::string& what, const std::string& fix) {
    if (!ok) throw dtrain::config_error(what, fix);
  };
  need(!c.model.empty(), "model= is missing", "give model=DIR, a diffusers UNet or pipeline folder");
  need(!c.data.empty(), "data= is missing",
       "give data=FILE.safetensors, the cached records (examples/diffusion/cache_latents.py)");
  need(c.adapter.empty() || (c.lora_r == 0 && c.lora_targets.empty()),
       "adapter= and lora_r/lora_targets both say which adapters to build",
       "give one: adapter=DIR reads them from its file");
  need(c.lora_r > 0 || !c.adapter.empty() || (c.lora_targets.empty() && c.save_lora.empty()),
       (c.save_lora.empty() ? "lora_targets" : "save_lora") + std::string(" without adapters"),
       "give lora_r=R (e.g. 16) and lora_targets=to_q,to_k,to_v,to_out.0, or adapter=DIR");
  need(c.eval_batches >= 0, "eval_batches must be >= 0", "set eval_batches=4, or 0 for none");
  need(c.drop_text >= 0.0 && c.drop_text <= 1.0, "drop_text must be in [0, 1]", "set drop_text=0.1, or 0");
  if (c.ema_decay > 0) dtrain::ParamEma({.decay = c.ema_decay, .every = c.ema_every});  // checks them
  need(c.ema_decay >= 0, "ema_decay must be >= 0", "set ema_decay=0.9999, or 0 for none");
  dtrain::diffusion::parse_timestep_sampling(c.timestep_sampling);
  if (!c.objective.empty()) dtrain::diffusion::parse_objective(c.objective);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Setup read_setup(const Config& c) {
  namespace diff = dtrain::diffusion;
  Setup s;
  s.unet_dir = diff::unet_folder(c.model).string();
  s.unet = diff::read_unet_config(c.model);
  s.config_json = read_file(fs::path(s.unet_dir) / "config.json");
  // the schedule: scheduler=, else the pipeline's, else Stable Diffusion's
  fs::path scheduler = c.scheduler;
  if (scheduler.empty())
    for (const fs::path& p : {fs::path(c.model) / "scheduler", fs::path(s.unet_dir).parent_path() / "scheduler"})
      if (fs::exists(p / "scheduler_config.json")) {
        scheduler = p / "scheduler_config.json";
        break;
      }
  if (!scheduler.empty()) {
    s.schedule = diff::read_scheduler_config(scheduler);
    s.schedule_from = scheduler.string();
    if (!c.objective.empty() && diff::parse_objective(c.objective) != s.schedule.objective)
      throw dtrain::config_error(
          "objective=" + c.objective + ", but the scheduler config " + scheduler.string() + " trains " +
              diff::objective_name(s.schedule.objective) +
              ": a model trained for one objective predicts another's target badly",
          "drop objective= (the scheduler's objective is trained), or give scheduler=FILE of the objective you mean");
  } else {
    if (!c.objective.empty()) s.schedule.objective = diff::parse_objective(c.objective);
    s.schedule_from = "Stable Diffusion's default (no scheduler config)";
  }
  diff::make_schedule(s.schedule);  // checks it
  if (s.schedule.objective == diff::Objective::flow && c.snr_gamma > 0)
    throw dtrain::config_error("snr_gamma weights the eps and v objectives, not flow", "drop snr_gamma=");
  // the adapters
  s.lora = c.adapter.empty() ? c.lora_keys() : diff::read_lora_config(c.adapter);
  // the records: the model is built for their size
  const diff::NoisedRecords all(c.data, {.schedule = diff::make_schedule(s.schedule)});
  s.unet.sample_height = all.height();
  s.unet.sample_width = all.width();
  s.unet.context_length = all.context_length();
  const bool sdxl = s.unet.addition_embed_type == "text_time";
  all.check(
      {.channels = s.unet.in_channels,
       .context_dim = s.unet.cross_attention_dim,
       .pooled_dim = sdxl ? s.unet.projection_class_embeddings_input_dim - 6 * s.unet.addition_time_embed_dim : 0},
      "the UNet in " + s.unet_dir);
  try {
    dtrain::models::check_unet_config(s.unet);
  } catch (const dtrain::config_error& e) {
    throw dtrain::config_error("the records file \"" + c.data + "\": " + e.problem(),
                               e.fix() + " (the latents' size is the images' size / 8)");
  }
  dtrain::models::UNet2DCondition probe(s.unet, s.lora);  // the LoRA targets' refusals, now
  s.records = all.size();
  s.held_out = c.eval_batches > 0 && s.records >= 2 ? std::max<std::int64_t>(1, s.records / 10) : 0;
  return s;
}

}  // namespace diffusion_example

int main(int argc, char** argv) {
  using namespace diffusion_example;
  try {
    auto cfg = examples::parse_cli<Config>(argc, argv, "train_diffusion", usage, declare_extra, validate_extra);
    // With adapters only lora_A and lora_B train: there is no bias or norm to keep out of the weight decay
    // (diffusers' LoRA scripts decay the adapters).
    if (cfg.lora_r > 0 || !cfg.adapter.empty()) cfg.no_decay = false;
    const Setup setup = read_setup(cfg);
    auto world = examples::init_world(cfg);
    if (world.rank() == 0)
      std::printf(
          "train_diffusion: %d rank(s), UNet %s (%zu blocks, latents %lld x %lld x %lld, text %lld x %lld%s), "
          "objective %s (%s), %s, strategy=%s device=%s precision=%s accumulate=%d batch=%lld/rank, %lld records "
          "(%lld held out)\n",
          world.size(), setup.unet_dir.c_str(), setup.unet.block_out_channels.size(),
          static_cast<long long>(setup.unet.in_channels), static_cast<long long>(setup.unet.sample_height),
          static_cast<long long>(setup.unet.sample_width), static_cast<long long>(setup.unet.context_length),
          static_cast<long long>(setup.unet.cross_attention_dim),
          setup.unet.addition_embed_type == "text_time" ? ", SDXL text_time" : "",
          dtrain::diffusion::objective_name(setup.schedule.objective), setup.schedule_from.c_str(),
          setup.lora.on() ? ("LoRA r=" + std::to_string(setup.lora.r)).c_str() : "full fine-tuning",
          cfg.strategy.c_str(), cfg.device.c_str(), cfg.precision.c_str(), cfg.accumulate,
          static_cast<long long>(cfg.batch_size), static_cast<long long>(setup.records),
          static_cast<long long>(setup.held_out));
    if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
      return train_cuda(cfg, world, setup);
#else
      throw dtrain::config_error("this train_diffusion was built without CUDA",
                                 "use device=host, or rebuild with CUDA");
#endif
    }
    return train_host(cfg, world, setup);
  } catch (const std::exception& e) {
    examples::report_failure(e);
    return examples::exit_status(e);
  }
}
