#pragma once
// Vision towers from transformers: CLIPVisionModel (model_type
// "clip_vision_model") and SiglipVisionModel ("siglip_vision_model"), read
// from a tower's config.json or from the "vision_config" object of a CLIP,
// SigLIP or LLaVA config (hf::VisionConfig), built as dtrain units
// (hf::VisionTower) and loaded from / saved to transformers checkpoints in
// either key layout: transformers 4 writes "vision_model.<module>",
// transformers 5 "<module>" (its base model prefix dropped).
//
//   CLIP     unit 0 PatchEmbedding (no bias, class token, positions),
//            1 LayerNorm pre_layrnorm, 2 .. n+1 encoder layers
//   SigLIP   unit 0 PatchEmbedding (bias, no class token), 1 .. n layers
//   then, for the "default" strategy, nn::DropTokens (the first token)
// A layer is layer_norm1, self_attn (q_proj, k_proj, v_proj, out_proj with
// biases, every token sees every token), layer_norm2, mlp fc1 | act | fc2
// (CLIP quick_gelu, SigLIP gelu_pytorch_tanh).
//
// The features are transformers' hidden_states[vision_feature_layer]
// (hidden_states[0]: the embeddings, after CLIP's pre_layrnorm;
// hidden_states[i]: after layer i; negative indices count from the end), so
// the tower runs only the n layers that needs. post_layernorm, the layers
// past n and SigLIP's attention-pooling head are not run: their tensors are
// kept in the checkpoint and written back unchanged by save_pretrained.
// vision_feature_select_strategy "default" drops the first token of every
// image (as transformers does whatever the tower: the class token for
// CLIP), "full" keeps every token.
//
// The tower is an input unit list: it reads the batch's images (float32
// [B, channels, image_size, image_size], tensor "pixel_values", or x for a
// model of images alone: VisionTowerOptions::input) and writes the features
// [B * tokens, hidden_size]. Standalone (tests, feature regression) its
// loss is nn::MSELoss against batch tensor "y" [B, tokens, hidden_size].

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dtrain/core/macros.hpp"
#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/any_unit.hpp"
#include "dtrain/nn/drop_tokens.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/patch_embedding.hpp"
#include "dtrain/nn/regression_loss.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::hf {

struct VisionConfig {
  std::string model_type;  // clip_vision_model | siglip_vision_model
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_channels = 3;
  std::int64_t image_size = 0;
  std::int64_t patch_size = 0;
  float layer_norm_eps = 1e-5f;
  // LLaVA's choice of features, when the config was a LLaVA config (else
  // the tower's last hidden state, every token).
  std::int64_t feature_layer = -1;
  std::string select_strategy = "full";
  int transformers_major = 4;  // the key layout to write: transformers_version's major (4 when absent)
  std::string json_text;       // the tower's config (compact JSON), written back on save

