#pragma once
// hf::CausalLm: a transformers causal language model built from its config
// (hf::LmConfig), with its tensor names mapped to and from the transformers
// checkpoint layout (hf::transformers_names). One model type covers every
// supported architecture, so a program that reads the architecture from
// config.json compiles one Trainer:
//
//   GPT-2 (gpt2)      units 0 Embedding wte, 1 PositionalEmbedding wpe,
//                     2 .. L+1 blocks (ln_1, attn c_attn|c_proj, ln_2, tanh-GELU mlp),
//                     L+2 LayerNorm ln_f, L+3 Linear lm_head
//   Llama family      units 0 Embedding embed_tokens, 1 .. L blocks (input_layernorm,
//                     self_attn q|k|v|o with rotary positions and grouped-query heads,
//                     post_attention_layernorm, SwiGLU mlp), L+1 RMSNorm norm, L+2 lm_head
//   Gemma             as the Llama family, its RMSNorms scaling by 1 + weight, a GeGLU mlp
//                     (tanh GELU) and the embedding's rows times sqrt(hidden_size)
//   Gemma 3 text      as Gemma, each block input_layernorm, self_attn (q_norm, k_norm;
//                     sliding window and local rotary base on local layers),
//                     post_attention_layernorm, pre_feedforward_layernorm, mlp,
//                     post_feedforward_layernorm (nn::SandwichBlock)
//
// The output head is tied to the embedding (ParamSpec::tied_to "0.weight")
// when tie_word_embeddings is set: GPT-2 by default, some Llamas.
//   batch: x int32/int64 ids [B, T]; y the next ids [B, T] (-100: ignored);
//          under a preference loss also ref_logps [B] (nn::PreferenceLoss)

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/hf/config.hpp"
#include "dtrain/hf/lora.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/any_unit.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/grpo_loss.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/one_of_loss.hpp"
#include "dtrain/nn/preference_loss.hpp"
#include "dtrain/nn/rms_norm.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/sandwich_block.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::hf {

using LlamaBlock = nn::PreNormBlock<nn::RMSNorm, nn::RotaryAttention, nn::MLP<nn::SwiGLU>>;
using Gpt2Block = nn::PreNormBlock<nn::LayerNorm, nn::CausalSelfAttention, nn::MLP<nn::GELUTanh>>;
using GemmaBlock = nn::PreNormBlock<nn::RMSNorm, nn::RotaryAttention, nn::MLP<nn::GeGLU>>;
using Gemma3Block = nn::SandwichBlock<nn::RMSNorm, nn::RotaryAttention, nn::MLP<nn::GeGLU>>;
using Block = nn::OneOf<LlamaBlock, Gpt2Block, GemmaBlock, Gemma3Block>;
using FinalNorm = nn::OneOf<nn::RMSNorm, nn::LayerNorm>;

// Block `layer` of the model, with the adapters `lora` plans for it (and
// every base parameter frozen when there are adapters, or when not
// `trainable`: a frozen language model).
DTRAIN_DECL Block make_block(const LmConfig& c, const LoraPlan& lora = {}, std::int64_t layer = 0,
                             bool trainable = true);

DTRAIN_DECL FinalNorm make_final_norm(const LmConfig& c, bool trainable = true);

// The token embedding's options: Gemma's scale and padding row.
DTRAIN_DECL nn::EmbeddingOptions embedding_options(const LmConfig& c, bool trainable = true);

// The output head: tied to the parameter `tie_to` ("<unit>.weight", the
// token embedding's) when the config ties it; trained unless there are
// adapters (then as `lora` plans: saved whole or adapted) or not `trainable`.
DTRAIN_DECL nn::Linear make_head(const LmConfig& c, const LoraPlan& lora, const std::string& tie_to,
                                 bool trainable = true);

// `lora` (hf/lora.hpp): LoRA adapters on the blocks' linear layers it
// targets, everything else frozen but its modules_to_save; none by default
// (full fine-tuning).
struct CausalLm {
  LmConfig config;
  LoraPlan lora;
  nn::Embedding tok;
  std::vector<nn::PositionalEmbedding> positions;  // GPT-2's learned positions; none for rotary models
  std::vector<Block> blocks;
  FinalNorm norm;
  nn::Linear head;
  // Next-token cross-entropy, a preference loss (DPO: assign an
  // nn::PreferenceLoss; its micro-batches are pairs, as
  // data/preference.hpp's preference_batch builds them), or GRPO's policy
  // loss (nn::GrpoLoss over train/grpo.hpp's batches).
  nn::OneOfLoss<nn::SoftmaxCrossEntropy, nn::PreferenceLoss, nn::GrpoLoss> loss;

  // trainable false: every parameter frozen (a reference model, e.g. DPO's
  // frozen copy of the policy; no adapters then).
  DTRAIN_DECL explicit CausalLm(LmConfig c, const LoraConfig& adapters = {}, bool trainable = true);

  auto units() { return std::tie(tok, positions, blocks, norm, head); }
};

// How dtrain's tensors ("<unit>.<param>") are stored by transformers.
struct TransformersNames {
  // dtrain tensor -> the transformers tensors whose elements, concatenated
  // in order, make it (two for Llama's fused gate|up projection).
  std::map<std::string, std::vector<std::string>> tensors;
  // dtrain tensors that transformers stores transposed, [in, out]: GPT-2's
  // Conv1D weights (dtrain's Linear is [out, in]).
  std::set<std::string> transposed;
  // A prefix the files may lack (GPT-2 checkpoints saved from the base model
  // name "h.0.ln_1.weight" for "transformer.h.0.ln_1.weight").
  std::string optional_prefix;
  // Tensors a checkpoint may hold that are not parameters: GPT-2's causal
  // mask buffers, and lm_head.weight when the head is tied.
  DTRAIN_DECL bool ignored(const std::string& name) const;
  bool tied = false;
  bool gpt2 = false;
};

DTRAIN_DECL TransformersNames transformers_names(const LmConfig& c);

// The transformers module each unit of CausalLm is, in unit order: GPT-2's
// transformer.wte, transformer.wpe, transformer.h.0 ..., transformer.ln_f,
// lm_head; the Llama family's model.embed_tokens, model.layers.0 ...,
// model.norm, lm_head.
DTRAIN_DECL std::vector<std::string> unit_modules(const LmConfig& c);

// The units whose module one of `patterns` names, in unit order (for
// TrainerOptions::checkpoint_units). A pattern names a module when it
// matches the whole name or a part after a '.', as a shell pattern (fnmatch:
// `*`, `?`, `[0-3]`): "layers.*" and "model.layers.1?" name blocks, "h.0"
// GPT-2's first. A pattern that names no module is a config_error listing
// the model's modules.
DTRAIN_DECL std::vector<std::size_t> units_named(const LmConfig& c, const std::vector<std::string>& patterns);

// The same over any model's unit modules (`modules`, in unit order; an
// empty name is a unit no pattern names); `model` names it in the error.
DTRAIN_DECL std::vector<std::size_t> units_named(const std::vector<std::string>& modules,
                                                 const std::vector<std::string>& patterns, const std::string& model);

}  // namespace dtrain::hf

#if DTRAIN_DEFINE_IMPL
#include "dtrain/hf/model.ipp"
#endif
