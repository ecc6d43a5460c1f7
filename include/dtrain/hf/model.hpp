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
//
// The output head is tied to the embedding (ParamSpec::tied_to "0.weight")
// when tie_word_embeddings is set: GPT-2 by default, some Llamas.
//   batch: x int32/int64 ids [B, T]; y the next ids [B, T] (-100: ignored)

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/hf/config.hpp"
#include "dtrain/hf/lora.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/any_unit.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/rms_norm.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::hf {

using LlamaBlock = nn::PreNormBlock<nn::RMSNorm, nn::RotaryAttention, nn::MLP<nn::SwiGLU>>;
using Gpt2Block = nn::PreNormBlock<nn::LayerNorm, nn::CausalSelfAttention, nn::MLP<nn::GELUTanh>>;
using Block = nn::OneOf<LlamaBlock, Gpt2Block>;
using FinalNorm = nn::OneOf<nn::RMSNorm, nn::LayerNorm>;

// Block `layer` of the model, with the adapters `lora` plans for it (and
// every base parameter frozen when there are adapters).
inline Block make_block(const LmConfig& c, const LoraPlan& lora = {}, std::int64_t layer = 0) {
  const bool train = !lora.config.on();
  const auto adapter = [&](const char* ours) {
    return lora.adapted(layer, ours) ? lora.config.options() : nn::LoraOptions{};
  };
  if (c.gpt2()) {
    const nn::LayerNormOptions norm{.eps = c.norm_eps, .trainable = train};
    return Gpt2Block(
        c.hidden_size, nn::LayerNorm(c.hidden_size, norm),
        nn::CausalSelfAttention(c.hidden_size, c.num_attention_heads,
                                {.trainable = train, .qkv_lora = adapter("attn.qkv"), .proj_lora = adapter("attn.proj")}),
        nn::LayerNorm(c.hidden_size, norm),
        nn::MLP<nn::GELUTanh>(c.hidden_size, c.intermediate_size,
                              {.trainable = train, .fc1_lora = adapter("mlp.fc1"), .fc2_lora = adapter("mlp.fc2")}));
  }
  const nn::RmsNormOptions norm{.eps = c.norm_eps, .trainable = train};
  return LlamaBlock(c.hidden_size, nn::RMSNorm(c.hidden_size, norm),
                    nn::RotaryAttention(c.hidden_size, c.num_attention_heads,
                                        {.kv_heads = c.num_key_value_heads,
                                         .rope_theta = c.rope_theta,
                                         .qkv_bias = c.qkv_bias,
                                         .out_bias = c.out_bias,
                                         .max_positions = c.max_position_embeddings,
                                         .trainable = train,
                                         .q_lora = adapter("attn.q"),
                                         .k_lora = adapter("attn.k"),
                                         .v_lora = adapter("attn.v"),
                                         .o_lora = adapter("attn.o")}),
                    nn::RMSNorm(c.hidden_size, norm),
                    nn::MLP<nn::SwiGLU>(c.hidden_size, c.intermediate_size,
                                        {.bias = false,
                                         .trainable = train,
                                         .fc1_lora = adapter("mlp.fc1"),
                                         .fc2_lora = adapter("mlp.fc2")}));
}

inline FinalNorm make_final_norm(const LmConfig& c, bool trainable = true) {
  if (c.gpt2()) return nn::LayerNorm(c.hidden_size, {.eps = c.norm_eps, .trainable = trainable});
  return nn::RMSNorm(c.hidden_size, {.eps = c.norm_eps, .trainable = trainable});
}

// `lora` (hf/lora.hpp): LoRA adapters on the blocks' linear layers it
// targets, everything else frozen; none by default (full fine-tuning).
struct CausalLm {
  LmConfig config;
  LoraPlan lora;
  nn::Embedding tok;
  std::vector<nn::PositionalEmbedding> positions;  // GPT-2's learned positions; none for rotary models
  std::vector<Block> blocks;
  FinalNorm norm;
  nn::Linear head;
  nn::SoftmaxCrossEntropy loss;

