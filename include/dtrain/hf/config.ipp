// The definitions config.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <cmath>

#include "dtrain/hf/config.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::hf {
  namespace detail {

  // key's value from `j`, which must hold it as a number (or `fallback` when
  // absent and a fallback is given).
  template <class V>
  V number(const nlohmann::ordered_json& j, const std::string& where, const char* key, const V* fallback = nullptr) {
    if (!j.contains(key) || j.at(key).is_null()) {
      if (fallback != nullptr) return *fallback;
      throw config_error(where + ": the key \"" + key + "\" is missing",
                         "give the model's config.json as transformers wrote it");
    }
    if (const auto x = ::dtrain::detail::json_number<V>(j.at(key))) return *x;
    throw config_error(where + ": \"" + key + "\" must be a number" +
                           (std::is_integral_v<V> ? " (a whole one in range)" : " (finite, in float's range)") +
                           ", not " + ::dtrain::detail::json_shown(j.at(key)),
                       "give the model's config.json as transformers wrote it");
  }

  // The rotary base. transformers 4 writes it as "rope_theta" (and any
  // scaling as "rope_scaling"); transformers 5 as "rope_parameters":
  // {"rope_type": "default", "rope_theta": ...}. Either is read; a file with
  // both must agree, and every rotary variant but the default is refused by
  // name (its positions would be silently wrong otherwise).
  inline float rope_theta(const nlohmann::ordered_json& j, const std::string& where) {
    const float fallback = 10000.f;
    float theta = number<float>(j, where, "rope_theta", &fallback);
    if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null())
      throw config_error(where + ": rope_scaling " + j.at("rope_scaling").dump() + " is not supported",
                         "use a model without rope_scaling (Llama 3.1+ long-context scaling is not implemented)");
    if (!j.contains("rope_parameters") || j.at("rope_parameters").is_null()) return theta;
    const auto& rp = j.at("rope_parameters");
    const std::string in = where + ": rope_parameters";
    if (!rp.is_object())
      throw config_error(in + " " + rp.dump() + " is not an object",
                         "give the model's config.json as transformers wrote it");
    for (const auto& [key, value] : rp.items()) {
      if (key == "rope_theta") continue;
      if (key == "rope_type" || key == "type") {
        if (value.is_string() && value.get<std::string>() == "default") continue;
        throw config_error(in + " " + key + " " + value.dump() + " is not supported",
                           "use a model with the default rotary embedding (rope_type \"default\"): scaled variants "
                           "(linear, dynamic, yarn, llama3, longrope) are not implemented");
      }
      throw config_error(in + " key \"" + key + "\" (" + value.dump() + ") is not supported",
                         "use a model whose rope_parameters hold only rope_type \"default\" and rope_theta");
    }
    if (rp.contains("rope_theta")) {
      const float nested = number<float>(rp, in, "rope_theta");
      if (j.contains("rope_theta") && !j.at("rope_theta").is_null() && nested != theta)
        throw config_error(where + ": rope_theta " + j.at("rope_theta").dump() + " and rope_parameters.rope_theta " +
                               rp.at("rope_theta").dump() + " disagree",
                           "keep one of them (transformers 5 reads rope_parameters)");
      theta = nested;
    }
    return theta;
  }

  DTRAIN_DECL bool flag(const nlohmann::ordered_json& j, const char* key, bool fallback) {
    return j.contains(key) && j.at(key).is_boolean() ? j.at(key).get<bool>() : fallback;
  }

  DTRAIN_DECL void check_sizes(const LmConfig& c, const std::string& where, const std::array<const char*, 7>& keys) {
    const std::int64_t values[] = {
        c.vocab_size,          c.hidden_size,         c.intermediate_size,      c.num_hidden_layers,
        c.num_attention_heads, c.num_key_value_heads, c.max_position_embeddings};
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (values[i] < 1)
        throw config_error(
            where + ": \"" + std::string(keys[i]) + "\" is " + std::to_string(values[i]) + "; it must be >= 1",
            "give the model's config.json as transformers wrote it");
    // Every tensor's size (and offsets into the flat parameter buffer) is an
    // int64 product of these: a config whose parameters would not fit 2^53 is
    // refused before anything multiplies them.
    const long double h = static_cast<long double>(c.hidden_size);
    const long double params =
        2.0L * c.vocab_size * h + static_cast<long double>(c.max_position_embeddings) * h +
        static_cast<long double>(c.num_hidden_layers) * (4.0L * h * h + 3.0L * h * c.intermediate_size);
    if (params > 9007199254740992.0L)
      throw config_error(where + " describes about " + std::to_string(static_cast<double>(params)) +
                             " parameters, more than the 2^53 dtrain can address",
                         "check the sizes (vocab_size, hidden_size, intermediate_size, layers)");
    if (c.hidden_size % c.num_attention_heads != 0 || c.num_attention_heads % c.num_key_value_heads != 0)
      throw config_error(where + ": " + keys[1] + " " + std::to_string(c.hidden_size) + ", " + keys[4] + " " +
                             std::to_string(c.num_attention_heads) + " and " + keys[5] + " " +
                             std::to_string(c.num_key_value_heads) + " do not divide",
                         std::string("the head count must divide the width (and the key/value heads the heads)"));
  }

  DTRAIN_DECL LmConfig parse_gpt2(const nlohmann::ordered_json& j, const std::string& where) {
    LmConfig c;
    c.model_type = "gpt2";
    c.json_text = j.dump();
    c.vocab_size = number<std::int64_t>(j, where, "vocab_size");
    c.hidden_size = number<std::int64_t>(j, where, "n_embd");
    // transformers' default, 4 x n_embd; a width so large (or below 1) that
    // four times it would overflow is kept as it is, for the checks below to
    // name (found by fuzzing: 4 x 5e18 was signed overflow).
    const std::int64_t inner = c.hidden_size >= 1 && c.hidden_size <= std::numeric_limits<std::int64_t>::max() / 4
                                   ? 4 * c.hidden_size
                                   : c.hidden_size;
    c.intermediate_size = number<std::int64_t>(j, where, "n_inner", &inner);
    c.num_hidden_layers = number<std::int64_t>(j, where, "n_layer");
    c.num_attention_heads = c.num_key_value_heads = number<std::int64_t>(j, where, "n_head");
    c.max_position_embeddings = number<std::int64_t>(j, where, "n_positions");
    const float eps = 1e-5f;
    c.norm_eps = number<float>(j, where, "layer_norm_epsilon", &eps);
    c.rope_theta = 0.f;  // learned positions
    c.qkv_bias = c.out_bias = true;
    c.tie_word_embeddings = flag(j, "tie_word_embeddings", true);  // GPT-2's default
    check_sizes(c, where, {"vocab_size", "n_embd", "n_inner", "n_layer", "n_head", "n_head", "n_positions"});
    auto unsupported = [&](const std::string& what, const std::string& fix) {
      throw config_error(where + ": " + what + " is not supported", fix);
    };
    const std::string act = j.contains("activation_function") && j.at("activation_function").is_string()
                                ? j.at("activation_function").get<std::string>()
                                : "gelu_new";
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      unsupported("activation_function \"" + act + "\"", "dtrain's GPT-2 MLP uses the tanh GELU (\"gelu_new\")");
    if (!flag(j, "scale_attn_weights", true))
      unsupported("scale_attn_weights false", "use a model that scales attention by 1/sqrt(head_dim)");
    if (flag(j, "scale_attn_by_inverse_layer_idx", false))
      unsupported("scale_attn_by_inverse_layer_idx true", "use a model without per-layer attention scaling");
    if (flag(j, "add_cross_attention", false))
      unsupported("add_cross_attention true", "use a decoder-only GPT-2 (no cross-attention)");
    return c;
  }

  // One rotary setting: {"rope_type": "default" | "linear", "rope_theta", "factor"}
  // (transformers 5's rope_parameters entry, or 4's rope_scaling with `theta`
  // beside it). Linear scaling divides the frequencies by the factor; every
  // other rope_type is refused by name.
  inline void read_rope(const nlohmann::ordered_json& rp, const std::string& in, float& theta, float& factor) {
    if (!rp.is_object())
      throw config_error(in + " " + rp.dump() + " is not an object",
                         "give the model's config.json as transformers wrote it");
    std::string type = "default";
    for (const char* key : {"rope_type", "type"})
      if (rp.contains(key) && rp.at(key).is_string()) type = rp.at(key).get<std::string>();
    if (type != "default" && type != "linear")
      throw config_error(in + " rope_type \"" + type + "\" is not supported",
                         "use a model whose rotary embedding is \"default\" or \"linear\" (dynamic, yarn, llama3 and "
                         "longrope scaling are not implemented)");
    for (const auto& [key, value] : rp.items())
      if (key != "rope_type" && key != "type" && key != "rope_theta" && key != "factor")
        throw config_error(in + " key \"" + key + "\" (" + value.dump() + ") is not supported",
                           "use a model whose rotary settings hold only rope_type, rope_theta and factor");
    theta = number<float>(rp, in, "rope_theta", &theta);
    const float one = 1.f;
    factor = type == "linear" ? number<float>(rp, in, "factor", &one) : 1.f;
    if (!(theta > 0.f) || !(factor > 0.f))
      throw config_error(in + ": rope_theta and factor must be > 0",
                         "give the model's config.json as transformers wrote it");
  }

  // Gemma 3's rotary bases: transformers 4 writes rope_theta (global layers),
  // rope_local_base_freq (local) and rope_scaling (global only); transformers
  // 5 rope_parameters {"full_attention": {...}, "sliding_attention": {...}}.
  inline void gemma3_rope(const nlohmann::ordered_json& j, const std::string& where, LmConfig& c) {
    c.rope_theta = 1000000.f;  // transformers' defaults
    c.rope_local_theta = 10000.f;
    float local_factor = 1.f;
    if (j.contains("rope_parameters") && j.at("rope_parameters").is_object()) {
      const auto& rp = j.at("rope_parameters");
      for (const auto& [key, value] : rp.items())
        if (key != "full_attention" && key != "sliding_attention")
          throw config_error(where + ": rope_parameters key \"" + key + "\" is not supported",
                             "give Gemma 3's rope_parameters per layer type: full_attention and sliding_attention");
      if (rp.contains("full_attention"))
        read_rope(rp.at("full_attention"), where + ": rope_parameters.full_attention", c.rope_theta, c.rope_factor);
      if (rp.contains("sliding_attention"))
        read_rope(rp.at("sliding_attention"), where + ": rope_parameters.sliding_attention", c.rope_local_theta,
                  local_factor);
    } else {
      c.rope_theta = number<float>(j, where, "rope_theta", &c.rope_theta);
      c.rope_local_theta = number<float>(j, where, "rope_local_base_freq", &c.rope_local_theta);
      if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null()) {
        nlohmann::ordered_json scaling = j.at("rope_scaling");
        if (scaling.is_object() && !scaling.contains("rope_theta")) scaling["rope_theta"] = c.rope_theta;
        read_rope(scaling, where + ": rope_scaling", c.rope_theta, c.rope_factor);
      }
    }
    if (local_factor != 1.f)
      throw config_error(where + ": rope scaling on the sliding_attention layers is not supported",
                         "use a Gemma 3 model whose local layers take the default rotary embedding");
  }

  DTRAIN_DECL void parse_head_and_padding(const nlohmann::ordered_json& j, const std::string& where, LmConfig& c,
                                          std::int64_t fallback) {
    auto unsupported = [&](const std::string& what, const std::string& fix) {
      throw config_error(where + ": " + what + " is not supported", fix);
    };
    c.head_size = number<std::int64_t>(j, where, "head_dim", &fallback);
    if (c.head_size < 2 || c.head_size % 2 != 0 || c.head_size > (std::int64_t{1} << 20))
      unsupported("head_dim " + std::to_string(c.head_size),
                  "give an even head_dim (transformers' default " + std::to_string(fallback) + ")");
    const std::int64_t no_pad = -1;
    c.pad_token_id = number<std::int64_t>(j, where, "pad_token_id", &no_pad);
    if (c.pad_token_id < -1 || c.pad_token_id >= c.vocab_size)
      unsupported("pad_token_id " + std::to_string(c.pad_token_id), "give an id in the vocabulary, or null");
  }

  DTRAIN_DECL void parse_gemma(const nlohmann::ordered_json& j, const std::string& where, LmConfig& c) {
    auto unsupported = [&](const std::string& what, const std::string& fix) {
      throw config_error(where + ": " + what + " is not supported", fix);
    };
    auto set = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
    // transformers 4 reads hidden_activation (null: the tanh GELU), 5 hidden_act ("gelu" meaning the tanh GELU)
    const bool explicit_act = set("hidden_activation");
    const std::string act =
        explicit_act && j.at("hidden_activation").is_string() ? j.at("hidden_activation").get<std::string>()
        : !explicit_act && set("hidden_act") && j.at("hidden_act").is_string() ? j.at("hidden_act").get<std::string>()
                                                                               : "gelu_pytorch_tanh";
    if (act != "gelu_pytorch_tanh" && !(act == "gelu" && !explicit_act))
      unsupported(std::string(explicit_act ? "hidden_activation" : "hidden_act") + " \"" + act + "\"",
                  "dtrain's Gemma MLP is GeGLU with the tanh GELU (hidden_activation \"gelu_pytorch_tanh\")");
    parse_head_and_padding(j, where, c, 256);  // transformers' default head_dim for both
    if (flag(j, "use_bidirectional_attention", false))
      unsupported("use_bidirectional_attention true", "use a causal model (use_bidirectional_attention false)");
    if (!c.gemma3()) return;
    for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"})
      if (set(key))
        unsupported(std::string(key) + " " + j.at(key).dump(),
                    std::string("set \"") + key + "\" to null (Gemma 3's own configs do; softcapping is Gemma 2's)");
    const float scalar_default = 256.f;
    const float scalar = number<float>(j, where, "query_pre_attn_scalar", &scalar_default);
    if (!(scalar > 0.f))
      unsupported("query_pre_attn_scalar " + j.at("query_pre_attn_scalar").dump(), "give a positive scalar");
    c.attention_scale = static_cast<float>(std::pow(static_cast<double>(scalar), -0.5));
    const std::int64_t window_default = 4096, pattern_default = 6;
    c.sliding_window = number<std::int64_t>(j, where, "sliding_window", &window_default);
    if (c.sliding_window < 1)
      unsupported("sliding_window " + std::to_string(c.sliding_window),
                  "give a window >= 1 (transformers' default 4096)");
    c.local_layers.assign(static_cast<std::size_t>(c.num_hidden_layers), 0);
    if (set("layer_types")) {
      const auto& types = j.at("layer_types");
      if (!types.is_array() || types.size() != c.local_layers.size())
        unsupported("layer_types " + types.dump(), "give one of \"sliding_attention\" or \"full_attention\" per layer");
      for (std::size_t l = 0; l < types.size(); ++l) {
        const std::string t = types[l].is_string() ? types[l].get<std::string>() : types[l].dump();
        if (t != "sliding_attention" && t != "full_attention")
          unsupported("layer type \"" + t + "\" (layer " + std::to_string(l) + ")",
                      "give \"sliding_attention\" or \"full_attention\" per layer");
        c.local_layers[l] = t == "sliding_attention";
      }
    } else {
      // every pattern-th layer global, the others local (transformers 4's sliding_window_pattern)
      const std::int64_t pattern = number<std::int64_t>(j, where, "sliding_window_pattern", &pattern_default);
      if (pattern < 1) unsupported("sliding_window_pattern " + std::to_string(pattern), "give a pattern >= 1");
      for (std::size_t l = 0; l < c.local_layers.size(); ++l)
        c.local_layers[l] = (static_cast<std::int64_t>(l) + 1) % pattern != 0;
    }
    gemma3_rope(j, where, c);
  }
  }  // namespace detail
}  // namespace dtrain::hf

