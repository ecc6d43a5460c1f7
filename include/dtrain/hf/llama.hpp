#pragma once
// hf::Llama: a Llama-family causal language model (Llama 2/3, Mistral,
// Qwen2) built from a transformers config, with its names mapped to and from
// the transformers checkpoint layout.
//
//   units: 0 nn::Embedding (embed_tokens), 1 .. L blocks (input_layernorm,
//          self_attn, post_attention_layernorm, SwiGLU mlp), L + 1 nn::RMSNorm
//          (norm), L + 2 nn::Linear lm_head (no bias, untied)
//   batch: x int32/int64 ids [B, T]; y the next ids [B, T] (-100: ignored)
//
// The MLP's gate and up projections are one Linear ("mlp.fc1", gate rows
// first), read from and written to transformers' two tensors.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/hf/config.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/rms_norm.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::hf {

using LlamaBlock = nn::PreNormBlock<nn::RMSNorm, nn::RotaryAttention, nn::MLP<nn::SwiGLU>>;

inline LlamaBlock llama_block(const LmConfig& c) {
  const nn::RmsNormOptions norm{.eps = c.rms_norm_eps};
  return LlamaBlock(c.hidden_size, nn::RMSNorm(c.hidden_size, norm),
                    nn::RotaryAttention(c.hidden_size, c.num_attention_heads,
                                        {.kv_heads = c.num_key_value_heads,
                                         .rope_theta = c.rope_theta,
                                         .qkv_bias = c.qkv_bias,
                                         .out_bias = c.out_bias,
                                         .max_positions = c.max_position_embeddings}),
                    nn::RMSNorm(c.hidden_size, norm),
                    nn::MLP<nn::SwiGLU>(c.hidden_size, c.intermediate_size, {.bias = false}));
}

struct Llama {
  LmConfig config;
  nn::Embedding tok;
  std::vector<LlamaBlock> blocks;
  nn::RMSNorm norm;
  nn::Linear head;
  nn::SoftmaxCrossEntropy loss;

  explicit Llama(LmConfig c)
      : config(std::move(c)),
        tok(config.vocab_size, config.hidden_size),
        blocks(static_cast<std::size_t>(config.num_hidden_layers), llama_block(config)),
        norm(config.hidden_size, {.eps = config.rms_norm_eps}),
        head(config.hidden_size, config.vocab_size, {.bias = false}) {}

  auto units() { return std::tie(tok, blocks, norm, head); }
};

// For each dtrain tensor ("<unit>.<param>") the transformers tensors whose
// elements, concatenated in order, make it.
inline std::map<std::string, std::vector<std::string>> transformers_names(const LmConfig& c) {
  std::map<std::string, std::vector<std::string>> m;
  m["0.weight"] = {"model.embed_tokens.weight"};
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
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
  m[std::to_string(c.num_hidden_layers + 1) + ".weight"] = {"model.norm.weight"};
  m[std::to_string(c.num_hidden_layers + 2) + ".weight"] = {"lm_head.weight"};
  return m;
}

}  // namespace dtrain::hf
