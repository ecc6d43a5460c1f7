#pragma once
// A transformers config.json read into what dtrain needs to build the model
// (hf::LmConfig), checked against what dtrain supports. Supported: GPT-2
// (model_type "gpt2": learned positions, LayerNorm, tanh GELU, output head
// tied to the token embedding unless tie_word_embeddings is false) and the
// Llama family, model_type "llama" (Llama 2 and 3), "mistral" (without a
// sliding window shorter than the context) and "qwen2" (biases on q, k and
// v), tied or not; Gemma, model_type "gemma" (RMSNorm scaling by 1 + weight,
// GeGLU MLP with the tanh GELU, embeddings times sqrt(hidden_size), tied by
// default) and Gemma 3's text model "gemma3_text" (Gemma's parts with QK-norm,
// post-norms on attention and MLP outputs, query_pre_attn_scalar, local
// sliding-window layers beside global ones, each with its own rotary base,
// linear rope scaling on the global ones); Qwen3, "qwen3" (the Llama family
// with QK-norm and its own head_dim). Anything else, and any option that would change the
// computation in a way dtrain does not implement (rope_scaling, another
// activation, GPT-2's per-layer attention scaling), is a config_error naming
// the key and what is supported: better no model than a silently different
// one. Dropout probabilities in a config are kept (written back on save) but
// not applied: dtrain trains these models without dropout.

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain::hf {

struct LmConfig {
  std::string model_type;  // gpt2 | llama | mistral | qwen2 | qwen3 | gemma | gemma3_text
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t max_position_embeddings = 0;
  float norm_eps = 1e-6f;  // rms_norm_eps (Llama family) or layer_norm_epsilon (GPT-2)
  float rope_theta = 10000.f;
  bool qkv_bias = false;             // attention_bias (llama), always on for qwen2
  bool out_bias = false;             // attention_bias (llama)
  bool tie_word_embeddings = false;  // the output head is the token embedding
  // Gemma 3 (gemma3_text): the scores' scale (query_pre_attn_scalar^-0.5;
  // 0 for 1 / sqrt(head_dim)), the window of the local layers, which layers
  // are local (sliding_attention: 1) and their rotary base, and the linear
  // rope scaling factor of the global layers (1: none).
  float attention_scale = 0.f;
  // Gemma's and Qwen3's head_dim, which need not be hidden_size /
  // num_attention_heads (0: it is); the other families' head_dim must be.
  std::int64_t head_size = 0;
  // Gemma, Qwen3: pad_token_id, the embedding's padding_idx (its row gets
  // no gradient from the lookup, as in transformers); -1: none.
  std::int64_t pad_token_id = -1;
  std::int64_t sliding_window = 0;
  std::vector<char> local_layers;
  float rope_local_theta = 10000.f;
  float rope_factor = 1.f;
  std::string json_text;  // the whole file (compact JSON, keys in order), written back on save

  std::int64_t head_dim() const { return head_size > 0 ? head_size : hidden_size / num_attention_heads; }
  // GPT-2: learned positions, LayerNorm, tanh GELU MLP, biases everywhere.
  // Otherwise the Llama family: rotary positions, RMSNorm, SwiGLU MLP;
  // Gemma's members with their RMSNorm scaling by 1 + weight, GeGLU and
  // embeddings times sqrt(hidden_size), Gemma 3's blocks with four norms.
  bool gpt2() const { return model_type == "gpt2"; }
  bool gemma() const { return model_type == "gemma" || gemma3(); }
  bool gemma3() const { return model_type == "gemma3_text"; }
  bool qwen3() const { return model_type == "qwen3"; }
  // QK-norm (q_norm, k_norm over head_dim before the rotation): Gemma 3, Qwen3.
  bool qk_norm() const { return gemma3() || qwen3(); }
  bool local(std::int64_t layer) const {
    return layer >= 0 && static_cast<std::size_t>(layer) < local_layers.size() &&
           local_layers[static_cast<std::size_t>(layer)] != 0;
  }
};

namespace detail {

inline const char* supported_types() { return "gpt2, llama, mistral, qwen2, qwen3, gemma, gemma3_text"; }

DTRAIN_DECL bool flag(const nlohmann::ordered_json& j, const char* key, bool fallback);

// Every size >= 1 and the head counts dividing; `keys` name the sizes as
// this config's file does (vocab_size, hidden_size, intermediate_size,
// layers, heads, kv heads, positions).
DTRAIN_DECL void check_sizes(const LmConfig& c, const std::string& where, const std::array<const char*, 7>& keys);

// GPT-2's config.json: n_embd, n_layer, n_head, n_positions, n_inner.
DTRAIN_DECL LmConfig parse_gpt2(const nlohmann::ordered_json& j, const std::string& where);

// What Gemma and Gemma 3 add to (or refuse in) the Llama family's keys read into `c`.
DTRAIN_DECL void parse_gemma(const nlohmann::ordered_json& j, const std::string& where, LmConfig& c);

// Gemma's and Qwen3's head_dim (transformers' default `fallback`) and pad_token_id.
DTRAIN_DECL void parse_head_and_padding(const nlohmann::ordered_json& j, const std::string& where, LmConfig& c,
                                        std::int64_t fallback);

}  // namespace detail

// Checks and reads a parsed config; `where` names it in errors.
DTRAIN_DECL LmConfig parse_config(const nlohmann::ordered_json& j, const std::string& where);

// Reads and checks `path` (a config.json, or the directory holding one).
DTRAIN_DECL LmConfig read_config(std::filesystem::path path);

}  // namespace dtrain::hf

#if DTRAIN_DEFINE_IMPL
#include "dtrain/hf/config.ipp"
#endif
