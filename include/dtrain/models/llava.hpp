#pragma once
// A ready model's keys: train_vlm's, for hf::Llava (hf/llava.hpp), a
// transformers LLaVA model (a CLIP or SigLIP tower, a projector, a language
// model) fine-tuned from its checkpoint or trained from its config.json,
// some of its parts trained (train=), LoRA adapters on its language model
// (examples/vlm trains it).
//
//   units: as hf::Llava (the tower, the projector, the merge, the language model)
//   batch: pixel_values float32 [B, 3, H, W], x int32 [B, T] ids with each
//          image's tokens expanded, y int32 [B, T] the next ones (-100: no
//          loss), optional attention_mask [B, T]

#include <string>

#include "dtrain/hf/lora.hpp"
#include "dtrain/models/lora_keys.hpp"
#include "dtrain/models/run_config.hpp"

namespace dtrain::models {

struct LlavaRunConfig : RunConfig, LoraKeys {
  std::string model;                // a transformers LLaVA directory to fine-tune
  std::string config;               // or a LLaVA config.json to train from scratch
  std::string train = "projector";  // the parts that train (hf::parse_llava_train): LLaVA's first stage

  // The adapters on the language model the lora_ keys describe (none with lora_r = 0).
  hf::LoraConfig lora() const { return lora_keys(); }
};

}  // namespace dtrain::models
