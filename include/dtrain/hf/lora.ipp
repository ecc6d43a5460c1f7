// The definitions hf/lora.hpp declares with DTRAIN_DECL (core/macros.hpp).
#pragma once

#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "dtrain/hf/lora.hpp"
#include "dtrain/io/json.hpp"
#include "dtrain/io/pattern.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::hf {
  DTRAIN_DECL std::vector<LinearModule> block_linears(const LmConfig& c, std::int64_t layer) {
    const std::string l = std::to_string(layer);
    if (c.gpt2()) {
      const std::string h = "transformer.h." + l + ".";
      return {{h + "attn.c_attn", "attn.qkv"},
              {h + "attn.c_proj", "attn.proj"},
              {h + "mlp.c_fc", "mlp.fc1"},
              {h + "mlp.c_proj", "mlp.fc2"}};
    }
    const std::string h = "model.layers." + l + ".";
    return {{h + "self_attn.q_proj", "attn.q"}, {h + "self_attn.k_proj", "attn.k"},  {h + "self_attn.v_proj", "attn.v"},
            {h + "self_attn.o_proj", "attn.o"}, {h + "mlp.gate_proj", "mlp.fc1", 0}, {h + "mlp.up_proj", "mlp.fc1", 1},
            {h + "mlp.down_proj", "mlp.fc2"}};
  }

  namespace detail {
  // The modules a LoRA model can save whole: the token embedding, GPT-2's
  // learned positions and the output head, by their transformers names.
  struct SavableModule {
    const char* module;
    bool LoraPlan::*flag;
    std::int64_t unit;  // the unit whose "weight" it is
    bool tied;          // one of tie_word_embeddings' pair
  };

  inline std::vector<SavableModule> savable_modules(const LmConfig& c) {
    const std::int64_t head = head_unit(c);
    if (c.gpt2())
      return {{"transformer.wte", &LoraPlan::save_embedding, 0, c.tie_word_embeddings},
              {"transformer.wpe", &LoraPlan::save_positions, 1, false},
              {"lm_head", &LoraPlan::save_head, head, c.tie_word_embeddings}};
    return {{"model.embed_tokens", &LoraPlan::save_embedding, 0, c.tie_word_embeddings},
            {"lm_head", &LoraPlan::save_head, head, c.tie_word_embeddings}};
  }

  // modules_to_save resolved as PEFT matches it: the module's whole name, or a
  // suffix after a dot ("embed_tokens").
  inline void plan_saved_modules(const LmConfig& c, LoraPlan& plan) {
    const auto& names = plan.config.modules_to_save;
    if (names.empty()) return;
    if (!plan.config.on())
      throw config_error("modules_to_save without LoRA adapters",
                         "give lora_r and lora_targets, or train every weight "
                         "without modules_to_save");
    std::string savable;
    for (const SavableModule& m : savable_modules(c))
      if (!m.tied) savable += std::string(savable.empty() ? "" : ", ") + m.module;
    for (const std::string& name : names) {
      bool found = false;
      for (const SavableModule& m : savable_modules(c)) {
        if (!names_module(name, m.module)) continue;
        if (m.tied)
          throw config_error("modules_to_save \"" + name + "\": this " + c.model_type +
                                 " model ties its output head to its token embedding (tie_word_embeddings), and "
                                 "saving one of the pair is not supported",
                             "leave it out of modules_to_save" +
                                 (savable.empty() ? std::string() : " (this model can save " + savable + ")"));
        plan.*m.flag = true;
        found = true;
      }
      if (!found)
        throw config_error("modules_to_save \"" + name +
                               "\" is not supported: beside LoRA adapters dtrain trains "
                               "and saves the embeddings and the output head only",
                           savable.empty() ? "leave modules_to_save empty"
                                           : "list among " + savable + ", or adapt the module with lora_targets");
    }
  }
  }  // namespace detail

  DTRAIN_DECL bool LoraPlan::adapted(std::int64_t layer, const std::string& ours) const {
    if (!config.on()) return false;
    for (const auto& o : layers.at(static_cast<std::size_t>(layer)))
      if (o == ours) return true;
    return false;
  }

  DTRAIN_DECL LoraPlan plan_lora(const LmConfig& c, const LoraConfig& lora) {
    LoraPlan plan{lora, std::vector<std::vector<std::string>>(static_cast<std::size_t>(c.num_hidden_layers))};
    if (lora.r < 0) throw config_error("lora_r " + std::to_string(lora.r) + " is negative", "give lora_r >= 1");
    detail::plan_saved_modules(c, plan);
    if (!lora.on()) return plan;
    if (lora.targets.empty())
      throw config_error("LoRA needs target modules", c.gpt2() ? "give lora_targets=c_attn,c_proj,c_fc (or all-linear)"
                                                               : "give lora_targets=q_proj,k_proj,v_proj,o_proj "
                                                                 "(or all-linear)");
    if (lora.regex && lora.targets.size() != 1)
      throw config_error("a regular expression target is one pattern, not " + std::to_string(lora.targets.size()),
                         "give one pattern, or a list of module names");
    std::optional<RegexPattern> pattern;
    if (lora.regex) {
      try {
        pattern.emplace(lora.targets[0]);
      } catch (const config_error& e) {  // the pattern's fix, and LoRA's other way to name targets
        throw config_error(e.problem(), e.fix() + ", or give module names");
      }
    }
    const auto matches = [&](const std::string& target, const std::string& module) {
      if (pattern) return pattern->full_match(module);
      return target == "all-linear" || detail::names_module(target, module);
    };
    std::map<std::string, std::size_t> hits;
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      bool halves[2] = {false, false};
      for (const LinearModule& m : block_linears(c, l)) {
        bool on = false;
        for (const auto& t : lora.targets) {
          if (matches(t, m.module)) {
            ++hits[t];
            on = true;
          }
        }
        if (!on) continue;
        if (m.part >= 0) {
          halves[m.part] = true;
          continue;
        }
        plan.layers[static_cast<std::size_t>(l)].push_back(m.ours);
      }
      if (halves[0] != halves[1])
        throw config_error("LoRA targets " + std::string(halves[0] ? "gate_proj" : "up_proj") + " of layer " +
                               std::to_string(l) + " without " + (halves[0] ? "up_proj" : "gate_proj") +
                               ": dtrain fuses the two projections",
                           "target both gate_proj and up_proj, or neither");
      if (halves[0]) plan.layers[static_cast<std::size_t>(l)].push_back("mlp.fc1");
    }
    // The output head: only when a target names it (PEFT's all-linear leaves
    // the output layer out), and only untied (nn::Linear adapts no tied weight).
    for (const auto& t : lora.targets) {
      if (t == "all-linear" || !matches(t, "lm_head")) continue;
      ++hits[t];
      if (c.tie_word_embeddings)
        throw config_error("LoRA target \"" + t + "\" matches lm_head, which this " + c.model_type +
                               " model ties to its token embedding (tie_word_embeddings)",
                           "adapt the blocks' layers only; the output head takes an adapter when it is untied");
      if (plan.save_head)
        throw config_error("lm_head is both a LoRA target (\"" + t + "\") and in modules_to_save",
                           "either adapt the head or train it whole, not both");
      plan.head = true;
    }
    for (const auto& t : lora.targets)
      if (!hits.contains(t)) {
        const auto example = block_linears(c, 0);
        std::string names;
        for (const auto& m : example) names += (names.empty() ? "" : ", ") + m.module.substr(m.module.rfind('.') + 1);
        throw config_error("LoRA target \"" + t + "\" matches no linear layer of this " + c.model_type + " model",
                           "target among " + names + (c.tie_word_embeddings ? "" : ", lm_head") + ", or all-linear");
      }
    return plan;
  }

  DTRAIN_DECL std::map<std::string, std::vector<std::string>> peft_names(const LmConfig& c, const LoraPlan& plan) {
    std::map<std::string, std::vector<std::string>> m;
    if (!plan.config.on()) return m;
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string u = std::to_string(block_unit(c, l)) + ".";
      for (const LinearModule& lin : block_linears(c, l)) {
        if (!plan.adapted(l, lin.ours)) continue;
        for (const char* ab : {"lora_A", "lora_B"})
          m[u + lin.ours + "." + ab].push_back("base_model.model." + lin.module + "." + ab + ".weight");
      }
    }
    if (plan.head) {
      const std::string u = std::to_string(head_unit(c)) + ".";
      for (const char* ab : {"lora_A", "lora_B"})
        m[u + ab].push_back("base_model.model.lm_head." + std::string(ab) + ".weight");
    }
    for (const detail::SavableModule& s : detail::savable_modules(c))
      if (plan.*s.flag)
        m[std::to_string(s.unit) + ".weight"] = {"base_model.model." + std::string(s.module) + ".weight"};
    return m;
  }

  DTRAIN_DECL std::map<std::string, std::string> peft_base_layers(const LmConfig& c, const LoraPlan& plan) {
    std::map<std::string, std::string> m;
    if (plan.head) m[std::to_string(head_unit(c)) + ".weight"] = "base_model.model.lm_head.base_layer.weight";
    return m;
  }

  DTRAIN_DECL std::string adapter_config_json(const LmConfig& c, const LoraConfig& lora, const std::string& base) {
    nlohmann::ordered_json j;
    j["peft_type"] = "LORA";
    j["task_type"] = "CAUSAL_LM";
    j["base_model_name_or_path"] = base;
    j["r"] = lora.r;
    j["lora_alpha"] = lora.alpha;
    j["lora_dropout"] = lora.dropout;
    j["use_rslora"] = lora.rslora;
    if (lora.regex)
      j["target_modules"] = lora.targets.at(0);
    else if (lora.targets.size() == 1 && lora.targets[0] == "all-linear")
      j["target_modules"] = "all-linear";  // PEFT's own spelling is a string
    else
      j["target_modules"] = lora.targets;
    j["bias"] = "none";
    j["fan_in_fan_out"] = c.gpt2();  // GPT-2's Conv1D layers
    if (lora.modules_to_save.empty())
      j["modules_to_save"] = nullptr;
    else
      j["modules_to_save"] = lora.modules_to_save;
    j["init_lora_weights"] = true;
    j["layers_to_transform"] = nullptr;
    j["layers_pattern"] = nullptr;
    j["rank_pattern"] = nlohmann::ordered_json::object();
    j["alpha_pattern"] = nlohmann::ordered_json::object();
    j["use_dora"] = false;
    j["inference_mode"] = true;
    j["revision"] = nullptr;
    return j.dump(2) + "\n";
  }

  DTRAIN_DECL LoraConfig read_adapter_config(const std::filesystem::path& dir) {
    const std::filesystem::path path = dir / "adapter_config.json";
    const std::string where = "\"" + path.string() + "\"";
    std::ifstream in(path);
    if (!in)
      throw checkpoint_error(where + " cannot be read",
                             "give a directory written by PEFT's save_pretrained or by "
                             "dtrain's save_adapter");
    std::stringstream text;
    text << in.rdbuf();
    return parse_adapter_config(text.str(), where);
  }

  DTRAIN_DECL LoraConfig parse_adapter_config(const std::string& text, const std::string& where) {
    const auto j = dtrain::detail::parse_json(text, [&](const std::string& problem) {
      return checkpoint_error(where + " is " + problem, "re-save the adapter");
    });
    if (!j.is_object()) throw checkpoint_error(where + " is not a JSON object", "re-save the adapter");
    const auto get = [&](const char* key) -> const nlohmann::ordered_json& {
      static const nlohmann::ordered_json null;
      return j.contains(key) ? j.at(key) : null;
    };
    const auto refuse = [&](const std::string& what, const std::string& fix) {
      throw config_error(where + ": " + what + " is not supported", fix);
    };
    if (get("peft_type").is_string() && get("peft_type").get<std::string>() != "LORA")
      refuse("peft_type " + get("peft_type").get<std::string>(), "give a LoRA adapter");
    if (get("use_dora").is_boolean() && get("use_dora").get<bool>())
      refuse("use_dora (DoRA)", "train a plain LoRA adapter");
    if (get("bias").is_string() && get("bias").get<std::string>() != "none")
      refuse("bias \"" + get("bias").get<std::string>() + "\"", "train the adapter with bias=\"none\"");
    for (const char* k : {"rank_pattern", "alpha_pattern"})
      if (!get(k).is_null() && !(get(k).is_object() && get(k).empty()))
        refuse(k, "train the adapter with one rank and alpha for every layer");
    if (!get("layers_to_transform").is_null())
      refuse("layers_to_transform", "adapt every layer, or name the layers' modules in target_modules");
    LoraConfig lora;
    try {
      const auto number = [&]<class T>(const char* key, T& out) {
        if (const auto x = ::dtrain::detail::json_number<T>(get(key)))
          out = *x;
        else
          throw checkpoint_error(where + ": " + key + " is " + ::dtrain::detail::json_shown(get(key)) + ", not " +
                                     (std::is_integral_v<T> ? "an integer" : "a finite number"),
                                 "re-save the adapter with PEFT");
      };
      number("r", lora.r);
      if (!get("lora_alpha").is_null()) number("lora_alpha", lora.alpha);
      if (!get("lora_dropout").is_null()) number("lora_dropout", lora.dropout);
      if (get("use_rslora").is_boolean()) lora.rslora = get("use_rslora").get<bool>();
      if (!get("modules_to_save").is_null())
        lora.modules_to_save = get("modules_to_save").get<std::vector<std::string>>();
      const auto& t = get("target_modules");
      if (t.is_string()) {
        lora.targets = {t.get<std::string>()};
        lora.regex = lora.targets[0] != "all-linear";
      } else {
        lora.targets = t.get<std::vector<std::string>>();
      }
    } catch (const nlohmann::json::exception& e) {
      throw checkpoint_error(where +
                                 ": r, lora_alpha, lora_dropout, use_rslora, target_modules or modules_to_save is "
                                 "missing or of the wrong type (" +
                                 e.what() + ")",
                             "re-save the adapter with PEFT");
    }
    if (lora.r < 1)
      throw checkpoint_error(where + ": r " + std::to_string(lora.r) + " is not a rank", "re-save the adapter");
    return lora;
  }

}  // namespace dtrain::hf

DTRAIN_IMPL_END
