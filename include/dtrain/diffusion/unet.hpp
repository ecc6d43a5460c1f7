#pragma once
// diffusers' UNet2DConditionModel directories in and out: config.json and
// diffusion_pytorch_model.safetensors (or its sharded index), as
// UNet2DConditionModel.save_pretrained writes them and from_pretrained
// reads them, for models::UNet2DCondition (models/unet.hpp).
//
//  - read_unet_config(dir): a UNet folder (a pipeline's unet/, or the
//    pipeline folder itself, whose unet/ is then read) or its config.json.
//    Every key dtrain does not build from must hold diffusers' default, and
//    an unknown key is refused by name: the result is the model diffusers
//    would build, or an error. The latents' size is the config's
//    sample_size unless the caller sets sample_height and sample_width.
//  - unet_config_json(config, base): the config.json to save (base: the
//    loaded model's own text, whose other keys are kept).
//  - unet_names(model): dtrain tensor -> diffusers tensor.
//  - load_diffusers(trainer, dir, model), save_diffusers(trainer, dir,
//    model, base_config_json): every tensor present with its shape, or one
//    error listing what is missing, extra or mis-shaped, nothing changed;
//    a save appears complete or not at all, never over an existing folder.

#include <algorithm>
#include <filesystem>
#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/hf/model.hpp"
#include "dtrain/models/unet.hpp"

namespace dtrain::diffusion {

// The folder a model path names: `path` itself when it holds config.json
// of a UNet, else path/unet (a pipeline's).
DTRAIN_DECL std::filesystem::path unet_folder(const std::filesystem::path& path);

DTRAIN_DECL models::UNetConfig read_unet_config(const std::filesystem::path& dir_or_file);

DTRAIN_DECL std::string unet_config_json(const models::UNetConfig& c, const std::string& base = "");

inline hf::TransformersNames unet_names(const models::UNet2DCondition& m) {
  hf::TransformersNames n;
  for (std::size_t unit = 0; unit < m.layers.size(); ++unit)
    for (const auto& p : m.layers[unit].params())
      if (std::find(p.tags.begin(), p.tags.end(), "lora") == p.tags.end())
        n.tensors[std::to_string(unit) + "." + p.name] = {m.diffusers_name(unit, p.name)};
  return n;
}

// Loads a diffusers UNet folder into a trainer of the model built from its
// config. Collective.
template <class Trainer>
LoadParamsReport load_diffusers(Trainer& trainer, const std::filesystem::path& dir,
                                const models::UNet2DCondition& model) {
  const ParamSources sources = hf::open_checkpoint(unet_folder(dir), unet_names(model));
  return trainer.load_params(sources, {.strict = true, .skip_tags = {"lora"}});
}

// Writes the trainer's UNet to `dir` as save_pretrained does; a model with
// LoRA adapters is saved with them merged into the weights they adapt
// (W + scale B A, diffusers' fuse_lora), a UNet diffusers loads without
// PEFT (save_lora writes the adapters alone). Collective.
template <class Trainer>
void save_diffusers(Trainer& trainer, const std::filesystem::path& dir, const models::UNet2DCondition& model,
                    const std::string& base_config_json = "", hf::SavePretrainedOptions options = {}) {
  options.torch_dtype = false;
  options.lora = model.lora;
  options.weights_name = "diffusion_pytorch_model";
  hf::save_transformers(trainer, dir, unet_names(model), unet_config_json(model.config, base_config_json), options);
}

}  // namespace dtrain::diffusion

#if DTRAIN_DEFINE_IMPL
#include "dtrain/diffusion/unet.ipp"
#endif
