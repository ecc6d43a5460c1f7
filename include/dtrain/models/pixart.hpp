#pragma once
// models::PixArt: diffusers' PixArtTransformer2DModel (PixArt-alpha,
// PixArt-Sigma: a single-stream diffusion transformer with adaLN-single
// timestep conditioning and cross-attention to T5 captions) as a dtrain
// model, configured like diffusers' config.json (models::PixArtConfig; read
// from and written to a diffusers directory by diffusion/pixart.hpp), for
// latents of one size.
//
//   units   nn::PixArtInput (pos_embed: the patch convolution and the fixed
//           2-D sin-cos positions; caption_projection; adaln_single; writes
//           the projected caption, the timestep modulation and the embedded
//           timestep to lanes 0, 1, 2), num_layers nn::PixArtBlock
//           (transformer_blocks.<i>), nn::PixArtOutput (norm_out,
//           scale_shift_table, proj_out, unpatchify): nn/pixart_units.hpp
//   loss    models::PixArtLoss, the mean squared error against the batch's
//           "y" (the noise, the velocity or the flow target,
//           diffusion/schedule.hpp), weighted per record by a float [B]
//           tensor when the loss is built with its name (min-SNR:
//           PixArtLoss(used, "y", "weight")). With a learned variance (out_channels ==
//           2 x in_channels, PixArt-alpha's and Sigma's 8) the loss reads
//           the first in_channels channels of the prediction only, as
//           diffusers' PixArt training scripts do (model_pred.chunk(2,
//           dim=1)[0]): "y" then holds in_channels * h * w values per record
//           and the variance channels get no gradient.
//   batch   x float [B, in_channels, h, w] (the noisy latents), "timesteps"
//           float [B], "encoder_hidden_states" float [B, context_length,
//           caption_channels] (T5's hidden states), optionally
//           "encoder_attention_mask" int32/int64 [B, context_length] (1: a
//           token, 0: padding); y float [B, in_channels * h * w] (learned
//           variance) or [B, out_channels * h * w]
//   output  one row per record: the prediction [out_channels, h, w]
//
// Names: unit i's parameter p is diffusers' `diffusers_name(i, p)`
// ("transformer_blocks.3.attn2.to_k.weight", "proj_out.bias").
//
// The units' GPU path is compiled but has not run on a GPU: with a GPU
// device they need DTRAIN_GPU_VISION=on and DTRAIN_GPU_ATTENTION=on
// (docs/gpu.md).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/nn/any_unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/pixart_units.hpp"

namespace dtrain::models {

// diffusers' PixArtTransformer2DModel config, the keys dtrain builds from
// (diffusers' names and defaults).
struct PixArtConfig {
  std::int64_t num_attention_heads = 16;
  std::int64_t attention_head_dim = 72;
  std::int64_t in_channels = 4;
  std::int64_t out_channels = 8;  // 2 x in_channels: a learned variance (see the loss)
  std::int64_t num_layers = 28;
  std::int64_t cross_attention_dim = 1152;  // must be the model's width, heads x head_dim
  std::int64_t caption_channels = 4096;     // T5-XXL's width
  std::int64_t patch_size = 2;
  std::int64_t sample_size = 128;          // the latents' size the positions are scaled to (base_size x patch)
  double interpolation_scale = 0.0;        // 0: diffusers' default, max(sample_size / 64, 1)
  float norm_eps = 1e-6f;                  // the blocks' LayerNorms'
  bool use_additional_conditions = false;  // PixArt-alpha 1024's resolution conditioning: not built
  // The latents' size the model is built for (sample_size by default), and
  // the caption tokens per record (PixArt-alpha: 120, Sigma: 300).
  std::int64_t sample_height = 128;
  std::int64_t sample_width = 128;
  std::int64_t context_length = 120;

