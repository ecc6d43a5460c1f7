#pragma once
// Transformers checkpoint directories: config.json plus either
// model.safetensors or a sharded model.safetensors.index.json (its
// weight_map names the file of every tensor).
//
// Loading maps the files, not reads them: Trainer::load_params(ParamSources)
// touches only the byte ranges of the elements this rank owns, so no rank
// holds the model. Saving writes save_pretrained's layout (F32), one unit
// gathered at a time and at most one shard held by rank 0.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/checkpoint/state_io.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/hf/config.hpp"
#include "dtrain/hf/lora.hpp"
#include "dtrain/hf/model.hpp"
#include "dtrain/io/safetensors.hpp"
#include "dtrain/model/layout.hpp"

namespace dtrain::hf {

// The sources of a model whose tensors `names` maps to transformers names,
// from the checkpoint in `dir`.
DTRAIN_DECL ParamSources open_checkpoint(const std::filesystem::path& dir, const TransformersNames& names);

// Loads the transformers checkpoint in `dir` into a trainer of hf::CausalLm
// (any strategy, world size and precision). Every tensor must be present
// with the config's shape: anything missing, extra or mis-shaped is one
// error listing all of them, and nothing is changed. Collective.
template <class Trainer>
LoadParamsReport load_pretrained(Trainer& trainer, const std::filesystem::path& dir, const LmConfig& config) {
  const auto names = transformers_names(config);
  const ParamSources sources = open_checkpoint(dir, names);
  try {
    // LoRA adapters are not in a base checkpoint: they keep their initial values (B = 0).
    return trainer.load_params(sources, {.strict = true, .skip_tags = {"lora"}});
  } catch (const config_error& e) {
    // Name the missing tensors as transformers calls them.
    std::string missing;
    for (const auto& [ours, theirs] : names.tensors)
      if (!sources.parts.contains(ours))
        for (const auto& t : theirs) missing += (missing.empty() ? "" : ", ") + t;
    if (missing.empty()) throw;
    throw checkpoint_error(sources.what + " lacks tensors this " + config.model_type + " config needs: " + missing,
                           "check that config.json belongs to this checkpoint");
  }
}

struct SavePretrainedOptions {
  std::uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default max_shard_size, 5 GB
  // The model's LoRA adapters (CausalLm::lora.config), which are merged into
  // the weights they adapt, W + scale * B A, as PEFT's merge_and_unload:
  // transformers then loads the result without PEFT.
  LoraConfig lora{};
  // Set config.json's torch_dtype (transformers' configs); false leaves the
  // config as given (a LeRobot policy's, which knows no such key).
  bool torch_dtype = true;
  // The weights' file name before ".safetensors" (and "-00001-of-00002"):
  // transformers' "model", diffusers' "diffusion_pytorch_model".
  std::string weights_name = "model";
};

namespace detail {
// Adds each adapter of one unit's tensors (name, shape, values) into the
// weight it adapts, W [out, in] += scale * B A (output block s of a
// segmented adapter using A's rows [s r, (s + 1) r)), and drops the
// adapters. Throws when there are adapters and `lora` is off or of another
// rank.
DTRAIN_DECL void merge_lora(std::vector<std::pair<ParamSlot, std::vector<float>>>& unit, const LoraConfig& lora);

// save_pretrained's JSON files in `partial`: <weights_name>.safetensors.index.json
// when there are `shards` > 1 (`file_of`: tensor -> file, sorted), and
// config.json (the config's own text `config_json`, with torch_dtype float32
// when `torch_dtype`: transformers' configs; LeRobot's take no such key).
DTRAIN_DECL void write_pretrained_json(const std::filesystem::path& partial,
                                       const std::map<std::string, std::string>& file_of, std::size_t shards,
                                       std::uint64_t total_bytes, const std::string& config_json,
                                       bool torch_dtype = true, const std::string& weights_name = "model");

// The steps of a save that rank 0 writes to `dir` through `partial`
// ("<dir>.partial"), so that `dir` appears complete or not at all; `call`
// names the saving function in messages.
// Rank 0, first: refuses a `dir` that exists and is not empty, and makes an
// empty `partial` (removing what an interrupted save of ours left there).
DTRAIN_DECL void begin_save(const std::filesystem::path& dir, const std::filesystem::path& partial,
                            std::string_view call);
// Rank 0, last: renames `partial` to `dir` and syncs its parent directory
// (`what`: the saved thing, for the message should that fail).
DTRAIN_DECL void commit_save(const std::filesystem::path& dir, const std::filesystem::path& partial,
                             const std::string& what);
// Every rank, at the end: `error` is rank 0's failure ("" on the others, or
// when it succeeded); after one, rank 0 removes `partial` and every rank
// throws it. `key` names the gather in the store.
DTRAIN_DECL void end_save(World& world, std::string_view key, std::string_view call, const std::filesystem::path& dir,
                          const std::filesystem::path& partial, const std::string& error);
}  // namespace detail

// Writes the trainer's hf::CausalLm to `dir` as save_pretrained does: config.json
// (torch_dtype float32), model.safetensors, or shards
// model-0000i-of-0000N.safetensors with model.safetensors.index.json. The
// directory must not exist (or be empty): it appears complete or not at all
// (written as "<dir>.partial", renamed last). Collective.
// One tensor written as it is (a tensor of the checkpoint that is not a
// parameter of the model: hf::VisionTower's layers past its feature layer).
struct PretrainedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// The same for any model whose tensors `theirs_of` maps to transformers
// names, with `config_json` as its config.json (torch_dtype set to float32)
// and `extra` written beside its parameters (read on rank 0 only).
// Collective.
template <class Trainer>
void save_transformers(Trainer& trainer, const std::filesystem::path& dir, const TransformersNames& theirs_of,
                       const std::string& config_json, const SavePretrainedOptions& options = {},
                       const std::vector<PretrainedTensor>& extra = {}) {
  namespace fs = std::filesystem;
  World& world = trainer.world();
  const bool writer = world.rank() == 0;
  fs::path partial = dir;
  partial += ".partial";
  std::string error;  // rank 0's first failure; the others only take part in the gathers
  auto guarded = [&](auto&& f) {
    if (!writer || !error.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  guarded([&] { detail::begin_save(dir, partial, "save_pretrained"); });

  std::vector<PretrainedTensor> shard;
  std::uint64_t shard_bytes = 0, total_bytes = 0;
  std::vector<std::vector<std::string>> shards;  // tensor names of each written shard
  auto flush = [&] {
    if (shard.empty()) return;
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    shards.emplace_back();
    for (const auto& t : shard) {
      w.add(t.name, t.shape, t.values);
      shards.back().push_back(t.name);
    }
    w.write(partial / ("shard-" + std::to_string(shards.size()) + ".tmp"));
    shard.clear();
    shard_bytes = 0;
  };
  auto push = [&](PretrainedTensor&& t) {
    const std::uint64_t bytes = t.values.size() * sizeof(float);
    if (shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes) flush();
    shard.push_back(std::move(t));
    shard_bytes += bytes;
    total_bytes += bytes;
  };
  // Each unit's tensors are taken together, so its adapters can be merged.
  std::vector<std::pair<ParamSlot, std::vector<float>>> unit;
  auto add = [&](const ParamSlot& slot, std::vector<float>&& values) {
    const auto it = theirs_of.tensors.find(slot.name);
    if (it == theirs_of.tensors.end())
      throw config_error("save_pretrained: the model's tensor '" + slot.name + "' has no transformers name",
                         "save the model built from this config (hf::CausalLm, hf::VisionTower)");
    // A fused tensor splits back into its parts along the first dimension.
    const std::size_t parts = it->second.size(), each = values.size() / parts;
    std::vector<std::int64_t> shape = slot.spec.shape;
    shape[0] /= static_cast<std::int64_t>(parts);
    if (theirs_of.transposed.contains(slot.name)) {  // [out, in] -> transformers' Conv1D [in, out]
      const auto rows = static_cast<std::size_t>(slot.spec.shape[0]), cols = values.size() / rows;
      std::vector<float> t(values.size());
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) t[c * rows + r] = values[r * cols + c];
      values = std::move(t);
      std::swap(shape[0], shape[1]);  // one part: a Conv1D weight is never fused
    }
    for (std::size_t k = 0; k < parts; ++k)
      push({it->second[k], shape,
            std::vector<float>(values.begin() + static_cast<std::ptrdiff_t>(k * each),
                               values.begin() + static_cast<std::ptrdiff_t>((k + 1) * each))});
  };
  auto add_unit = [&] {
    detail::merge_lora(unit, options.lora);
    for (auto& [slot, values] : unit) add(slot, std::move(values));
    unit.clear();
  };
  trainer.visit_parameters([&](const ParamSlot& slot, std::vector<float>&& values) {
    guarded([&] {
      if (!unit.empty() && unit.front().first.name.substr(0, unit.front().first.name.find('.')) !=
                               slot.name.substr(0, slot.name.find('.')))
        add_unit();
      unit.emplace_back(slot, std::move(values));
    });
  });
  guarded([&] {
    add_unit();
    for (const PretrainedTensor& t : extra) push({t.name, t.shape, t.values});
    flush();
    const std::size_t n = shards.size();
    std::map<std::string, std::string> sorted;  // transformers writes the map sorted by name
    for (std::size_t i = 0; i < n; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "-%05zu-of-%05zu.safetensors", i + 1, n);
      const std::string file = options.weights_name + (n == 1 ? std::string(".safetensors") : std::string(name));
      fs::rename(partial / ("shard-" + std::to_string(i + 1) + ".tmp"), partial / file);
      for (const auto& t : shards[i]) sorted[t] = file;
    }
    detail::write_pretrained_json(partial, sorted, n, total_bytes, config_json, options.torch_dtype,
                                  options.weights_name);
    detail::commit_save(dir, partial, "the saved model");
  });
  detail::end_save(world, "hf-save-pretrained", "save_pretrained", dir, partial, error);
}

template <class Trainer>
void save_pretrained(Trainer& trainer, const std::filesystem::path& dir, const LmConfig& config,
                     const SavePretrainedOptions& options = {}) {
  save_transformers(trainer, dir, transformers_names(config), config.json_text, options);
}

// The same for a model with adapters: merged into the weights (see
// SavePretrainedOptions::lora).
template <class Trainer>
void save_pretrained(Trainer& trainer, const std::filesystem::path& dir, const CausalLm& model,
                     SavePretrainedOptions options = {}) {
  options.lora = model.lora.config;
  save_pretrained(trainer, dir, model.config, options);
}

// Writes the model's LoRA adapters to `dir` as PEFT's save_pretrained does:
// adapter_config.json and adapter_model.safetensors (F32, PEFT's tensor
// names; the modules_to_save whole), which
// peft.PeftModel.from_pretrained(base, dir) loads onto the transformers
// model `base` names (base_model_name_or_path). The directory
// must not exist (or be empty); it appears complete or not at all.
// Collective.
template <class Trainer>
void save_adapter(Trainer& trainer, const std::filesystem::path& dir, const CausalLm& model,
                  const std::string& base = "") {
  namespace fs = std::filesystem;
  if (!model.lora.config.on())
    throw config_error("save_adapter: the model has no LoRA adapters", "build it with a LoraConfig (lora_r > 0)");
  World& world = trainer.world();
  const bool writer = world.rank() == 0;
  const auto theirs = peft_names(model.config, model.lora);
  fs::path partial = dir;
  partial += ".partial";
  std::string error;
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  std::list<std::vector<float>> kept;  // the writer refers to the values until write()
  trainer.visit_parameters([&](const ParamSlot& slot, std::vector<float>&& values) {
    const auto it = theirs.find(slot.name);
    if (!writer || it == theirs.end()) return;
    const std::size_t parts = it->second.size(), each = values.size() / parts;
    std::vector<std::int64_t> shape = slot.spec.shape;
    shape[0] /= static_cast<std::int64_t>(parts);
    for (std::size_t k = 0; k < parts; ++k)
      w.add(it->second[k], shape,
            kept.emplace_back(values.begin() + static_cast<std::ptrdiff_t>(k * each),
                              values.begin() + static_cast<std::ptrdiff_t>((k + 1) * each)));
  });
  if (writer) {
    try {
      detail::begin_save(dir, partial, "save_adapter");
      w.write(partial / "adapter_model.safetensors");
      std::ofstream(partial / "adapter_config.json") << adapter_config_json(model.config, model.lora.config, base);
      detail::commit_save(dir, partial, "the adapter");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  detail::end_save(world, "hf-save-adapter", "save_adapter", dir, partial, error);
}

// Loads the LoRA adapters in `dir` (adapter_model.safetensors, PEFT's names,
// as PEFT or save_adapter writes them) into the model's adapters, and the
// modules it saves whole (modules_to_save), and the output head's base
// weight where PEFT saved it beside the head's adapter
// (peft_base_layers); the other base weights are not touched (load them
// with load_pretrained first). Build the model
// with the adapter's own LoraConfig (read_adapter_config(dir)). Every
// adapter must be in the file with its shape, and the file must hold no
// other tensor: anything else is one error listing it all, and nothing is
// changed. Collective.
template <class Trainer>
LoadParamsReport load_adapter(Trainer& trainer, const std::filesystem::path& dir, const CausalLm& model) {
  if (!model.lora.config.on())
    throw config_error("load_adapter: the model has no LoRA adapters",
                       "build it with the adapter's config: hf::CausalLm(config, hf::read_adapter_config(dir))");
  ParamSources s;
  s.what = "\"" + (dir / "adapter_model.safetensors").string() + "\"";
  s.files.push_back(SafetensorsFile::open(dir / "adapter_model.safetensors"));
  const auto names = s.files[0].names();
  const auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  // Exactly the adapters and the modules to save are loaded, each required.
  LoadParamsOptions options{.strict = true};
  for (const auto& [ours, theirs] : peft_names(model.config, model.lora)) {
    options.only_names.push_back(ours);
    std::vector<std::pair<std::size_t, std::string>> parts;
    for (const std::string& t : theirs) {
      // PEFT saves "<module>.lora_A.weight"; some tools keep the adapter's name, ".lora_A.default.weight"
      const std::string named = t.substr(0, t.size() - 7) + ".default.weight";
      if (has(t))
        parts.emplace_back(0, t);
      else if (has(named))
        parts.emplace_back(0, named);
    }
    if (parts.size() == theirs.size()) s.parts[ours] = std::move(parts);
  }
  // The base weights PEFT saves beside some adapters (the output head's), when the file has them.
  for (const auto& [ours, theirs] : peft_base_layers(model.config, model.lora))
    if (has(theirs)) {
      options.only_names.push_back(ours);
      s.parts[ours] = {{0, theirs}};
    }
  return trainer.load_params(s, options);
}

}  // namespace dtrain::hf

#if DTRAIN_DEFINE_IMPL
#include "dtrain/hf/checkpoint.ipp"
#endif