namespace dtrain::hf {

DTRAIN_DECL LmConfig parse_config(const nlohmann::ordered_json& j, const std::string& where) {
  if (!j.is_object()) throw config_error(where + ": not a JSON object", "give the model's config.json");
  const std::string type =
      j.contains("model_type") && j.at("model_type").is_string() ? j.at("model_type").get<std::string>() : "";
  if (type != "gpt2" && type != "llama" && type != "mistral" && type != "qwen2" && type != "qwen3" && type != "gemma" &&
      type != "gemma3_text")
    throw config_error(
        where + ": model_type \"" + type + "\" is not supported (supported: " + detail::supported_types() + ")",
        "fine-tune one of the supported architectures");
  if (type == "gpt2") return detail::parse_gpt2(j, where);
  LmConfig c;
  c.model_type = type;
  c.json_text = j.dump();
  c.vocab_size = detail::number<std::int64_t>(j, where, "vocab_size");
  c.hidden_size = detail::number<std::int64_t>(j, where, "hidden_size");
  c.intermediate_size = detail::number<std::int64_t>(j, where, "intermediate_size");
  c.num_hidden_layers = detail::number<std::int64_t>(j, where, "num_hidden_layers");
  c.num_attention_heads = detail::number<std::int64_t>(j, where, "num_attention_heads");
  c.num_key_value_heads = detail::number<std::int64_t>(j, where, "num_key_value_heads", &c.num_attention_heads);
  c.max_position_embeddings = detail::number<std::int64_t>(j, where, "max_position_embeddings");
  const float eps = 1e-6f;
  c.norm_eps = detail::number<float>(j, where, "rms_norm_eps", &eps);
  if (!c.gemma3()) c.rope_theta = detail::rope_theta(j, where);  // Gemma 3's per layer type: parse_gemma
  const bool attention_bias = detail::flag(j, "attention_bias", false);
  c.qkv_bias = type == "qwen2" || attention_bias;
  c.out_bias = type != "qwen2" && attention_bias;
  // transformers' defaults: tied for Gemma, untied for the other three
  c.tie_word_embeddings = detail::flag(j, "tie_word_embeddings", c.gemma());

  auto unsupported = [&](const std::string& what, const std::string& fix) {
    throw config_error(where + ": " + what + " is not supported", fix);
  };
  detail::check_sizes(c, where,
                      {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "max_position_embeddings"});
  if (c.gemma()) detail::parse_gemma(j, where, c);
  if (c.qwen3()) detail::parse_head_and_padding(j, where, c, 128);
  if (j.contains("head_dim") && !j.at("head_dim").is_null() &&
      detail::number<std::int64_t>(j, where, "head_dim") != c.head_dim())
    unsupported("head_dim " + j.at("head_dim").dump() + " other than hidden_size / num_attention_heads (" +
                    std::to_string(c.head_dim()) + ")",
                "use a model whose head_dim is hidden_size / num_attention_heads");
  const std::string act =
      j.contains("hidden_act") && j.at("hidden_act").is_string() ? j.at("hidden_act").get<std::string>() : "silu";
  if (!c.gemma() && act != "silu")
    unsupported("hidden_act \"" + act + "\"", "dtrain's Llama-family MLP is SwiGLU (hidden_act \"silu\")");
  if (detail::flag(j, "mlp_bias", false)) unsupported("mlp_bias true", "use a model without MLP biases");
  if (type == "mistral" && j.contains("sliding_window") && !j.at("sliding_window").is_null() &&
      detail::number<std::int64_t>(j, where, "sliding_window") < c.max_position_embeddings)
    unsupported("sliding_window " + j.at("sliding_window").dump(),
                "use a model without a sliding window (sliding_window null), or one at least max_position_embeddings");
  if ((type == "qwen2" || type == "qwen3") && detail::flag(j, "use_sliding_window", false))
    unsupported("use_sliding_window true", "use a model with use_sliding_window false");
  return c;
}

DTRAIN_DECL LmConfig read_config(std::filesystem::path path) {
  if (std::filesystem::is_directory(path)) path /= "config.json";
  std::ifstream in(path);
  if (!in)
    throw config_error("cannot read the model config \"" + path.string() + "\"",
                       "give a transformers model directory (config.json and model.safetensors) or its config.json");
  const auto j = dtrain::detail::parse_json(in, [&](const std::string& problem) {
    return config_error("\"" + path.string() + "\" is " + problem, "give the model's config.json");
  });
  return parse_config(j, "\"" + path.string() + "\"");
}
}  // namespace dtrain::hf
DTRAIN_IMPL_END
