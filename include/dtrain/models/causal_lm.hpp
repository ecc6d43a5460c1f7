#pragma once
// A ready model's keys: train_lm's, for hf::CausalLm (hf/model.hpp), a GPT-2
// or Llama-family transformers model fine-tuned from its checkpoint or
// trained from its config.json, whole or with LoRA adapters (examples/lm
// trains it).
//
//   units: as hf::CausalLm (embeddings, blocks, final norm, lm_head)
//   batch: x int32 [B, block_size] ids, y int32 [B, block_size] the next
//          ones; packed records add position_ids int64 [B, block_size]

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/hf/lora.hpp"
#include "dtrain/models/lora_keys.hpp"
#include "dtrain/models/run_config.hpp"

namespace dtrain::models {

struct CausalLmConfig : RunConfig, LoraKeys {
  std::string model;              // a transformers model directory to fine-tune
  std::string config;             // or a config.json to train from scratch
  std::int64_t block_size = 128;  // positions per sequence
  bool packing = false;           // pack the training records into full blocks (position_ids restart per record)
  std::string adapter;            // a PEFT adapter directory to load (and continue training)

  // The adapters to build: those of `adapter` (whose config it reads, its
  // lora_dropout included), else the lora_ keys.
  DTRAIN_DECL hf::LoraConfig lora() const;
};

}  // namespace dtrain::models

#if DTRAIN_DEFINE_IMPL
#include "dtrain/models/causal_lm.ipp"
#endif
