// The definitions llava.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <cmath>
#include <fstream>
#include <utility>

#include "dtrain/hf/llava.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::hf {
  namespace detail {

  // Each part's name prefix in transformers 4's layout (the canonical one
  // here) and in `layout`, longest first within a part.
  inline std::vector<std::pair<std::string, std::string>> llava_prefixes(const LmConfig& text, LlavaLayout layout) {
    const std::string top = layout.nested ? "model." : "";
    const std::string lm = text.gpt2() ? "language_model.transformer." : "language_model.model.";
    return {{"vision_tower.vision_model.", top + "vision_tower." + (layout.tower_prefixed ? "vision_model." : "")},
            {"multi_modal_projector.", top + "multi_modal_projector."},
            {"language_model.lm_head.", layout.nested ? "lm_head." : "language_model.lm_head."},
            {lm, layout.nested ? "model.language_model." : lm}};
  }

  // `name` from one layout's prefixes to another's (`to_layout`: canonical ->
  // layout, else layout -> canonical); a name under no known prefix is kept.
  inline std::string llava_renamed(const std::string& name,
                                   const std::vector<std::pair<std::string, std::string>>& prefixes, bool to_layout) {
    for (const auto& [canonical, in_layout] : prefixes) {
      const std::string& from = to_layout ? canonical : in_layout;
      if (name.starts_with(from)) return (to_layout ? in_layout : canonical) + name.substr(from.size());
    }
    return name;
  }

  // What the image features are multiplied by: transformers 4's Gemma
  // multiplies its whole input, the merged features included, by
  // sqrt(hidden_size); transformers 5 scales the embedding's rows only (as
  // Gemma 3 always has).
  inline float feature_scale(const LlavaConfig& c) {
    const bool scaled = c.text.gemma() && !c.text.gemma3() && c.transformers_major < 5;
    return scaled ? static_cast<float>(std::sqrt(static_cast<double>(c.text.hidden_size))) : 1.f;
  }

  inline bool llava_flag(const nlohmann::ordered_json& j, const char* key, bool fallback) {
    return j.contains(key) && j.at(key).is_boolean() ? j.at(key).get<bool>() : fallback;
  }

  }  // namespace detail

  DTRAIN_DECL std::int64_t LlavaConfig::features_per_image() const {
    return vision.patches() + (vision.clip() ? 1 : 0) - (vision.select_strategy == "default" ? 1 : 0);
  }

  DTRAIN_DECL LlavaConfig parse_llava_config(const nlohmann::ordered_json& j, const std::string& where) {
    if (!j.is_object()) throw config_error(where + ": not a JSON object", "give the model's config.json");
    const std::string type =
        j.contains("model_type") && j.at("model_type").is_string() ? j.at("model_type").get<std::string>() : "";
    if (type != "llava")
      throw config_error(where + ": model_type \"" + type + "\" is not a LLaVA model (supported: llava)",
                         "give a LlavaForConditionalGeneration config (model_type \"llava\")");
    for (const char* part : {"vision_config", "text_config"})
      if (!j.contains(part) || !j.at(part).is_object())
        throw config_error(where + ": the LLaVA config has no " + part + " object",
                           "give the model's config.json as transformers wrote it");
    if (j.contains("vision_feature_layer") && j.at("vision_feature_layer").is_array())
      throw config_error(where + ": vision_feature_layer " + j.at("vision_feature_layer").dump() +
                             " (several layers' features concatenated) is not supported",
                         "use a model with one vision_feature_layer (an integer)");
    const std::string act = j.contains("projector_hidden_act") && j.at("projector_hidden_act").is_string()
                                ? j.at("projector_hidden_act").get<std::string>()
                                : "gelu";
    if (act != "gelu")
      throw config_error(where + ": projector_hidden_act \"" + act + "\" is not supported",
                         "use a model whose projector uses \"gelu\" (the erf GELU)");
    LlavaConfig c;
    // LLaVA's defaults where the file leaves them out (transformers' LlavaConfig).
    nlohmann::ordered_json outer = j;
    if (!outer.contains("vision_feature_layer")) outer["vision_feature_layer"] = -2;
    if (!outer.contains("vision_feature_select_strategy")) outer["vision_feature_select_strategy"] = "default";
    c.vision = parse_vision_config(outer, where);
    c.transformers_major = c.vision.transformers_major;
    nlohmann::ordered_json text = j.at("text_config");
    if (!text.contains("model_type")) text["model_type"] = "llama";  // transformers' default
    c.text = parse_config(text, where + ": text_config");
    // transformers 4 ties the head as the language model's config says;
    // transformers 5 also when LLaVA's own tie_word_embeddings is set.
    if (c.transformers_major >= 5 && detail::llava_flag(j, "tie_word_embeddings", false))
      c.text.tie_word_embeddings = true;
    const char* token_key = j.contains("image_token_index") ? "image_token_index" : "image_token_id";
    if (j.contains(token_key) && !j.at(token_key).is_null()) {
      if (const auto id = ::dtrain::detail::json_number<std::int64_t>(j.at(token_key)))
        c.image_token = *id;
      else
        throw config_error(where + ": \"" + token_key + "\" must be a whole number, not " +
                               ::dtrain::detail::json_shown(j.at(token_key)),
                           "give the model's config.json as transformers wrote it");
    }
    if (c.image_token < 0 || c.image_token >= c.text.vocab_size)
      throw config_error(where + ": the image token " + std::to_string(c.image_token) +
                             " is not an id of the language model's " + std::to_string(c.text.vocab_size) +
                             "-token vocabulary",
                         "use a model whose image_token_index is below text_config.vocab_size");
    c.projector_bias = detail::llava_flag(j, "multimodal_projector_bias", true);
    c.json_text = j.dump();
    return c;
  }

  DTRAIN_DECL LlavaConfig read_llava_config(std::filesystem::path path) {
    if (std::filesystem::is_directory(path)) path /= "config.json";
    std::ifstream in(path);
    if (!in) throw config_error("cannot read \"" + path.string() + "\"", "give a LLaVA config.json or its directory");
    const auto j = dtrain::detail::parse_json(in, [&](const std::string& problem) {
      return config_error("\"" + path.string() + "\" is " + problem,
                          "give the model's config.json as transformers wrote it");
    });
    return parse_llava_config(j, "\"" + path.string() + "\"");
  }

  DTRAIN_DECL LlavaTrain parse_llava_train(std::string_view list) {
    LlavaTrain t{.vision = false, .projector = false, .language = false};
    bool any = false;
    for (std::size_t from = 0; from <= list.size();) {
      std::size_t to = list.find(',', from);
      if (to == std::string_view::npos) to = list.size();
      std::string_view part = list.substr(from, to - from);
      while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
      while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
      if (part == "all")
        t = {.vision = true, .projector = true, .language = true};
      else if (part == "vision")
        t.vision = true;
      else if (part == "projector")
        t.projector = true;
      else if (part == "language")
        t.language = true;
      else
        throw config_error("train: \"" + std::string(part) + "\" is not a part of a LLaVA model",
                           "name its parts, comma-separated: vision, projector, language, or all");
      any = true;
      from = to + 1;
    }
    if (!any) throw config_error("train: no part named", "give vision, projector, language or all");
    return t;
  }

  DTRAIN_DECL Llava::Llava(LlavaConfig c, LlavaTrain parts, const LoraConfig& adapters)
      : config(std::move(c)),
        train(parts),
        lora(plan_lora(config.text, adapters)),
        tower(config.vision, VisionFeatures::of(config.vision), {.trainable = train.vision}),
        linear_1(config.vision.hidden_size, config.text.hidden_size,
                 {.bias = config.projector_bias, .trainable = train.projector}),
        linear_2(config.text.hidden_size, config.text.hidden_size,
                 {.bias = config.projector_bias, .trainable = train.projector}),
        merge(config.text.vocab_size, config.text.hidden_size, config.image_token,
              embedding_options(config.text,
                                (adapters.on() && lora.save_embedding) || (!adapters.on() && train.language)),
              detail::feature_scale(config)),
        // With adapters the language model trains through them (and its
        // modules_to_save), whatever `language` says.
        norm(make_final_norm(config.text, !adapters.on() && train.language)),
        head(make_head(config.text, lora, std::to_string(merge_unit()) + ".weight", adapters.on() || train.language)) {
    const bool language = adapters.on() || train.language;
    if (config.text.gpt2())
      positions.emplace_back(config.text.max_position_embeddings, config.text.hidden_size, 0.02f,
                             language && (!adapters.on() || lora.save_positions));
    blocks.reserve(static_cast<std::size_t>(config.text.num_hidden_layers));
    for (std::int64_t l = 0; l < config.text.num_hidden_layers; ++l)
      blocks.push_back(make_block(config.text, lora, l, language));
  }

  DTRAIN_DECL std::size_t Llava::projector_unit() const {
    return 1 + tower.pre_norm.size() + tower.layers.size() + tower.select.size();
  }

  DTRAIN_DECL std::vector<std::string> unit_modules(const Llava& model) {
    std::vector<std::string> m{"vision_tower.embeddings"};
    if (!model.tower.pre_norm.empty()) m.push_back("vision_tower.pre_layrnorm");
    for (std::size_t l = 0; l < model.tower.layers.size(); ++l)
      m.push_back("vision_tower.encoder.layers." + std::to_string(l));
    if (!model.tower.select.empty()) m.push_back("vision_tower.feature_select");
    for (const char* part : {"linear_1", "act", "linear_2"}) m.push_back(std::string("multi_modal_projector.") + part);
    // The language model's, its "model." (GPT-2: "transformer.") level
    // replaced by "language_model." as LLaVA nests it; the head stays lm_head.
    for (std::string module : unit_modules(model.config.text)) {
      if (module != "lm_head") module = "language_model." + module.substr(module.find('.') + 1);
      m.push_back(std::move(module));
    }
    return m;
  }

  DTRAIN_DECL std::vector<std::size_t> units_named(const Llava& model, const std::vector<std::string>& patterns) {
    return units_named(unit_modules(model), patterns, "llava");
  }

  DTRAIN_DECL LlavaLayout llava_layout_of(const std::filesystem::path& dir) {
    const ParamSources s = open_checkpoint(dir, TransformersNames{});
    LlavaLayout layout{.tower_prefixed = false, .nested = false};
    bool tower = false;
    for (const SafetensorsFile& f : s.files)
      for (const std::string& n : f.names()) {
        if (n.starts_with("model.vision_tower.") || n.starts_with("model.language_model.") ||
            n.starts_with("model.multi_modal_projector."))
          layout.nested = true;
        if (n.find("vision_tower.") != std::string::npos) tower = true;
        if (n.find("vision_tower.vision_model.") != std::string::npos) layout.tower_prefixed = true;
      }
    if (!tower) layout.tower_prefixed = true;  // no tower at all: reported as missing in 4's names
    return layout;
  }

  DTRAIN_DECL TransformersNames llava_transformers_names(const Llava& model, LlavaLayout layout) {
    const auto prefixes = detail::llava_prefixes(model.config.text, layout);
    const auto theirs = [&](const std::string& canonical) { return detail::llava_renamed(canonical, prefixes, true); };
    TransformersNames n;
    for (const auto& [ours, parts] : vision_transformers_names(model.tower, true).tensors)
      n.tensors[ours] = {theirs("vision_tower." + parts.at(0))};
    const std::size_t p = model.projector_unit();
    for (const auto& [unit, module] : {std::pair{p, "linear_1"}, std::pair{p + 2, "linear_2"}}) {
      const std::string u = std::to_string(unit) + ".", m = std::string("multi_modal_projector.") + module + ".";
      n.tensors[u + "weight"] = {theirs(m + "weight")};
      if (model.config.projector_bias) n.tensors[u + "bias"] = {theirs(m + "bias")};
    }
    // The language model's units follow the merge, which is its unit 0.
    const TransformersNames lm = transformers_names(model.config.text);
    for (const auto& [ours, parts] : lm.tensors) {
      const std::size_t dot = ours.find('.');
      const std::string mine = std::to_string(std::stoul(ours.substr(0, dot)) + model.merge_unit()) + ours.substr(dot);
      auto& names = n.tensors[mine];
      for (const std::string& t : parts) names.push_back(theirs("language_model." + t));
      if (lm.transposed.contains(ours)) n.transposed.insert(mine);
    }
    return n;
  }

  DTRAIN_DECL std::vector<PretrainedTensor> llava_tensors_not_in(
      const Llava& model, const std::filesystem::path& source, LlavaLayout layout) {
    const LlavaLayout from = llava_layout_of(source);
    const ParamSources s = open_checkpoint(source, llava_transformers_names(model, from));
    std::set<std::string> used;
    for (const auto& [ours, parts] : s.parts)
      for (const auto& part : parts) used.insert(part.second);
    const auto from_prefixes = detail::llava_prefixes(model.config.text, from);
    const auto to_prefixes = detail::llava_prefixes(model.config.text, layout);
    const std::string tied_head = detail::llava_renamed("language_model.lm_head.weight", from_prefixes, true);
    std::vector<PretrainedTensor> out;
    for (const SafetensorsFile& f : s.files)
      for (const std::string& name : f.names()) {
        if (used.contains(name) || (model.config.text.tie_word_embeddings && name == tied_head)) continue;
        const std::string canonical = detail::llava_renamed(name, from_prefixes, false);
        out.push_back({detail::llava_renamed(canonical, to_prefixes, true), f.tensor(name).shape, f.read_f32(name)});
      }
    return out;
  }

}  // namespace dtrain::hf

DTRAIN_IMPL_END
