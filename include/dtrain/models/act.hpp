#pragma once
// models::Act: LeRobot's ACT policy (Action Chunking with Transformers) as a
// dtrain model, configured like LeRobot's ACTConfig (models::ActConfig; read
// from and written to a LeRobot policy directory by lerobot/act.hpp).
//
//   units   the ResNet trunk's stem and blocks (torchvision's resnet18 with
//           FrozenBatchNorm2d, run on each camera's image: nn::ImagesPerRow),
//           nn::ActTokens (the conditional-VAE encoder, the latent, state and
//           image tokens), nn::ActEncoder x n_encoder_layers,
//           nn::ActDecoderStart, nn::ActDecoder x n_decoder_layers, nn::ActHead
//   loss    nn::ActLoss: the masked L1 over the chunk + kl_weight * KL
//   batch   x float [B, cameras * 3 * H * W] (each camera's normalised image,
//           CHW, in the config's camera order), "observation.state" float
//           [B, state_dim], "action" float [B, chunk_size, action_dim],
//           "action_is_pad" [B, chunk_size] (1 = padded), optional
//           "latent_noise" float [B, latent_dim]
//   output  one row per sample: the chunk's actions (chunk_size x action_dim,
//           normalised as the targets), then mu and log sigma^2 (zeros
//           outside training): predict() gives the actions as the first
//           chunk_size * action_dim columns
//
// The units' GPU path is compiled but has not run on a GPU: with a GPU
// device they need DTRAIN_GPU_VISION=on (docs/gpu.md).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/nn/act_units.hpp"
#include "dtrain/nn/images_per_row.hpp"
#include "dtrain/nn/resnet.hpp"

namespace dtrain::models {

// LeRobot's ACTConfig, the keys dtrain uses (LeRobot's names and defaults).
struct ActConfig {
  std::int64_t chunk_size = 100;
  std::int64_t n_action_steps = 100;
  std::string vision_backbone = "resnet18";
  bool replace_final_stride_with_dilation = false;
  bool pre_norm = false;
  std::int64_t dim_model = 512;
  std::int64_t n_heads = 8;
  std::int64_t dim_feedforward = 3200;
  std::string feedforward_activation = "relu";
  std::int64_t n_encoder_layers = 4;
  std::int64_t n_decoder_layers = 1;
  bool use_vae = true;
  std::int64_t latent_dim = 32;
  std::int64_t n_vae_encoder_layers = 4;
  float dropout = 0.1f;
  float kl_weight = 10.f;
  float optimizer_lr = 1e-5f;
  float optimizer_weight_decay = 1e-4f;
  float optimizer_lr_backbone = 1e-5f;
  // The features: camera keys ("observation.images.top", ...) in order, all
  // of one size; the robot state's and the action's sizes.
  std::vector<std::string> cameras;
  std::int64_t image_channels = 3;
  std::int64_t image_height = 96;
  std::int64_t image_width = 96;
  std::int64_t state_dim = 0;  // 0: no "observation.state"
  std::int64_t action_dim = 0;
};

// Checks a config dtrain can build, naming what it cannot.
inline void check_act_config(const ActConfig& c) {
  const auto need = [](bool ok, const std::string& what, const std::string& fix) {
    if (!ok) throw config_error("ACT config: " + what, fix);
  };
  need(c.vision_backbone == "resnet18", "vision_backbone \"" + c.vision_backbone + "\" is not supported",
       "use resnet18 (the ACT backbone dtrain builds)");
  need(!c.replace_final_stride_with_dilation, "replace_final_stride_with_dilation is not supported",
       "set it to false (dtrain's ResNet has no dilated convolutions)");
  need(c.feedforward_activation == "relu" || c.feedforward_activation == "gelu",
       "feedforward_activation \"" + c.feedforward_activation + "\" is not supported", "use relu or gelu");
  need(!c.cameras.empty(), "no camera (observation.images.*) among the input features",
       "give at least one VISUAL input feature: dtrain's ACT needs images");
  need(c.image_channels == 3, "images of " + std::to_string(c.image_channels) + " channels",
       "give RGB images (3 channels), as the ResNet stem reads");
  need(c.action_dim > 0, "no action feature", "give the ACTION output feature \"action\" with its shape");
  need(c.chunk_size > 0 && c.n_action_steps > 0 && c.n_action_steps <= c.chunk_size,
       "n_action_steps " + std::to_string(c.n_action_steps) + " and chunk_size " + std::to_string(c.chunk_size),
       "give 0 < n_action_steps <= chunk_size");
  need(c.dim_model > 0 && c.n_heads > 0 && c.dim_model % c.n_heads == 0,
       "dim_model " + std::to_string(c.dim_model) + " with " + std::to_string(c.n_heads) + " heads",
       "give a dim_model that n_heads divides");
  need(c.n_encoder_layers >= 1 && c.n_decoder_layers >= 1, "no encoder or decoder layer",
       "give n_encoder_layers >= 1 and n_decoder_layers >= 1");
  need(!c.use_vae || c.n_vae_encoder_layers >= 0, "a negative n_vae_encoder_layers", "give 0 or more");
  need(c.latent_dim > 0 && c.latent_dim <= c.dim_model, "latent_dim " + std::to_string(c.latent_dim),
       "give 0 < latent_dim <= dim_model");
  need(c.dropout >= 0.f && c.dropout < 1.f, "dropout " + std::to_string(c.dropout), "give a dropout in [0, 1)");
}

inline nn::ActShape act_shape(const ActConfig& c) {
  const nn::Extent2 f = nn::resnet_out_extent({c.image_height, c.image_width});
  nn::ActShape s;
  s.dim = c.dim_model;
  s.heads = c.n_heads;
  s.feedforward = c.dim_feedforward;
  s.dropout = c.dropout;
  s.pre_norm = c.pre_norm;
  s.activation = c.feedforward_activation == "gelu" ? nn::ffn_activation::gelu : nn::ffn_activation::relu;
  s.chunk = c.chunk_size;
  s.action_dim = c.action_dim;
  s.state_dim = c.state_dim;
  s.latent = c.latent_dim;
  s.use_vae = c.use_vae;
  s.vae_layers = c.n_vae_encoder_layers;
  s.kl_weight = c.kl_weight;
  s.cameras = static_cast<std::int64_t>(c.cameras.size());
  s.feature_channels = 512;
  s.feature_h = f.h;
  s.feature_w = f.w;
  return s;
}

struct Act {
  explicit Act(const ActConfig& c)
      : config((check_act_config(c), c)),
        shape(act_shape(c)),
        trunk(nn::resnet18_units({c.image_height, c.image_width})),
        stem(trunk.stem, shape.cameras),
        tokens(shape),
        start(shape),
        head(shape),
        loss(shape) {
    for (const auto& b : trunk.blocks) blocks.emplace_back(b, shape.cameras);
    for (std::int64_t i = 0; i < c.n_encoder_layers; ++i) encoder.emplace_back(shape);
    for (std::int64_t i = 0; i < c.n_decoder_layers; ++i) decoder.emplace_back(shape);
  }

