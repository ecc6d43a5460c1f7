#pragma once
// LoRA on a transformers causal LM, as PEFT configures it: which of the
// model's linear layers get adapters (LoraConfig::targets, PEFT's
// target_modules), and the names PEFT gives the adapters' tensors.
//
// A target is matched against each linear layer's transformers module name
// ("model.layers.3.self_attn.q_proj", "transformer.h.0.mlp.c_fc") as PEFT
// matches a list: the whole name, or a suffix after a dot ("q_proj",
// "mlp.c_proj", "layers.3.self_attn.q_proj"); "all-linear" is every linear
// layer of the blocks (never the output head, as in PEFT); with `regex` the
// one target is a regular expression over the whole name (PEFT's string
// form; io/pattern.hpp says what it takes). The output head "lm_head" is
// adapted when a target names it and it is not tied to the embedding
// (tie_word_embeddings). The layers: Llama family q_proj k_proj v_proj
// o_proj gate_proj up_proj down_proj; GPT-2 c_attn c_proj (attention and
// MLP: PEFT's suffix "c_proj" matches both) c_fc. Llama's gate_proj and
// up_proj are one fused projection in dtrain with an adapter per half, so
// they are adapted together or not at all.
//
// With adapters on, every other parameter of the model is frozen (PEFT's
// default: bias "none", no modules_to_save), so only the adapters have
// gradients, master copies and optimizer state; modules_to_save names the
// embeddings or the output head to train whole beside them.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/hf/config.hpp"
#include "dtrain/nn/lora.hpp"

namespace dtrain::hf {

struct LoraConfig {
  std::int64_t r = 0;                  // the rank; 0: no adapters (full fine-tuning)
  float alpha = 8.f;                   // lora_alpha (PEFT's default 8)
  float dropout = 0.f;                 // lora_dropout: dropout on the adapters' input in training, in [0, 1)
  bool rslora = false;                 // use_rslora: scale alpha / sqrt(r)
  std::vector<std::string> targets{};  // target_modules
  bool regex = false;                  // targets[0] is a regular expression over whole names (RegexPattern)
  // PEFT's modules_to_save: modules trained whole (not frozen) and saved
  // beside the adapters. dtrain takes the embeddings and the output head
  // ("embed_tokens", "lm_head"; GPT-2's "wpe"), untied ones only.
  std::vector<std::string> modules_to_save{};

  bool on() const noexcept { return r > 0; }
  nn::LoraOptions options() const { return {.r = r, .alpha = alpha, .rslora = rslora, .dropout = dropout}; }
};

// One linear layer of a block: its transformers module name and dtrain's
// projection in the block unit ("attn.q", "attn.qkv", "mlp.fc1", ...);
// `part` is gate_proj (0) or up_proj (1) of the fused fc1, else -1.
struct LinearModule {
  std::string module;
  std::string ours;
  int part = -1;
};

namespace detail {
// PEFT's match of a listed name: the module's whole name, or a suffix after a dot.
inline bool names_module(const std::string& name, const std::string& module) {
  return module == name || (module.size() > name.size() && module.ends_with("." + name));
}
}  // namespace detail

// The linear layers of block `layer`, in dtrain's order of projections.
DTRAIN_DECL std::vector<LinearModule> block_linears(const LmConfig& c, std::int64_t layer);

// Which projections of each block get adapters: per layer, dtrain's
// projection names ("attn.q", "mlp.fc1", ...).
struct LoraPlan {
  LoraConfig config;
  std::vector<std::vector<std::string>> layers;
  // modules_to_save: which of the token embedding, the learned positions
  // (GPT-2) and the output head train whole beside the adapters.
  bool save_embedding = false;
  bool save_positions = false;
  bool save_head = false;
  // An adapter on the output head (untied heads only).
  bool head = false;

  // Whether layer `layer`'s module `ours` has an adapter.
  DTRAIN_DECL bool adapted(std::int64_t layer, const std::string& ours) const;
};

// Resolves the targets and modules_to_save on this model. Errors
// (config_error, naming the fix): a target that matches no linear layer,
// one that matches a tied output head, the head both adapted and saved
// whole, gate_proj without
// up_proj or the reverse, a pattern that is not a regular expression; a
// module to save that is not an embedding or the head, or is tied (the
// embedding and head of tie_word_embeddings), or modules to save without
// adapters. The rank and alpha are checked when the units are built
// (nn::LoraOptions).
DTRAIN_DECL LoraPlan plan_lora(const LmConfig& c, const LoraConfig& lora);

// The unit of block `layer` (the "<unit>." of its tensors' names).
inline std::int64_t block_unit(const LmConfig& c, std::int64_t layer) { return layer + (c.gpt2() ? 2 : 1); }
// The output head's unit: after the blocks and the final norm.
inline std::int64_t head_unit(const LmConfig& c) { return block_unit(c, c.num_hidden_layers) + 1; }

// The adapters' tensors ("<unit>.attn.q.lora_A") -> their names in PEFT's
// adapter_model.safetensors ("base_model.model.model.layers.0.self_attn.
// q_proj.lora_A.weight"); the fused gate|up's two, its halves along the
// first dimension. Both A [r, in] and B [out, r] keep PEFT's layout, GPT-2's
// Conv1D layers included. The modules to save are there too, under their
// module's name ("0.weight" -> "base_model.model.model.embed_tokens.weight").
DTRAIN_DECL std::map<std::string, std::vector<std::string>> peft_names(const LmConfig& c, const LoraPlan& plan);
// The frozen base weights PEFT may save beside the adapters, by their names
// there: with an adapter on the output head, PEFT (save_embedding_layers
// "auto") writes the head's own weight as
// "base_model.model.lm_head.base_layer.weight", and loads it back. dtrain
// loads it when present and does not write it.
DTRAIN_DECL std::map<std::string, std::string> peft_base_layers(const LmConfig& c, const LoraPlan& plan);

// PEFT's adapter_config.json for these adapters on the model `base` (its
// name or path, for base_model_name_or_path).
DTRAIN_DECL std::string adapter_config_json(const LmConfig& c, const LoraConfig& lora, const std::string& base);

// The adapters an adapter directory's adapter_config.json describes.
// Refused by name (config_error): another PEFT method than LoRA, DoRA,
// biases other than "none", rank or alpha patterns and layers_to_transform
// (and modules_to_save other than the embeddings and head, when the model
// is built: plan_lora). lora_dropout is read as the file says (training
// applies it, evaluation never does).
DTRAIN_DECL LoraConfig read_adapter_config(const std::filesystem::path& dir);
// The same from the JSON text of a PEFT LoraConfig (`where` names it in
// errors): diffusers keeps one in a LoRA file's metadata.
DTRAIN_DECL LoraConfig parse_adapter_config(const std::string& json_text, const std::string& where);

}  // namespace dtrain::hf

#if DTRAIN_DEFINE_IMPL
#include "dtrain/hf/lora.ipp"
#endif
