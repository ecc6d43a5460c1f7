// The definitions checkpoint.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::hf {
  DTRAIN_DECL void detail::write_pretrained_json(
      const std::filesystem::path& partial, const std::map<std::string, std::string>& file_of, std::size_t shards,
      std::uint64_t total_bytes, const std::string& config_json, bool torch_dtype, const std::string& weights_name) {
    auto write_json = [&](const std::filesystem::path& path, const nlohmann::ordered_json& j) {
      const std::string text = j.dump(2) + "\n";
      const std::span<const std::byte> bytes = std::as_bytes(std::span(text));
      dtrain::detail::write_file_atomically(path, std::span(&bytes, 1));
    };
    if (shards > 1) {
      nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
      for (const auto& [t, f] : file_of) weight_map[t] = f;
      write_json(partial / (weights_name + ".safetensors.index.json"),
                 {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}});
    }
    nlohmann::ordered_json cfg =
        config_json.empty() ? nlohmann::ordered_json::object() : nlohmann::ordered_json::parse(config_json);
    if (torch_dtype) {
      cfg["torch_dtype"] = "float32";
      if (cfg.contains("dtype")) cfg["dtype"] = "float32";  // transformers 5's name for it
    }
    write_json(partial / "config.json", cfg);
  }

  DTRAIN_DECL void detail::begin_save(const std::filesystem::path& dir, const std::filesystem::path& partial,
                                      std::string_view call) {
    namespace fs = std::filesystem;
    if (fs::exists(dir) && !(fs::is_directory(dir) && fs::is_empty(dir)))
      throw checkpoint_error(
          "\"" + dir.string() + "\" exists and is not empty; " + std::string(call) + " never overwrites",
          "save to a new directory");
    fs::remove_all(partial);  // what an interrupted save of ours left
    fs::create_directories(partial);
  }

  DTRAIN_DECL void detail::commit_save(const std::filesystem::path& dir, const std::filesystem::path& partial,
                                       const std::string& what) {
    namespace fs = std::filesystem;
    if (fs::exists(dir)) fs::remove(dir);  // empty, checked by begin_save
    fs::rename(partial, dir);
    dtrain::detail::sync_directory(dir.parent_path().empty() ? fs::path(".") : dir.parent_path(), what);
  }

  DTRAIN_DECL void detail::end_save(World & world, std::string_view key, std::string_view call,
                                    const std::filesystem::path& dir, const std::filesystem::path& partial,
                                    const std::string& error) {
    if (world.rank() == 0 && !error.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(partial, ignored);
    }
    const auto all = world.all_gather(key, error);
    if (!all[0].empty())
      throw checkpoint_error(std::string(call) + " to \"" + dir.string() + "\" failed: " + all[0],
                             "fix the cause (space, permissions) and save again; nothing was left at that path");
  }

  DTRAIN_DECL ParamSources open_checkpoint(const std::filesystem::path& dir, const TransformersNames& names) {
    namespace fs = std::filesystem;
    ParamSources s;
    s.what = "\"" + dir.string() + "\"";
    std::map<std::string, std::size_t> file_of;  // transformers tensor -> index into s.files
    // transformers' file names, else diffusers'
    const bool diffusers = !fs::exists(dir / "model.safetensors") &&
                           !fs::exists(dir / "model.safetensors.index.json") &&
                           (fs::exists(dir / "diffusion_pytorch_model.safetensors") ||
                            fs::exists(dir / "diffusion_pytorch_model.safetensors.index.json"));
    const std::string stem = diffusers ? "diffusion_pytorch_model" : "model";
    const fs::path single = dir / (stem + ".safetensors"), index = dir / (stem + ".safetensors.index.json");
    if (fs::exists(index)) {
      std::ifstream in(index);
      const auto j = dtrain::detail::parse_json(in, [&](const std::string& problem) {
        return checkpoint_error("\"" + index.string() + "\" is " + problem, "re-save the model with save_pretrained");
      });
      if (!j.contains("weight_map") || !j.at("weight_map").is_object())
        throw checkpoint_error("\"" + index.string() + "\" has no weight_map",
                               "re-save the model with save_pretrained");
      std::map<std::string, std::size_t> opened;
      for (const auto& [tensor, file] : j.at("weight_map").items()) {
        if (!file.is_string())
          throw checkpoint_error("\"" + index.string() + "\": weight_map[\"" + tensor + "\"] is not a file name");
        const std::string f = file.get<std::string>();
        auto [it, fresh] = opened.try_emplace(f, s.files.size());
        // A shard must be a file of `dir`: the index may come from anyone.
        if (fresh)
          s.files.push_back(SafetensorsFile::open(dtrain::detail::contained_path(
              dir, f, "\"" + index.string() + "\" (weight_map[\"" + tensor + "\"])", dtrain::detail::links::follow)));
        file_of[tensor] = it->second;
      }
      for (std::size_t i = 0; i < s.files.size(); ++i)
        for (const auto& n : s.files[i].names())
          if (!file_of.contains(n))
            throw checkpoint_error(
                "\"" + s.files[i].path().string() + "\" holds \"" + n + "\", which the index does not list",
                "re-save the model with save_pretrained");
    } else if (fs::exists(single)) {
      s.files.push_back(SafetensorsFile::open(single));
      for (const auto& n : s.files[0].names()) file_of[n] = 0;
    } else {
      throw checkpoint_error("\"" + dir.string() +
                                 "\" has neither model.safetensors nor model.safetensors.index.json (nor diffusers' "
                                 "diffusion_pytorch_model.safetensors)",
                             "give a directory written by save_pretrained(safe_serialization=True); PyTorch .bin "
                             "checkpoints are not read");
    }
    for (const auto& [file_name, f] : file_of)
      if (names.ignored(file_name)) s.ignored.insert(file_name);
    for (const auto& [ours, theirs] : names.tensors) {
      std::vector<std::pair<std::size_t, std::string>> parts;
      for (std::string t : theirs) {
        auto it = file_of.find(t);
        const std::string& prefix = names.optional_prefix;
        if (it == file_of.end() && !prefix.empty() && t.starts_with(prefix)) {
          t = t.substr(prefix.size());
          it = file_of.find(t);
        }
        if (it == file_of.end()) {
          parts.clear();
          break;  // reported as missing, under our name and theirs below
        }
        parts.emplace_back(it->second, t);
        if (!s.files[it->second].contains(t))
          throw checkpoint_error("the index of \"" + dir.string() + "\" puts \"" + t + "\" in \"" +
                                     s.files[it->second].path().filename().string() + "\", which does not hold it",
                                 "re-save the model with save_pretrained");
      }
      if (!parts.empty()) s.parts[ours] = std::move(parts);
      if (names.transposed.contains(ours)) s.transposed.insert(ours);
    }
    return s;
  }
  DTRAIN_DECL void detail::merge_lora(std::vector<std::pair<ParamSlot, std::vector<float>>> & unit,
                                      const LoraConfig& lora) {
    const auto find = [&](const std::string& name) -> std::pair<ParamSlot, std::vector<float>>* {
      for (auto& t : unit)
        if (t.first.name == name) return &t;
      return nullptr;
    };
    // "<projection>.lora_A" in a block, "lora_A" in a unit that is one Linear (the output head).
    const std::string suffix = "lora_A";
    for (auto& [slot, a] : unit) {
      const std::string& n = slot.name;
      if (n.size() < suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
      const std::string site = n.substr(0, n.size() - suffix.size());  // "<projection>." or ""
      if (!lora.on())
        throw config_error("save_pretrained: the model has LoRA adapters ('" + n + "')",
                           "save with the model (save_pretrained(trainer, dir, model)) to merge them, or "
                           "SavePretrainedOptions{.lora = model.lora.config}; save_adapter writes them for PEFT");
      auto* w = find(site + "weight");
      auto* b = find(site + "lora_B");
      if (w == nullptr || b == nullptr)
        throw config_error("save_pretrained: adapter '" + n + "' has no weight or lora_B beside it",
                           "report this: the unit's adapters are malformed");
      const std::int64_t out = w->first.spec.shape.at(0), in = w->first.spec.shape.at(1);
      const std::int64_t r = b->first.spec.shape.at(1), seg = slot.spec.shape.at(0) / r;
      if (r != lora.r)
        throw config_error("save_pretrained: adapter '" + n + "' has rank " + std::to_string(r) + ", the LoRA config " +
                               std::to_string(lora.r),
                           "pass the model's own config (model.lora.config)");
      const double scale = lora.options().scale();
      const std::int64_t per = out / seg;
      std::vector<double> row(static_cast<std::size_t>(in));
      for (std::int64_t o = 0; o < out; ++o) {
        std::fill(row.begin(), row.end(), 0.0);
        for (std::int64_t k = 0; k < r; ++k) {
          const double bk = b->second[static_cast<std::size_t>(o * r + k)];
          const float* ak = a.data() + ((o / per) * r + k) * in;
          for (std::int64_t i = 0; i < in; ++i) row[static_cast<std::size_t>(i)] += bk * ak[i];
        }
        float* wo = w->second.data() + o * in;
        for (std::int64_t i = 0; i < in; ++i)
          wo[i] = static_cast<float>(wo[i] + scale * row[static_cast<std::size_t>(i)]);
      }
    }
    std::erase_if(unit, [](const auto& t) {
      const auto& tags = t.first.spec.tags;
      return std::find(tags.begin(), tags.end(), "lora") != tags.end();
    });
  }

}  // namespace dtrain::hf
DTRAIN_IMPL_END
