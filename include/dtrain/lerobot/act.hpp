#pragma once
// LeRobot policy directories for models::Act, both ways:
//   config.json        ACTConfig as draccus writes it ("type": "act", the
//                      input/output features, the sizes); every key is read
//                      or known: an unknown key is an error, never ignored
//   model.safetensors  the policy's state dict (LeRobot's names: model.*),
//                      with the VAE encoder's sine-table buffer
//                      model.vae_encoder_pos_enc
// read_act_config reads config.json, load_lerobot loads the weights into a
// Trainer of models::Act (any strategy, world size, precision), save_lerobot
// writes a directory ACTPolicy.from_pretrained loads.
// load_torchvision_backbone initialises the ResNet trunk from torchvision's
// resnet18 state dict in a safetensors file (conv1.weight, bn1.*,
// layer1.0.conv1.weight, ...; fc.* ignored): ImageNet weights a user
// converted once, never downloaded.

#include <filesystem>
#include <string>
#include <vector>

#include "dtrain/checkpoint/state_io.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/hf/model.hpp"
#include "dtrain/models/act.hpp"

namespace dtrain::lerobot {

// The policy types dtrain reads, for messages.
inline constexpr const char* supported_policies = "act";

// config.json of a LeRobot policy directory (or the file itself). Throws a
// config_error naming an unsupported policy type (and the supported ones),
// an unknown key, or a value dtrain cannot build.
DTRAIN_DECL models::ActConfig read_act_config(const std::filesystem::path& dir_or_file);

// The config.json text of `c` as LeRobot 0.4 writes it; `base` (a config's
// own text, or "") keeps the keys dtrain does not set (device, repo_id,
// normalization_mapping, ...) as they were.
DTRAIN_DECL std::string act_config_json(const models::ActConfig& c, const std::string& base = "");

// dtrain's parameter names ("<unit>.<param>") -> LeRobot's.
inline hf::TransformersNames act_names(const models::Act& m) {
  hf::TransformersNames n;
  std::size_t unit = 0;
  const auto add = [&](const std::vector<ParamSpec>& specs) {
    for (const auto& p : specs) n.tensors[std::to_string(unit) + "." + p.name] = {m.lerobot_name(unit, p.name)};
    ++unit;
  };
  add(m.stem.params());
  for (const auto& b : m.blocks) add(b.params());
  add(m.tokens.params());
  for (const auto& e : m.encoder) add(e.params());
  add(m.start.params());
  for (const auto& d : m.decoder) add(d.params());
  add(m.head.params());
  return n;
}

// The VAE encoder's fixed sine table [1, tokens, dim] (LeRobot's buffer
// model.vae_encoder_pos_enc), in float64 as LeRobot computes it, rounded once.
DTRAIN_DECL std::vector<float> vae_position_table(const models::ActConfig& c);

// Loads model.safetensors of a LeRobot ACT directory into a trainer of
// models::Act built from its config. Every parameter must be present with
// its shape; anything missing, extra or mis-shaped is one error listing all
// of them, and nothing changes. Collective.
template <class Trainer>
LoadParamsReport load_lerobot(Trainer& trainer, const std::filesystem::path& dir, const models::Act& model) {
  const auto names = act_names(model);
  ParamSources sources = hf::open_checkpoint(dir, names);
  sources.ignored.insert("model.vae_encoder_pos_enc");
  return trainer.load_params(sources, {.strict = true});
}

// Writes the trainer's models::Act to `dir` as ACTPolicy.save_pretrained
// does (config.json from act_config_json(model.config, base_config_json),
// model.safetensors); `dir` must not exist or be empty, and appears complete
// or not at all. Collective.
template <class Trainer>
void save_lerobot(Trainer& trainer, const std::filesystem::path& dir, const models::Act& model,
                  const std::string& base_config_json = "") {
  std::vector<hf::PretrainedTensor> extra;
  if (model.config.use_vae)
    extra.push_back({"model.vae_encoder_pos_enc",
                     {1, model.shape.vae_tokens(), model.config.dim_model},
                     vae_position_table(model.config)});
  hf::SavePretrainedOptions options;
  options.torch_dtype = false;
  hf::save_transformers(trainer, dir, act_names(model), act_config_json(model.config, base_config_json), options,
                        extra);
}

// Loads torchvision's resnet18 weights (safetensors, torchvision's names)
// into the trunk of a trainer of models::Act. fc.* and num_batches_tracked
// are ignored; the rest must match. Collective.
template <class Trainer>
LoadParamsReport load_torchvision_backbone(Trainer& trainer, const std::filesystem::path& file,
                                           const models::Act& model) {
  ParamSources s;
  s.what = "\"" + file.string() + "\"";
  s.files.push_back(SafetensorsFile::open(file));
  const auto& f = s.files.back();
  std::size_t unit = 0;
  const auto add = [&](const std::vector<ParamSpec>& specs) {
    for (const auto& p : specs)
      s.parts[std::to_string(unit) + "." + p.name] = {{0, model.trunk.torchvision_name(unit, p.name)}};
    ++unit;
  };
  add(model.stem.params());
  for (const auto& b : model.blocks) add(b.params());
  std::string missing;
  for (const auto& [ours, theirs] : s.parts)
    if (!f.contains(theirs.front().second)) missing += (missing.empty() ? "" : ", ") + theirs.front().second;
  if (!missing.empty())
    throw checkpoint_error(s.what + " lacks torchvision resnet18 tensors: " + missing,
                           "give torchvision's resnet18 state dict saved with safetensors (conv1.weight, bn1.*, "
                           "layer1.0.conv1.weight, ...)");
  for (const auto& n : f.names()) {
    const bool backbone_tensor = n.rfind("fc.", 0) != 0 && n.find("num_batches_tracked") == std::string::npos;
    if (!backbone_tensor) s.ignored.insert(n);
  }
  return trainer.load_params(s, {.strict = false});
}

}  // namespace dtrain::lerobot

#if DTRAIN_DEFINE_IMPL
#include "dtrain/lerobot/act.ipp"
#endif
