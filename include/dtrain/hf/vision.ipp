// The definitions vision.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <fstream>
#include <map>

#include "dtrain/hf/config.hpp"  // detail::number
#include "dtrain/hf/vision.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::hf {
  namespace detail {

  inline const char* supported_towers() {
    return "clip_vision_model, siglip_vision_model, or a clip, siglip or llava config with a vision_config";
  }

  // key's value, or `fallback` (transformers' default for the tower) when absent (config.ipp's number).
  template <class V>
  V vision_number(const nlohmann::ordered_json& j, const std::string& where, const char* key, V fallback) {
    return number<V>(j, where, key, &fallback);
  }

  inline std::string vision_string(const nlohmann::ordered_json& j, const char* key, const std::string& fallback) {
    return j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : fallback;
  }

  inline int major_version(const nlohmann::ordered_json& j) {
    const std::string v = vision_string(j, "transformers_version", "");
    return v.empty() || v[0] < '1' || v[0] > '9' ? 4 : std::stoi(v);
  }

  }  // namespace detail

  DTRAIN_DECL VisionConfig parse_vision_config(const nlohmann::ordered_json& outer, const std::string& where) {
    VisionConfig c;
    const std::string outer_type = detail::vision_string(outer, "model_type", "");
    nlohmann::ordered_json j = outer;
    std::string in = where;
    if (outer.contains("vision_config") && outer.at("vision_config").is_object()) {
      j = outer.at("vision_config");
      in = where + ": vision_config";
      // The tower's type, where a composite config leaves it out (transformers' defaults).
      if (!j.contains("model_type")) {
        if (outer_type == "siglip")
          j["model_type"] = "siglip_vision_model";
        else if (outer_type == "clip" || outer_type == "llava")
          j["model_type"] = "clip_vision_model";
      }
      c.feature_layer = detail::vision_number<std::int64_t>(outer, where, "vision_feature_layer", -1);
      c.select_strategy = detail::vision_string(outer, "vision_feature_select_strategy", "full");
      if (!j.contains("transformers_version") && outer.contains("transformers_version"))
        j["transformers_version"] = outer.at("transformers_version");
    }
    c.model_type = detail::vision_string(j, "model_type", "");
    const bool clip = c.model_type == "clip_vision_model", siglip = c.model_type == "siglip_vision_model";
    if (!clip && !siglip)
      throw config_error(in + ": model_type \"" + c.model_type + "\" is not a vision tower dtrain supports",
                         std::string("give one of: ") + detail::supported_towers());
    c.hidden_size = detail::vision_number<std::int64_t>(j, in, "hidden_size", 768);
    c.intermediate_size = detail::vision_number<std::int64_t>(j, in, "intermediate_size", 3072);
    c.num_hidden_layers = detail::vision_number<std::int64_t>(j, in, "num_hidden_layers", 12);
    c.num_attention_heads = detail::vision_number<std::int64_t>(j, in, "num_attention_heads", 12);
    c.num_channels = detail::vision_number<std::int64_t>(j, in, "num_channels", 3);
    c.image_size = detail::vision_number<std::int64_t>(j, in, "image_size", 224);
    c.patch_size = detail::vision_number<std::int64_t>(j, in, "patch_size", clip ? 32 : 16);
    c.layer_norm_eps = detail::vision_number<float>(j, in, "layer_norm_eps", clip ? 1e-5f : 1e-6f);
    const std::string act = detail::vision_string(j, "hidden_act", clip ? "quick_gelu" : "gelu_pytorch_tanh");
    if (act != (clip ? "quick_gelu" : "gelu_pytorch_tanh"))
      throw config_error(in + ": hidden_act \"" + act + "\" is not supported for " + c.model_type,
                         std::string("use a tower with hidden_act \"") + (clip ? "quick_gelu" : "gelu_pytorch_tanh") +
                             "\" (the activation transformers' own checkpoints use)");
    const std::pair<const char*, std::int64_t> sizes[] = {{"hidden_size", c.hidden_size},
                                                          {"intermediate_size", c.intermediate_size},
                                                          {"num_hidden_layers", c.num_hidden_layers},
                                                          {"num_attention_heads", c.num_attention_heads},
                                                          {"num_channels", c.num_channels},
                                                          {"image_size", c.image_size},
                                                          {"patch_size", c.patch_size}};
    for (const auto& [key, value] : sizes)
      if (value < 1) throw config_error(in + ": " + key + " is " + std::to_string(value), "give a size >= 1");
    if (c.hidden_size % c.num_attention_heads != 0)
      throw config_error(in + ": hidden_size " + std::to_string(c.hidden_size) + " is not a multiple of " +
                             "num_attention_heads " + std::to_string(c.num_attention_heads),
                         "give a head count that divides hidden_size");
    if (c.image_size % c.patch_size != 0)
      throw config_error(in + ": image_size " + std::to_string(c.image_size) + " is not a multiple of patch_size " +
                             std::to_string(c.patch_size),
                         "give the tower's config.json as transformers wrote it");
    c.transformers_major = detail::major_version(j);
    c.json_text = j.dump();
    return c;
  }

  DTRAIN_DECL VisionConfig read_vision_config(std::filesystem::path path) {
    if (std::filesystem::is_directory(path)) path /= "config.json";
    std::ifstream in(path);
    if (!in) throw config_error("cannot read \"" + path.string() + "\"", "give a tower's config.json or its directory");
    const auto j = dtrain::detail::parse_json(in, [&](const std::string& problem) {
      return config_error("\"" + path.string() + "\" is " + problem,
                          "give the model's config.json as transformers wrote it");
    });
    return parse_vision_config(j, "\"" + path.string() + "\"");
  }

  DTRAIN_DECL std::int64_t layers_needed(const VisionConfig& c, const VisionFeatures& f) {
    const std::int64_t L = c.num_hidden_layers;
    if (f.layer < -(L + 1) || f.layer > L)
      throw config_error("vision_feature_layer " + std::to_string(f.layer) + " is out of range for a tower of " +
                             std::to_string(L) + " layers",
                         "give an index into hidden_states, " + std::to_string(-(L + 1)) + " .. " + std::to_string(L) +
                             " (0: the embeddings, -1: the last layer)");
    if (f.strategy != "default" && f.strategy != "full")
      throw config_error("vision_feature_select_strategy \"" + f.strategy + "\" is not supported",
                         "give \"default\" (drop the first token) or \"full\" (keep every token)");
    return f.layer < 0 ? L + 1 + f.layer : f.layer;
  }

  DTRAIN_DECL VisionTower::VisionTower(VisionConfig c, VisionFeatures f, const VisionTowerOptions& options)
      : config(std::move(c)),
        features(std::move(f)),
        embed(config.num_channels, config.hidden_size, config.patch_size, {config.image_size, config.image_size},
              {.bias = !config.clip(),
               .class_token = config.clip(),
               .trainable = options.trainable,
               .input = options.input}) {
    const std::int64_t n = layers_needed(config, features);
    const std::int64_t dim = config.hidden_size, heads = config.num_attention_heads;
    const nn::LayerNormOptions norm{.eps = config.layer_norm_eps, .trainable = options.trainable};
    if (config.clip()) pre_norm.emplace_back(dim, norm);
    // Every patch sees every patch of its image, whatever masks the batch holds for a text beside it.
    const nn::GroupedAttentionOptions attn{
        .qkv_bias = true, .out_bias = true, .trainable = options.trainable, .batch_masks = false};
    const nn::MlpOptions mlp{.trainable = options.trainable};
    layers.reserve(static_cast<std::size_t>(n));
    for (std::int64_t l = 0; l < n; ++l) {
      if (config.clip())
        layers.emplace_back(ClipLayer(dim, nn::LayerNorm(dim, norm), nn::Attention<nn::Bidirectional>(dim, heads, attn),
                                      nn::LayerNorm(dim, norm),
                                      nn::MLP<nn::QuickGELU>(dim, config.intermediate_size, mlp)));
      else
        layers.emplace_back(SiglipLayer(dim, nn::LayerNorm(dim, norm),
                                        nn::Attention<nn::Bidirectional>(dim, heads, attn), nn::LayerNorm(dim, norm),
                                        nn::MLP<nn::GELUTanh>(dim, config.intermediate_size, mlp)));
    }
    if (features.strategy == "default") select.emplace_back(1);
  }

  DTRAIN_DECL TransformersNames vision_transformers_names(const VisionTower& tower, bool prefixed) {
    TransformersNames n;
    n.optional_prefix = "vision_model.";
    const std::string base = prefixed ? n.optional_prefix : "";
    auto& m = n.tensors;
    const std::string emb = base + "embeddings.";
    m["0.weight"] = {emb + "patch_embedding.weight"};
    if (!tower.config.clip()) m["0.bias"] = {emb + "patch_embedding.bias"};
    if (tower.config.clip()) m["0.class_embedding"] = {emb + "class_embedding"};
    m["0.position_embedding"] = {emb + "position_embedding.weight"};
    std::size_t u = 1;
    if (!tower.pre_norm.empty()) {
      m["1.weight"] = {base + "pre_layrnorm.weight"};
      m["1.bias"] = {base + "pre_layrnorm.bias"};
      ++u;
    }
    const std::pair<const char*, const char*> parts[] = {
        {"ln1", "layer_norm1"},           {"attn.q", "self_attn.q_proj"},
        {"attn.k", "self_attn.k_proj"},   {"attn.v", "self_attn.v_proj"},
        {"attn.o", "self_attn.out_proj"}, {"ln2", "layer_norm2"},
        {"mlp.fc1", "mlp.fc1"},           {"mlp.fc2", "mlp.fc2"}};
    for (std::size_t l = 0; l < tower.layers.size(); ++l, ++u) {
      const std::string ours = std::to_string(u) + ".", theirs = base + "encoder.layers." + std::to_string(l) + ".";
      for (const auto& [o, t] : parts)
        for (const char* p : {"weight", "bias"}) m[ours + o + "." + p] = {theirs + t + "." + p};
    }
    return n;
  }

  DTRAIN_DECL std::vector<PretrainedTensor> tensors_not_in(const VisionTower& tower,
                                                           const std::filesystem::path& source, int major) {
    const ParamSources s = open_checkpoint(source, vision_transformers_names(tower, true));
    std::set<std::string> used;
    for (const auto& [ours, parts] : s.parts)
      for (const auto& part : parts) used.insert(part.second);
    const std::string prefix = "vision_model.";
    std::vector<PretrainedTensor> out;
    for (const SafetensorsFile& f : s.files)
      for (const std::string& name : f.names()) {
        if (used.contains(name)) continue;
        const std::string bare = name.starts_with(prefix) ? name.substr(prefix.size()) : name;
        out.push_back({major < 5 ? prefix + bare : bare, f.tensor(name).shape, f.read_f32(name)});
      }
    return out;
  }

}  // namespace dtrain::hf

DTRAIN_IMPL_END