  bool clip() const { return model_type == "clip_vision_model"; }
  std::int64_t patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

// Checks and reads a tower's config, or a CLIP / SigLIP / LLaVA config's
// "vision_config" (with LLaVA's vision_feature_layer and
// vision_feature_select_strategy); `where` names it in errors.
DTRAIN_DECL VisionConfig parse_vision_config(const nlohmann::ordered_json& j, const std::string& where);

// Reads and checks `path` (a config.json, or the directory holding one).
DTRAIN_DECL VisionConfig read_vision_config(std::filesystem::path path);

// Which features the tower gives: the hidden_states index (-(L+1) .. L,
// L = num_hidden_layers) and the strategy ("default" or "full").
struct VisionFeatures {
  std::int64_t layer = -1;
  std::string strategy = "full";
  // LLaVA's choice as the config says (VisionConfig::feature_layer, select_strategy).
  static VisionFeatures of(const VisionConfig& c) { return {c.feature_layer, c.select_strategy}; }
};

// The encoder layers a feature layer needs (0 .. L); a config_error naming
// the range for one out of range, or an unknown strategy.
DTRAIN_DECL std::int64_t layers_needed(const VisionConfig& c, const VisionFeatures& f);

struct VisionTowerOptions {
  std::string input = "pixel_values";  // the batch tensor of images
  bool trainable = true;               // false: a frozen tower (LLaVA's first stage)
};

using ClipLayer = nn::PreNormBlock<nn::LayerNorm, nn::Attention<nn::Bidirectional>, nn::MLP<nn::QuickGELU>>;
using SiglipLayer = nn::PreNormBlock<nn::LayerNorm, nn::Attention<nn::Bidirectional>, nn::MLP<nn::GELUTanh>>;
using VisionLayer = nn::OneOf<ClipLayer, SiglipLayer>;

struct VisionTower {
  VisionConfig config;
  VisionFeatures features;
  nn::PatchEmbedding embed;
  std::vector<nn::LayerNorm> pre_norm;  // CLIP's pre_layrnorm; none for SigLIP
  std::vector<VisionLayer> layers;      // the layers the features need
  std::vector<nn::DropTokens> select;   // "default": the first token dropped
  nn::MSELoss loss;                     // standalone: features against "y"

  DTRAIN_DECL VisionTower(VisionConfig c, VisionFeatures f, const VisionTowerOptions& options = {});
  explicit VisionTower(VisionConfig c) : VisionTower(c, VisionFeatures::of(c)) {}

  auto units() { return std::tie(embed, pre_norm, layers, select); }

  // Feature rows per image: the tokens, less the first for "default".
  std::int64_t tokens() const { return embed.tokens() - static_cast<std::int64_t>(select.size()); }
};

// The tower's tensors under transformers' names: with the "vision_model."
// prefix (transformers 4's layout) when `prefixed`, else without (5's).
// Loading accepts either (TransformersNames::optional_prefix).
DTRAIN_DECL TransformersNames vision_transformers_names(const VisionTower& tower, bool prefixed);

// Loads a transformers tower checkpoint (either layout) into a trainer of
// hf::VisionTower: every tensor the tower runs must be there with its shape;
// the others (later layers, post_layernorm, SigLIP's head) are left in the
// file. Collective.
template <class Trainer>
LoadParamsReport load_pretrained(Trainer& trainer, const std::filesystem::path& dir, const VisionTower& tower) {
  ParamSources sources = open_checkpoint(dir, vision_transformers_names(tower, true));
  std::set<std::string> used;
  for (const auto& [ours, parts] : sources.parts)
    for (const auto& part : parts) used.insert(part.second);
  for (const SafetensorsFile& f : sources.files)
    for (const std::string& n : f.names())
      if (!used.contains(n)) sources.ignored.insert(n);
  return trainer.load_params(sources, {.strict = true});
}

// The tensors of `source` (the checkpoint the tower was loaded from) that
// the tower does not hold, named for transformers `major`'s layout.
DTRAIN_DECL std::vector<PretrainedTensor> tensors_not_in(const VisionTower& tower, const std::filesystem::path& source,
                                                         int major);

// Writes the trainer's tower as save_pretrained does, in the key layout of
// the config's transformers version, with the tensors it does not run
// copied unchanged from `source` (the checkpoint it was loaded from; ""
// writes only the tower's own, which transformers then initialises at
// random). Collective.
template <class Trainer>
void save_pretrained(Trainer& trainer, const std::filesystem::path& dir, const VisionTower& tower,
                     const std::filesystem::path& source, const SavePretrainedOptions& options = {}) {
  const int major = tower.config.transformers_major;
  std::vector<PretrainedTensor> extra;
  if (trainer.world().rank() == 0 && !source.empty()) extra = tensors_not_in(tower, source, major);
  save_transformers(trainer, dir, vision_transformers_names(tower, major < 5), tower.config.json_text, options, extra);
}

}  // namespace dtrain::hf

#if DTRAIN_DEFINE_IMPL
#include "dtrain/hf/vision.ipp"
#endif
