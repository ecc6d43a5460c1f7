// The definitions lora.hpp declares with DTRAIN_DECL: included at the end of
// the header when DTRAIN_DEFINE_IMPL (core/macros.hpp).
#pragma once

#include <algorithm>
#include <set>

#include "dtrain/diffusion/lora.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::diffusion {
  namespace detail {

  // The module an adapter tensor belongs to ("<module>.lora_A.weight" ->
  // "<module>"), or "" for a name that is not one.
  inline std::string adapter_module(const std::string& name) {
    for (const char* tail : {".lora_A.weight", ".lora_B.weight", ".lora_A.default.weight", ".lora_B.default.weight"})
      if (name.ends_with(tail)) return name.substr(0, name.size() - std::string(tail).size());
    return "";
  }

  }  // namespace detail

  DTRAIN_DECL LoraSource find_lora(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    LoraSource src;
    bool peft = false;
    if (fs::is_directory(path)) {
      if (fs::exists(path / "pytorch_lora_weights.safetensors")) {
        src.file = path / "pytorch_lora_weights.safetensors";
      } else if (fs::exists(path / "adapter_model.safetensors") && fs::exists(path / "adapter_config.json")) {
        src.file = path / "adapter_model.safetensors";
        peft = true;
      } else {
        throw checkpoint_error("\"" + path.string() +
                                   "\" holds neither pytorch_lora_weights.safetensors nor adapter_model.safetensors "
                                   "with adapter_config.json",
                               "give a folder written by diffusers' save_lora_weights, dtrain's save_lora or PEFT's "
                               "save_pretrained, or the .safetensors file itself");
      }
    } else if (fs::exists(path)) {
      src.file = path;
    } else {
      throw checkpoint_error(
          "\"" + path.string() + "\" does not exist",
          "give the folder save_lora or diffusers' save_lora_weights wrote, or its .safetensors file");
    }
    const std::string where = "\"" + src.file.string() + "\"";
    const SafetensorsFile f = SafetensorsFile::open(src.file);
    const std::vector<std::string> names = f.names();
    if (names.empty()) throw checkpoint_error(where + " holds no tensor", "give a LoRA file with adapters");
    const std::string convert =
        "load it in diffusers (pipe.load_lora_weights) and write it again with save_lora_weights, which writes "
        "PEFT's names";
    const auto all_start = [&](const std::string& p) {
      return std::all_of(names.begin(), names.end(), [&](const std::string& n) { return n.starts_with(p); });
    };
    for (const std::string& n : names) {
      if (n.starts_with("text_encoder"))
        throw config_error(where + " holds text-encoder adapters (" + n + ")",
                           "save the UNet's adapters alone (save_lora_weights with unet_lora_layers only): dtrain "
                           "trains a UNet's adapters, on cached text embeddings");
      if (n.starts_with("lora_unet_") || n.find(".lora.down.") != std::string::npos ||
          n.find(".lora_down.") != std::string::npos || n.find(".lora_linear_layer.") != std::string::npos)
        throw config_error(where + " uses an older LoRA naming (" + n + ")", convert);
      if (n.find("lora_magnitude_vector") != std::string::npos)
        throw config_error(where + " is a DoRA adapter (" + n + ")", "train a plain LoRA adapter");
      if (detail::adapter_module(n).empty())
        throw config_error(where + " holds " + n + ", which is not a LoRA adapter's lora_A or lora_B weight",
                           "give a file of LoRA adapters alone (no biases, no base weights)");
    }
    if (all_start("unet."))
      src.prefix = "unet.";
    else if (all_start("base_model.model."))
      src.prefix = "base_model.model.";
    else if (std::any_of(names.begin(), names.end(),
                         [](const std::string& n) { return n.starts_with("unet.") || n.starts_with("base_model."); }))
      throw config_error(where + " mixes prefixed and bare module names", convert);
    if (peft) {
      src.config = hf::read_adapter_config(path);
      return src;
    }
    if (const auto m = f.metadata().find("lora_adapter_metadata"); m != f.metadata().end()) {
      // diffusers' pipelines prefix each key with the component ("unet.r"); a model's own save does not
      const auto j = dtrain::detail::parse_json(m->second, [&](const std::string& problem) {
        return checkpoint_error(where + ": lora_adapter_metadata is " + problem, "save the adapters again");
      });
      nlohmann::ordered_json own = nlohmann::ordered_json::object();
      if (j.is_object())
        for (const auto& [key, value] : j.items()) {
          if (key.starts_with("unet."))
            own[key.substr(5)] = value;
          else if (key.find('.') == std::string::npos)
            own[key] = value;
        }
      src.config = hf::parse_adapter_config(own.dump(), where + "'s lora_adapter_metadata");
      return src;
    }
    // diffusers' reading of a file without metadata: the rank from the tensors, alpha = rank, the modules present
    std::set<std::string> modules;
    std::set<std::int64_t> ranks;
    for (const std::string& n : names) {
      modules.insert(detail::adapter_module(n).substr(src.prefix.size()));
      if (n.find(".lora_A.") != std::string::npos) ranks.insert(f.tensor(n).shape.at(0));
    }
    if (ranks.size() != 1)
      throw config_error(where + ": the adapters' ranks differ from module to module",
                         "train the adapters with one rank (a rank_pattern is not supported)");
    src.config.r = *ranks.begin();
    src.config.alpha = static_cast<float>(src.config.r);
    src.config.targets.assign(modules.begin(), modules.end());
    return src;
  }

  DTRAIN_DECL std::string lora_metadata_json(const hf::LoraConfig& c) {
    nlohmann::ordered_json j;
    j["unet.bias"] = "none";
    j["unet.lora_alpha"] = c.alpha;
    j["unet.lora_dropout"] = c.dropout;
    j["unet.r"] = c.r;
    if (c.regex)
      j["unet.target_modules"] = c.targets.at(0);
    else
      j["unet.target_modules"] = c.targets;
    j["unet.use_rslora"] = c.rslora;
    return j.dump(2);
  }

}  // namespace dtrain::diffusion

DTRAIN_IMPL_END
