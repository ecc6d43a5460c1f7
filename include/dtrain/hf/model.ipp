// The definitions model.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <fnmatch.h>

#include <cmath>

#include "dtrain/hf/model.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::hf {
  DTRAIN_DECL Block make_block(const LmConfig& c, const LoraPlan& lora, std::int64_t layer, bool trainable) {
    const bool train = trainable && !lora.config.on();
    const auto adapter = [&](const char* ours) {
      return lora.adapted(layer, ours) ? lora.config.options() : nn::LoraOptions{};
    };
    if (c.gpt2()) {
      const nn::LayerNormOptions norm{.eps = c.norm_eps, .trainable = train};
      return Gpt2Block(
          c.hidden_size, nn::LayerNorm(c.hidden_size, norm),
          nn::CausalSelfAttention(
              c.hidden_size, c.num_attention_heads,
              {.trainable = train, .qkv_lora = adapter("attn.qkv"), .proj_lora = adapter("attn.proj")}),
          nn::LayerNorm(c.hidden_size, norm),
          nn::MLP<nn::GELUTanh>(c.hidden_size, c.intermediate_size,
                                {.trainable = train, .fc1_lora = adapter("mlp.fc1"), .fc2_lora = adapter("mlp.fc2")}));
    }
    // Gemma's norms scale by 1 + weight; Gemma 3's local layers attend within
    // a window, with their own rotary base and no scaling.
    const float offset = c.gemma() ? 1.f : 0.f;
    const bool local = c.local(layer);
    const nn::RmsNormOptions norm{.eps = c.norm_eps, .trainable = train, .offset = offset};
    const nn::RotaryAttention attn(c.hidden_size, c.num_attention_heads,
                                   {.kv_heads = c.num_key_value_heads,
                                    .rope_theta = local ? c.rope_local_theta : c.rope_theta,
                                    .qkv_bias = c.qkv_bias,
                                    .out_bias = c.out_bias,
                                    .max_positions = c.max_position_embeddings,
                                    .trainable = train,
                                    .q_lora = adapter("attn.q"),
                                    .k_lora = adapter("attn.k"),
                                    .v_lora = adapter("attn.v"),
                                    .o_lora = adapter("attn.o"),
                                    .qk_norm = c.qk_norm(),
                                    .qk_norm_eps = c.norm_eps,
                                    .qk_norm_offset = offset,
                                    .head_dim = c.gemma() || c.qwen3() ? c.head_dim() : 0,
                                    .window = local ? c.sliding_window : 0,
                                    .scale = c.attention_scale,
                                    .rope_factor = local ? 1.f : c.rope_factor});
    const nn::MlpOptions mlp{
        .bias = false, .trainable = train, .fc1_lora = adapter("mlp.fc1"), .fc2_lora = adapter("mlp.fc2")};
    const nn::RMSNorm rms(c.hidden_size, norm);
    if (c.gemma3())
      return Gemma3Block(c.hidden_size, rms, attn, rms, rms,
                         nn::MLP<nn::GeGLU>(c.hidden_size, c.intermediate_size, mlp), rms);
    if (c.gemma())
      return GemmaBlock(c.hidden_size, rms, attn, rms, nn::MLP<nn::GeGLU>(c.hidden_size, c.intermediate_size, mlp));
    return LlamaBlock(c.hidden_size, rms, attn, rms, nn::MLP<nn::SwiGLU>(c.hidden_size, c.intermediate_size, mlp));
  }

  DTRAIN_DECL FinalNorm make_final_norm(const LmConfig& c, bool trainable) {
    if (c.gpt2()) return nn::LayerNorm(c.hidden_size, {.eps = c.norm_eps, .trainable = trainable});
    return nn::RMSNorm(c.hidden_size, {.eps = c.norm_eps, .trainable = trainable, .offset = c.gemma() ? 1.f : 0.f});
  }

  DTRAIN_DECL nn::Linear make_head(const LmConfig& c, const LoraPlan& lora, const std::string& tie_to, bool trainable) {
    return nn::Linear(c.hidden_size, c.vocab_size,
                      {.bias = false,
                       .trainable = trainable && (!lora.config.on() || lora.save_head),
                       .tie_weight = c.tie_word_embeddings ? tie_to : "",
                       .lora = lora.head ? lora.config.options() : nn::LoraOptions{}});
  }

  DTRAIN_DECL nn::EmbeddingOptions embedding_options(const LmConfig& c, bool trainable) {
    // Gemma's embedding rows are scaled by sqrt(hidden_size) (rounded to
    // the compute dtype by nn::Embedding, as transformers rounds it)
    return {.trainable = trainable,
            .scale = c.gemma() ? static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size))) : 1.f,
            .padding_idx = c.pad_token_id};
  }

  DTRAIN_DECL CausalLm::CausalLm(LmConfig c, const LoraConfig& adapters, bool trainable)
      : config(std::move(c)),
        lora(plan_lora(config, adapters)),
        tok(config.vocab_size, config.hidden_size,
            embedding_options(config, trainable && (!adapters.on() || lora.save_embedding))),
        norm(make_final_norm(config, trainable && !adapters.on())),
        head(make_head(config, lora, "0.weight", trainable)) {
    if (!trainable && adapters.on())
      throw config_error("hf::CausalLm: a frozen model (trainable false) with LoRA adapters",
                         "build the frozen copy without adapters; the adapters are what trains");
    if (config.gpt2())
      positions.emplace_back(config.max_position_embeddings, config.hidden_size, 0.02f,
                             trainable && (!adapters.on() || lora.save_positions));
    blocks.reserve(static_cast<std::size_t>(config.num_hidden_layers));
    for (std::int64_t l = 0; l < config.num_hidden_layers; ++l)
      blocks.push_back(make_block(config, lora, l, trainable));
  }

  DTRAIN_DECL std::vector<std::string> unit_modules(const LmConfig& c) {
    const std::string base = c.gpt2() ? "transformer." : "model.";
    std::vector<std::string> m{base + (c.gpt2() ? "wte" : "embed_tokens")};
    if (c.gpt2()) m.push_back(base + "wpe");
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
      m.push_back(base + (c.gpt2() ? "h." : "layers.") + std::to_string(l));
    m.push_back(base + (c.gpt2() ? "ln_f" : "norm"));
    m.push_back("lm_head");
    return m;
  }

  DTRAIN_DECL std::vector<std::size_t> units_named(const LmConfig& c, const std::vector<std::string>& patterns) {
    return units_named(unit_modules(c), patterns, c.model_type);
  }

  DTRAIN_DECL std::vector<std::size_t> units_named(const std::vector<std::string>& modules,
                                                   const std::vector<std::string>& patterns, const std::string& model) {
    const auto names = [](const std::string& pattern, const std::string& module) {
      for (std::size_t from = 0; from != std::string::npos && !module.empty();) {
        if (::fnmatch(pattern.c_str(), module.c_str() + from, 0) == 0) return true;
        from = module.find('.', from);
        if (from != std::string::npos) ++from;
      }
      return false;
    };
    std::vector<char> chosen(modules.size(), 0);
    for (const auto& p : patterns) {
      bool any = false;
      for (std::size_t u = 0; u < modules.size(); ++u)
        if (names(p, modules[u])) chosen[u] = any = true;
      if (!any)
        throw config_error("\"" + p + "\" names no module of this " + model + " model (its units are " +
                               modules.front() + ", " + modules[1] + ", ..., " + modules[modules.size() - 2] + ", " +
                               modules.back() + ")",
                           "give module names or shell patterns such as layers.* or " + modules[modules.size() - 3]);
    }
    std::vector<std::size_t> units;
    for (std::size_t u = 0; u < modules.size(); ++u)
      if (chosen[u]) units.push_back(u);
    return units;
  }

  DTRAIN_DECL bool TransformersNames::ignored(const std::string& name) const {
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    return (tied && name == "lm_head.weight") || (gpt2 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias")));
  }

  DTRAIN_DECL TransformersNames transformers_names(const LmConfig& c) {
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
        const Part parts[] = {
            {"ln1", "ln_1", false}, {"attn.qkv", "attn.c_attn", true}, {"attn.proj", "attn.c_proj", true},
            {"ln2", "ln_2", false}, {"mlp.fc1", "mlp.c_fc", true},     {"mlp.fc2", "mlp.c_proj", true}};
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
      for (const char* p : {"q", "k", "v", "o"})
        m[u + "attn." + p + ".weight"] = {h + "self_attn." + p + "_proj.weight"};
      if (c.qkv_bias)
        for (const char* p : {"q", "k", "v"}) m[u + "attn." + p + ".bias"] = {h + "self_attn." + p + "_proj.bias"};
      if (c.out_bias) m[u + "attn.o.bias"] = {h + "self_attn.o_proj.bias"};
      if (c.qk_norm()) {
        m[u + "attn.q_norm.weight"] = {h + "self_attn.q_norm.weight"};
        m[u + "attn.k_norm.weight"] = {h + "self_attn.k_norm.weight"};
      }
      if (c.gemma3()) {  // the sandwich block's four norms
        m[u + "post_attn.weight"] = {h + "post_attention_layernorm.weight"};
        m[u + "ln2.weight"] = {h + "pre_feedforward_layernorm.weight"};
        m[u + "post_mlp.weight"] = {h + "post_feedforward_layernorm.weight"};
      } else {
        m[u + "ln2.weight"] = {h + "post_attention_layernorm.weight"};
      }
      m[u + "mlp.fc1.weight"] = {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"};
      m[u + "mlp.fc2.weight"] = {h + "mlp.down_proj.weight"};
    }
    m[std::to_string(L + 1) + ".weight"] = {"model.norm.weight"};
    if (!c.tie_word_embeddings) m[std::to_string(L + 2) + ".weight"] = {"lm_head.weight"};
    return n;
  }

}  // namespace dtrain::hf

DTRAIN_IMPL_END
