// The definitions causal_lm.hpp declares with DTRAIN_DECL (core/macros.hpp).
#pragma once

#include "dtrain/models/causal_lm.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::models {
  DTRAIN_DECL hf::LoraConfig CausalLmConfig::lora() const {
    return adapter.empty() ? lora_keys() : hf::read_adapter_config(adapter);
  }

}  // namespace dtrain::models

DTRAIN_IMPL_END
