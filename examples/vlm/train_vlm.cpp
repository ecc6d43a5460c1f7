// train_vlm: trains a transformers LLaVA model (a CLIP or SigLIP vision
// tower, a projector, a language model) on records of one image and its
// text, the parts train= names, with dtrain on every rank it was launched
// with, and can write the result back as a transformers directory.
//
//   dtrain-run --nproc-per-node 2 train_vlm model=./llava data=records.safetensors train=projector save_hf=./tuned
//
// Compiled by g++ only: yaml-cpp and range-v3 stay out of the nvcc translation units.

#include <cstdio>
#include <exception>
#include <string>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "vlm.hpp"

namespace vlm {
namespace {

constexpr const char* usage = R"(Trains a LLaVA model (transformers' LlavaForConditionalGeneration: a
clip_vision_model or siglip_vision_model tower, the projector, a language
model train_lm reads) on records of one image and its text, on every rank
this process was launched with, and reports the held-out loss. train= names
the parts that train (projector; projector,vision; projector,language; all),
the others frozen. data: a safetensors file of N records: pixel_values
float32 [N, C, H, W] (normalised, at the tower's image_size), input_ids
[N, T] (each image's token expanded to one per feature, as the processor
writes them) and labels [N, T] (int64 or int32, transformers' labels: -100
where no loss), optionally attention_mask [N, T]. The last tenth is held out.
)";

void declare_extra(dtrain::ConfigReader& r, Config& c) {
  r.add("model", c.model,
        "a transformers LLaVA directory (config.json + model.safetensors or a sharded index) to fine-tune");
  r.add("config", c.config, "or a LLaVA config.json to train from scratch (one of the two)");
  r.add("data", c.data, "the records (see above)");
  r.add("train", c.train,
        "the parts that train, comma-separated: projector, vision, language, or all (the others frozen)");
  r.add("save_hf", c.save_hf,
        "at the end, write the model here as a transformers directory (the tower's unrun tensors copied from "
        "model=)");
  r.add("eval_batches", c.eval_batches, "held-out batches per rank evaluated at the end (0 = none)");
  r.add("checkpoint_modules", c.checkpoint_modules,
        "with activation_checkpointing: recompute the units of these transformers modules, by name or shell "
        "pattern: encoder.layers.* (the vision tower's layers), language_model.layers.* (the language model's "
        "blocks) (instead of checkpoint_units numbers)");
  r.section("LoRA adapters on the language model (PEFT's format; its base weights frozen)");
  examples::declare_lora(
      r, c,
      {.rank = "adapter rank (0: no adapters)",
       .targets = "PEFT's target_modules in the language model: module names or suffixes, e.g. "
                  "q_proj,k_proj,v_proj,o_proj, or all-linear (the blocks' linear layers)",
       .modules_to_save = "PEFT's modules_to_save: train these whole beside the adapters: embed_tokens, lm_head "
                          "(untied models)"});
}

void validate_extra(const Config& c) {
  if (c.model.empty() == c.config.empty())
    throw dtrain::config_error("give exactly one of model=DIR (fine-tune) and config=FILE (from scratch)",
                               "see train_vlm --help");
  if (c.data.empty())
    throw dtrain::config_error("data= is missing", "pass data=FILE.safetensors of records (see train_vlm --help)");
  if (c.lora_r == 0 && (!c.lora_targets.empty() || !c.lora_modules_to_save.empty()))
    throw dtrain::config_error("lora_targets/lora_modules_to_save without adapters",
                               "give lora_r=R (e.g. 16) and lora_targets=...");
  examples::validate_checkpoint_modules(c, c.checkpoint_modules);
  if (c.eval_batches < 0) throw dtrain::config_error("eval_batches must be >= 0", "see train_vlm --help");
}

// Trainable and frozen elements (a tied parameter counted once, as its owner).
std::pair<long long, long long> parameter_counts(dtrain::hf::Llava& model) {
  long long trained = 0, frozen = 0;
  dtrain::detail::for_each_unit(model.units(), [&](std::size_t, auto& unit) {
    for (const dtrain::ParamSpec& s : unit.params())
      if (s.tied_to.empty()) (s.trainable ? trained : frozen) += static_cast<long long>(s.numel());
  });
  return {trained, frozen};
}

}  // namespace
}  // namespace vlm

int main(int argc, char** argv) {
  try {
    auto cfg =
        examples::parse_cli<vlm::Config>(argc, argv, "train_vlm", vlm::usage, vlm::declare_extra, vlm::validate_extra);
    // Everything is checked before the job starts: the config, the parts,
    // the adapters (the model is built here) and every record.
    dtrain::hf::Llava model(dtrain::hf::read_llava_config(cfg.model.empty() ? cfg.config : cfg.model),
                            dtrain::hf::parse_llava_train(cfg.train), cfg.lora());
    const dtrain::hf::LlavaConfig& config = model.config;
    for (const auto u : dtrain::hf::units_named(model, cfg.checkpoint_modules))
      cfg.checkpoint_units.push_back(static_cast<std::int64_t>(u));
    const vlm::Records records = vlm::read_records(cfg.data, config);
    const auto [trained, frozen] = vlm::parameter_counts(model);
    auto world = examples::init_world(cfg);
    if (world.rank() == 0)
      std::printf(
          "train_vlm: %d rank(s), llava: %s tower + %s, strategy=%s device=%s precision=%s accumulate=%d "
          "batch=%lld/rank, %lld records (%lld held out) of one %lldx%lld image and %lld tokens, train=%s%s: %lld "
          "trainable parameters, %lld frozen\n",
          world.size(), config.vision.model_type.c_str(), config.text.model_type.c_str(), cfg.strategy.c_str(),
          cfg.device.c_str(), cfg.precision.c_str(), cfg.accumulate, static_cast<long long>(cfg.batch_size),
          static_cast<long long>(records.n), static_cast<long long>(records.n - records.split),
          static_cast<long long>(records.image[1]), static_cast<long long>(records.image[2]),
          static_cast<long long>(records.tokens), cfg.train.c_str(),
          cfg.lora().on() ? (" + LoRA r=" + std::to_string(cfg.lora_r)).c_str() : "", trained, frozen);
    if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
      return vlm::train_cuda(cfg, world, model, records);
#else
      throw dtrain::config_error("this train_vlm was built without CUDA", "use device=host, or rebuild with CUDA");
#endif
    }
    return vlm::train_host(cfg, world, model, records);
  } catch (const std::exception& e) {
    examples::report_failure(e);
    return examples::exit_status(e);
  }
}