  std::int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  double interpolation() const {
    return interpolation_scale > 0.0 ? interpolation_scale
                                     : static_cast<double>(std::max<std::int64_t>(sample_size / 64, 1));
  }
  // The loss reads the first in_channels channels (a learned variance).
  bool learned_sigma() const { return out_channels == 2 * in_channels; }
};

// Checks a config dtrain can build, naming what it cannot.
inline void check_pixart_config(const PixArtConfig& c) {
  const auto need = [](bool ok, const std::string& what, const std::string& fix) {
    if (!ok) throw config_error("PixArt config: " + what, fix);
  };
  need(!c.use_additional_conditions,
       "use_additional_conditions is true (PixArt-alpha 1024's resolution and aspect "
       "ratio embeddings), which dtrain does not build",
       "use a PixArt with use_additional_conditions false (PixArt-Sigma, PixArt-alpha 256/512); a null value means "
       "true for sample_size 128");
  need(c.num_attention_heads > 0 && c.attention_head_dim > 0,
       std::to_string(c.num_attention_heads) + " heads of " + std::to_string(c.attention_head_dim),
       "give positive num_attention_heads and attention_head_dim");
  need(c.inner_dim() % 4 == 0,
       "the width " + std::to_string(c.inner_dim()) + " (heads x head_dim) is not divisible by 4",
       "use a width the 2-D sin-cos position embedding splits in four (diffusers requires it too)");
  need(c.cross_attention_dim == c.inner_dim(),
       "cross_attention_dim " + std::to_string(c.cross_attention_dim) + " is not the width " +
           std::to_string(c.inner_dim()) + " the caption is projected to",
       "give cross_attention_dim = num_attention_heads x attention_head_dim (PixArt: 1152)");
  need(c.in_channels > 0 && c.out_channels > 0 && c.caption_channels > 0,
       std::to_string(c.in_channels) + " input, " + std::to_string(c.out_channels) + " output and " +
           std::to_string(c.caption_channels) + " caption channels",
       "give positive channel counts (PixArt: 4, 8, 4096)");
  need(c.num_layers >= 1, std::to_string(c.num_layers) + " layers", "give at least one transformer block");
  need(c.patch_size >= 1 && c.sample_size >= c.patch_size,
       "patch_size " + std::to_string(c.patch_size) + " for sample_size " + std::to_string(c.sample_size),
       "give a positive patch size no larger than sample_size");
  need(c.sample_height >= c.patch_size && c.sample_width >= c.patch_size && c.sample_height % c.patch_size == 0 &&
           c.sample_width % c.patch_size == 0,
       "latents of " + std::to_string(c.sample_height) + " x " + std::to_string(c.sample_width) + " for patches of " +
           std::to_string(c.patch_size),
       "use latents whose height and width divide by " + std::to_string(c.patch_size));
  need(c.interpolation_scale >= 0.0, "interpolation_scale " + std::to_string(c.interpolation_scale),
       "give a positive interpolation_scale, or null for diffusers' default");
  need(c.norm_eps > 0.f, "norm_eps " + std::to_string(c.norm_eps), "give a positive norm_eps (PixArt: 1e-6)");
  need(c.context_length > 0, "a caption of " + std::to_string(c.context_length) + " tokens",
       "give the caption tokens per record (PixArt-alpha: 120, Sigma: 300)");
}

namespace detail {

// The squared error of the first `used` columns of each prediction row
// against targets [rows, used]; the other columns get no gradient.
template <class T>
struct LeadingSquaredRowLoss {
  MatView<const T> pred;
  const float* target;
  const float* weight;  // null: every row weighs 1
  std::int64_t used;
  std::size_t work_per_index() const { return static_cast<std::size_t>(used); }
  DTRAIN_HOST_DEVICE double operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    double s = 0.0;
    for (std::int64_t c = 0; c < used; ++c) {
      const double d = static_cast<double>(static_cast<float>(pred(r, c)) - target[r * used + c]);
      s += d * d;
    }
    return weight ? s * weight[r] : s;
  }
};

template <class T>
struct LeadingSquaredGrad {
  MatView<const T> pred;
  const float* target;
  const float* weight;
  MatView<T> dpred;
  std::int64_t used;
  float scale;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t r = idx / pred.cols, c = idx % pred.cols;
    const float w = weight ? weight[r] * scale : scale;
    dpred.data[i] = c < used ? dtype_cast<T>(2.f * (static_cast<float>(pred.data[i]) - target[r * used + c]) * w)
                             : dtype_cast<T>(0.f);
  }
};

}  // namespace detail

// The mean squared error of the first `used_columns` values of each
// prediction row (all of them when 0) against "y" [B, used]: nn::MSELoss's
// reduction (the normaliser counts the targets, or weight x used per
// record with a weight tensor).
class PixArtLoss {
 public:
  PixArtLoss() = default;
  explicit PixArtLoss(std::int64_t used_columns, std::string target = "y", std::string weight = "")
      : used_(used_columns), target_(std::move(target)), weight_(std::move(weight)) {}

  std::int64_t used_columns() const noexcept { return used_; }

  double count(const Batch& batch) const {
    const HostTensor& t = batch.at(target_);
    if (weight_.empty()) return static_cast<double>(t.numel());
    double w = 0;
    for (const float v : batch.at(weight_).values<float>()) w += v;
    return w * static_cast<double>(t.numel() / std::max<std::int64_t>(t.dim(0), 1));
  }

  template <class Dev, class T>
  double forward(Dev& dev, MatView<const T> pred, const DeviceBatch& batch) {
    const auto [target, weight, used] = inputs(pred, batch);
    return dev.sum(static_cast<std::size_t>(pred.rows), detail::LeadingSquaredRowLoss<T>{pred, target, weight, used});
  }

