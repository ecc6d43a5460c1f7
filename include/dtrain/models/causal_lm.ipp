// The definitions causal_lm.hpp declares with DTRAIN_DECL (core/macros.hpp).
#pragma once

#include "dtrain/models/causal_lm.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::models {
  DTRAIN_DECL hf::LoraConfig CausalLmConfig::lora() const {
    if (adapter.empty())
      return {.r = lora_r,
              .alpha = lora_alpha,
              .dropout = lora_dropout,
              .rslora = lora_rslora,
              .targets = lora_targets,
              .modules_to_save = lora_modules_to_save};
    return hf::read_adapter_config(adapter);
  }

}  // namespace dtrain::models

DTRAIN_IMPL_END
