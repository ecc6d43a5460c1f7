#pragma once
// diffusers' PixArtTransformer2DModel directories in and out: config.json
// and diffusion_pytorch_model.safetensors (or its sharded index), as
// PixArtTransformer2DModel.save_pretrained writes them and from_pretrained
// reads them, for models::PixArt (models/pixart.hpp).
//
//  - read_pixart_config(dir): a transformer folder (a PixArt pipeline's
//    transformer/, or the pipeline folder itself, whose transformer/ is then
//    read) or its config.json. Every key dtrain does not build from must
//    hold diffusers' default, an unknown key is refused by name, and so is a
//    _class_name other than PixArtTransformer2DModel: the result is the
//    model diffusers would build, or an error. The latents' size is the
//    config's sample_size unless the caller sets sample_height and
//    sample_width; the caption length (context_length) is the caller's.
//  - pixart_config_json(config, base): the config.json to save (base: the
//    loaded model's own text, whose other keys are kept).
//  - pixart_names(model): dtrain tensor -> diffusers tensor.
//  - load_diffusers(trainer, dir, model), save_diffusers(trainer, dir,
//    model, base_config_json): every tensor present with its shape, or one
//    error listing what is missing, extra or mis-shaped, nothing changed;
//    a save appears complete or not at all, never over an existing folder.
//    The position embedding is a fixed buffer diffusers does not save
//    either.

#include <filesystem>
#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/hf/model.hpp"
#include "dtrain/models/pixart.hpp"

namespace dtrain::diffusion {

// The folder a model path names: `path` itself when it holds config.json,
// else path/transformer (a pipeline's).
DTRAIN_DECL std::filesystem::path pixart_folder(const std::filesystem::path& path);

DTRAIN_DECL models::PixArtConfig read_pixart_config(const std::filesystem::path& dir_or_file);

DTRAIN_DECL std::string pixart_config_json(const models::PixArtConfig& c, const std::string& base = "");

inline hf::TransformersNames pixart_names(const models::PixArt& m) {
  hf::TransformersNames n;
  for (std::size_t unit = 0; unit < m.layers.size(); ++unit)
    for (const auto& p : m.layers[unit].params())
      n.tensors[std::to_string(unit) + "." + p.name] = {m.diffusers_name(unit, p.name)};
  return n;
}

// Loads a diffusers PixArt transformer folder into a trainer of the model
// built from its config. Collective.
template <class Trainer>
LoadParamsReport load_diffusers(Trainer& trainer, const std::filesystem::path& dir, const models::PixArt& model) {
  const ParamSources sources = hf::open_checkpoint(pixart_folder(dir), pixart_names(model));
  return trainer.load_params(sources, {.strict = true, .skip_tags = {"lora"}});
}

// Writes the trainer's PixArt transformer to `dir` as save_pretrained does.
// Collective.
template <class Trainer>
void save_diffusers(Trainer& trainer, const std::filesystem::path& dir, const models::PixArt& model,
                    const std::string& base_config_json = "", hf::SavePretrainedOptions options = {}) {
  options.torch_dtype = false;
  options.weights_name = "diffusion_pytorch_model";
  hf::save_transformers(trainer, dir, pixart_names(model), pixart_config_json(model.config, base_config_json), options);
}

}  // namespace dtrain::diffusion

#if DTRAIN_DEFINE_IMPL
#include "dtrain/diffusion/pixart.ipp"
#endif
