#pragma once
// LoRA adapters of a diffusers UNet (models::UNet2DCondition built with an
// hf::LoraConfig) in the files diffusers and PEFT read and write.
//
//  - save_lora(trainer, dir, model): dir/pytorch_lora_weights.safetensors
//    as diffusers' save_lora_weights writes a pipeline's UNet adapters:
//    "unet.<module>.lora_A.weight" [r, in] and "unet.<module>.lora_B.weight"
//    [out, r] in float32, and in the file's metadata "format": "pt" and
//    "lora_adapter_metadata", the adapters' PEFT LoraConfig as JSON with
//    every key prefixed "unet." (r, lora_alpha, lora_dropout, use_rslora,
//    target_modules, bias), from which diffusers' load_lora_weights (and a
//    UNet's load_lora_adapter(dir, prefix="unet")) rebuild the adapters,
//    alpha included. The folder appears complete or not at all, never over
//    an existing one.
//  - find_lora / read_lora_config(path): a LoRA folder or file in any of
//    the three layouts diffusers and PEFT write for a UNet:
//      pytorch_lora_weights.safetensors with "unet."-prefixed names (a
//        pipeline's save_lora_weights, dtrain's save_lora);
//      the same file with bare module names (a UNet's save_lora_adapter);
//      adapter_config.json + adapter_model.safetensors with
//        "base_model.model."-prefixed names (PEFT's save_pretrained of a
//        PeftModel over the UNet).
//    The config comes from the file's lora_adapter_metadata or PEFT's
//    adapter_config.json; a file without either gets diffusers' reading:
//    the rank from the tensors, alpha equal to the rank (scale 1), the
//    modules it holds as targets. Refused by name: text-encoder adapters
//    (dtrain trains the UNet's), the older LoRA names (lora.down/lora.up,
//    kohya's lora_unet_*), DoRA, LoRA biases, ranks or alphas that differ
//    per module.
//  - load_lora(trainer, path, model): the adapters into a model built with
//    read_lora_config(path) (load the base first: load_diffusers); every
//    adapter present with its shape and nothing else in the file, or one
//    error listing it all, nothing changed. Collective.

#include <filesystem>
#include <list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/hf/lora.hpp"
#include "dtrain/io/safetensors.hpp"
#include "dtrain/models/unet.hpp"

namespace dtrain::diffusion {

// Where a LoRA's tensors are, how they are named, and its config.
struct LoraSource {
  std::filesystem::path file;  // the safetensors file
  std::string prefix;          // before each module name: "unet.", "base_model.model." or ""
  hf::LoraConfig config;
};

DTRAIN_DECL LoraSource find_lora(const std::filesystem::path& dir_or_file);
inline hf::LoraConfig read_lora_config(const std::filesystem::path& dir_or_file) {
  return find_lora(dir_or_file).config;
}

// The adapters' tensors ("<unit>.transformer_blocks.0.attn1.to_q.lora_A")
// -> their names after the prefix ("down_blocks.0.attentions.0.
// transformer_blocks.0.attn1.to_q.lora_A.weight").
inline std::map<std::string, std::string> lora_names(const models::UNet2DCondition& m) {
  std::map<std::string, std::string> n;
  for (std::size_t unit = 0; unit < m.layers.size(); ++unit)
    for (const auto& p : m.layers[unit].params())
      if (p.name.ends_with("lora_A") || p.name.ends_with("lora_B"))
        n[std::to_string(unit) + "." + p.name] = m.diffusers_name(unit, p.name) + ".weight";
  return n;
}

// The "lora_adapter_metadata" text save_lora writes.
DTRAIN_DECL std::string lora_metadata_json(const hf::LoraConfig& c);

// Writes the model's adapters to dir/pytorch_lora_weights.safetensors.
// Collective.
template <class Trainer>
void save_lora(Trainer& trainer, const std::filesystem::path& dir, const models::UNet2DCondition& model) {
  if (!model.lora.on())
    throw config_error("save_lora: the UNet has no LoRA adapters",
                       "build it with a LoraConfig (lora_r > 0), or save the whole model with save_diffusers");
  World& world = trainer.world();
  const bool writer = world.rank() == 0;
  const auto theirs = lora_names(model);
  std::filesystem::path partial = dir;
  partial += ".partial";
  std::string error;
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("lora_adapter_metadata", lora_metadata_json(model.lora));
  std::list<std::vector<float>> kept;  // the writer refers to the values until write()
  trainer.visit_parameters([&](const ParamSlot& slot, std::vector<float>&& values) {
    const auto it = theirs.find(slot.name);
    if (writer && it != theirs.end())
      w.add("unet." + it->second, slot.spec.shape, kept.emplace_back(std::move(values)));
  });
  if (writer) {
    try {
      hf::detail::begin_save(dir, partial, "save_lora");
      w.write(partial / "pytorch_lora_weights.safetensors");
      hf::detail::commit_save(dir, partial, "the LoRA adapters");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  hf::detail::end_save(world, "diffusion-save-lora", "save_lora", dir, partial, error);
}

// Loads the adapters of a LoRA folder or file into the model's. Collective.
template <class Trainer>
LoadParamsReport load_lora(Trainer& trainer, const std::filesystem::path& dir_or_file,
                           const models::UNet2DCondition& model) {
  if (!model.lora.on())
    throw config_error("load_lora: the UNet has no LoRA adapters",
                       "build it with the adapters' config: models::UNet2DCondition(config, "
                       "diffusion::read_lora_config(dir))");
  const LoraSource src = find_lora(dir_or_file);
  ParamSources s;
  s.what = "\"" + src.file.string() + "\"";
  s.files.push_back(SafetensorsFile::open(src.file));
  const auto names = s.files[0].names();
  const std::set<std::string> present(names.begin(), names.end());
  LoadParamsOptions options{.strict = true};
  for (const auto& [ours, theirs] : lora_names(model)) {
    options.only_names.push_back(ours);
    // some tools keep the adapter's name: ".lora_A.default.weight"
    const std::string named = theirs.substr(0, theirs.size() - 7) + ".default.weight";
    if (present.contains(src.prefix + theirs))
      s.parts[ours] = {{0, src.prefix + theirs}};
    else if (present.contains(src.prefix + named))
      s.parts[ours] = {{0, src.prefix + named}};
  }
  return trainer.load_params(s, options);
}

}  // namespace dtrain::diffusion

#if DTRAIN_DEFINE_IMPL
#include "dtrain/diffusion/lora.ipp"
#endif