  explicit CausalLm(LmConfig c, const LoraConfig& adapters = {})
      : config(std::move(c)),
        lora(plan_lora(config, adapters)),
        tok(config.vocab_size, config.hidden_size, {.trainable = !adapters.on()}),
        norm(make_final_norm(config, !adapters.on())),
        head(config.hidden_size, config.vocab_size,
             {.bias = false,
              .trainable = !adapters.on(),
              .tie_weight = config.tie_word_embeddings ? "0.weight" : ""}) {
    if (config.gpt2())
      positions.emplace_back(config.max_position_embeddings, config.hidden_size, 0.02f, !adapters.on());
    blocks.reserve(static_cast<std::size_t>(config.num_hidden_layers));
    for (std::int64_t l = 0; l < config.num_hidden_layers; ++l) blocks.push_back(make_block(config, lora, l));
  }

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
  bool ignored(const std::string& name) const {
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    return (tied && name == "lm_head.weight") || (gpt2 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias")));
  }
  bool tied = false;
  bool gpt2 = false;
};

inline TransformersNames transformers_names(const LmConfig& c) {
  TransformersNames n;
  n.tied = c.tie_word_embeddings;
  n.gpt2 = c.gpt2();
  auto& m = n.tensors;
  const std::int64_t L = c.num_hidden_layers;
  if (c.gpt2()) {
    n.optional_prefix = "transformer.";
    m["0.weight"] = {"transformer.wte.weight"};
    m["1.weight"] = {"transformer.wpe.weight"};
    for (std::int64_t l = 0; l < L; ++l) {
      const std::string u = std::to_string(l + 2) + ".", h = "transformer.h." + std::to_string(l) + ".";
      struct Part {
        const char* ours;
        const char* theirs;
        bool conv1d;  // a Conv1D layer: its weight is stored [in, out]
      };
      const Part parts[] = {{"ln1", "ln_1", false},         {"attn.qkv", "attn.c_attn", true},
                            {"attn.proj", "attn.c_proj", true}, {"ln2", "ln_2", false},
                            {"mlp.fc1", "mlp.c_fc", true},      {"mlp.fc2", "mlp.c_proj", true}};
      for (const auto& [ours, theirs, conv1d] : parts) {
        m[u + ours + ".weight"] = {h + theirs + ".weight"};
        m[u + ours + ".bias"] = {h + theirs + ".bias"};
        if (conv1d) n.transposed.insert(u + ours + ".weight");
      }
    }
    m[std::to_string(L + 2) + ".weight"] = {"transformer.ln_f.weight"};
    m[std::to_string(L + 2) + ".bias"] = {"transformer.ln_f.bias"};
    if (!c.tie_word_embeddings) m[std::to_string(L + 3) + ".weight"] = {"lm_head.weight"};
    return n;
  }
  m["0.weight"] = {"model.embed_tokens.weight"};
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string u = std::to_string(l + 1) + ".", h = "model.layers." + std::to_string(l) + ".";
    m[u + "ln1.weight"] = {h + "input_layernorm.weight"};
    for (const char* p : {"q", "k", "v", "o"}) m[u + "attn." + p + ".weight"] = {h + "self_attn." + p + "_proj.weight"};
    if (c.qkv_bias)
      for (const char* p : {"q", "k", "v"}) m[u + "attn." + p + ".bias"] = {h + "self_attn." + p + "_proj.bias"};
    if (c.out_bias) m[u + "attn.o.bias"] = {h + "self_attn.o_proj.bias"};
    m[u + "ln2.weight"] = {h + "post_attention_layernorm.weight"};
    m[u + "mlp.fc1.weight"] = {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"};
    m[u + "mlp.fc2.weight"] = {h + "mlp.down_proj.weight"};
  }
  m[std::to_string(L + 1) + ".weight"] = {"model.norm.weight"};
  if (!c.tie_word_embeddings) m[std::to_string(L + 2) + ".weight"] = {"lm_head.weight"};
  return n;
}

}  // namespace dtrain::hf
