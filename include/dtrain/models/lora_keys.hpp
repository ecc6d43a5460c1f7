#pragma once
// The LoRA keys of the ready language models (train_lm's CausalLmConfig,
// train_vlm's LlavaRunConfig): adapters of rank lora_r on the lora_targets
// (hf/lora.hpp), the base weights frozen.

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/hf/lora.hpp"

namespace dtrain::models {

struct LoraKeys {
  std::int64_t lora_r = 0;
  float lora_alpha = 8.f;
  float lora_dropout = 0.f;
  bool lora_rslora = false;
  std::vector<std::string> lora_targets;
  std::vector<std::string> lora_modules_to_save;  // PEFT's modules_to_save: embeddings or head trained whole

  // The adapters these keys describe (none with lora_r = 0).
  hf::LoraConfig lora_keys() const {
    return {.r = lora_r,
            .alpha = lora_alpha,
            .dropout = lora_dropout,
            .rslora = lora_rslora,
            .targets = lora_targets,
            .modules_to_save = lora_modules_to_save};
  }
};

}  // namespace dtrain::models