  template <class Dev, class T>
  void backward(Dev& dev, MatView<const T> pred, const DeviceBatch& batch, MatView<T> dpred, float scale) {
    nn::detail::check_shape("models::PixArtLoss", "prediction gradient", dpred, pred.rows, pred.cols);
    const auto [target, weight, used] = inputs(pred, batch);
    dev.for_each(static_cast<std::size_t>(pred.size()),
                 detail::LeadingSquaredGrad<T>{pred, target, weight, dpred, used, scale});
  }

 private:
  struct Inputs {
    const float* target;
    const float* weight;
    std::int64_t used;
  };

  template <class T>
  Inputs inputs(MatView<const T> pred, const DeviceBatch& batch) const {
    const std::int64_t used = used_ > 0 ? used_ : pred.cols;
    const DeviceTensor* t = batch.find(target_);
    const std::string fix = "give \"" + target_ + "\" float [B, " + std::to_string(used) + "]: the first " +
                            std::to_string(used) + " predicted values of each record" +
                            (used < pred.cols ? " (the learned variance's channels are not trained on)" : "");
    if (t == nullptr) throw config_error("models::PixArtLoss: the batch has no \"" + target_ + "\"", fix);
    if (t->type != element_type::f32 || t->numel() != pred.rows * used)
      throw config_error("models::PixArtLoss: \"" + target_ + "\" is " + shape_text(t->shape) + " " +
                             std::string(element_name(t->type)) + " for " + std::to_string(pred.rows) +
                             " predictions of " + std::to_string(pred.cols) + " values",
                         fix);
    const float* weight = nullptr;
    if (!weight_.empty()) {
      const DeviceTensor* w = batch.find(weight_);
      if (w == nullptr || w->type != element_type::f32 || w->numel() != pred.rows)
        throw config_error("models::PixArtLoss: \"" + weight_ + "\" does not hold one float weight for each of " +
                               std::to_string(pred.rows) + " records",
                           "give \"" + weight_ + "\" float [B]");
      weight = w->data<float>();
    }
    return {t->data<float>(), weight, used};
  }

  std::int64_t used_ = 0;
  std::string target_ = "y", weight_;
};

// One unit of PixArt.
using PixArtUnit = nn::OneOf<nn::PixArtInput, nn::PixArtBlock, nn::PixArtOutput>;

struct PixArt {
  static constexpr nn::PixArtLanes lanes{};

  explicit PixArt(const PixArtConfig& c)
      : config((check_pixart_config(c), c)),
        loss(c.learned_sigma() ? c.in_channels * c.sample_height * c.sample_width : 0) {
    build();
  }

  PixArtConfig config;
  std::vector<PixArtUnit> layers;
  std::vector<std::string> prefixes;  // diffusers' module of each unit ("" for the top level)
  PixArtLoss loss;

  auto units() { return std::tie(layers); }
  std::size_t unit_count() const { return layers.size(); }

  std::int64_t input_features() const { return config.in_channels * config.sample_height * config.sample_width; }
  std::int64_t output_features() const { return config.out_channels * config.sample_height * config.sample_width; }
  // The target's values per record: the first in_channels channels with a learned variance.
  std::int64_t target_features() const {
    return (config.learned_sigma() ? config.in_channels : config.out_channels) * config.sample_height *
           config.sample_width;
  }

  // diffusers' state-dict key of unit `unit`'s parameter `param`.
  std::string diffusers_name(std::size_t unit, std::string_view param) const {
    if (unit >= prefixes.size())
      throw config_error(
          "models::PixArt::diffusers_name: unit " + std::to_string(unit) + " of " + std::to_string(prefixes.size()),
          "number the units from 0 to unit_count() - 1");
    return prefixes[unit].empty() ? std::string(param) : prefixes[unit] + "." + std::string(param);
  }

 private:
  void build() {
    const PixArtConfig& c = config;
    const nn::Extent2 latents{c.sample_height, c.sample_width};
    const std::int64_t D = c.inner_dim();
    nn::PixArtInput input(c.in_channels, D, latents,
                          {.patch_size = c.patch_size,
                           .base_size = c.sample_size / c.patch_size,
                           .interpolation_scale = c.interpolation(),
                           .caption_channels = c.caption_channels,
                           .context_length = c.context_length,
                           .lanes = lanes});
    const std::int64_t tokens = input.tokens();
    layers.emplace_back(std::move(input));
    prefixes.emplace_back();
    for (std::int64_t i = 0; i < c.num_layers; ++i) {
      layers.emplace_back(
          nn::PixArtBlock(c.num_attention_heads, c.attention_head_dim, tokens,
                          {.context_length = c.context_length, .norm_eps = c.norm_eps, .lanes = lanes}));
      prefixes.push_back("transformer_blocks." + std::to_string(i));
    }
    layers.emplace_back(nn::PixArtOutput(D, c.out_channels, latents, c.patch_size, {.lanes = lanes}));
    prefixes.emplace_back();
  }
};

}  // namespace dtrain::models