  ActConfig config;
  nn::ActShape shape;
  nn::ResNetTrunk trunk;  // names and extents (its units run through the wrappers below)
  nn::ImagesPerRow<nn::ResNetStem> stem;
  std::vector<nn::ImagesPerRow<nn::BasicBlock>> blocks;
  nn::ActTokens tokens;
  std::vector<nn::ActEncoder> encoder;
  nn::ActDecoderStart start;
  std::vector<nn::ActDecoder> decoder;
  nn::ActHead head;
  nn::ActLoss loss;

  auto units() { return std::tie(stem, blocks, tokens, encoder, start, decoder, head); }

  std::size_t backbone_units() const { return 1 + blocks.size(); }
  std::size_t unit_count() const { return backbone_units() + 1 + encoder.size() + 1 + decoder.size() + 1; }

  // The width of x: every camera's image.
  std::int64_t input_features() const {
    return shape.cameras * config.image_channels * config.image_height * config.image_width;
  }

  // LeRobot's state-dict key of unit `unit`'s parameter `param` (a name its
  // params() declares): "model.backbone.layer2.0.conv1.weight",
  // "model.encoder.layers.1.linear2.bias", "model.action_head.weight".
  std::string lerobot_name(std::size_t unit, std::string_view param) const {
    const std::string p(param);
    std::size_t at = unit;
    if (at < backbone_units()) return "model.backbone." + trunk.torchvision_name(at, param);
    at -= backbone_units();
    if (at == 0) return "model." + p;
    at -= 1;
    if (at < encoder.size()) return "model.encoder.layers." + std::to_string(at) + "." + p;
    at -= encoder.size();
    if (at == 0) return "model." + p;
    at -= 1;
    if (at < decoder.size()) return "model.decoder.layers." + std::to_string(at) + "." + p;
    at -= decoder.size();
    if (at == 0) return "model." + p;
    throw config_error(
        "models::Act::lerobot_name: unit " + std::to_string(unit) + " of " + std::to_string(unit_count()),
        "number the units from 0 to unit_count() - 1");
  }
};

}  // namespace dtrain::models
