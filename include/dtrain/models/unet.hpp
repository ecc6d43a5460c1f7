#pragma once
// models::UNet2DCondition: diffusers' UNet2DConditionModel (Stable Diffusion
// 1.x/2.x, SDXL) as a dtrain model, configured like diffusers' config.json
// (models::UNetConfig; read from and written to a diffusers directory by
// diffusion/unet.hpp), for latents of one size.
//
//   units   nn::TimestepInput (conv_in, the time embedding, SDXL's
//           add_embedding; writes the time embedding to lane 0), then the
//           down blocks (nn::ResnetBlock2D, nn::SpatialTransformer in the
//           cross-attention blocks, a stride-2 nn::Conv2d downsampler), the
//           mid block, the up blocks (nn::ConcatLane of the matching skip
//           before every ResNet block, nn::Upsample2d + nn::Conv2d
//           upsamplers), conv_norm_out (nn::GroupNorm), SiLU, conv_out.
//           Every output the up path reads is kept by an nn::WriteLane
//           (lanes 1, 2, ...), the way diffusers' down blocks return their
//           res_samples.
//   loss    nn::MSELoss against the batch's "y" (the noise, the velocity or
//           the flow target, diffusion/schedule.hpp), weighted per record by
//           "weight" when given (min-SNR)
//   batch   x float [B, in_channels, h, w] (the noisy latents), "timesteps"
//           float [B], "encoder_hidden_states" float [B, context_length,
//           cross_attention_dim]; SDXL also "pooled" [B, pooled_dim] and
//           "time_ids" [B, 6]; y float [B, out_channels * h * w]
//   output  one row per record: the prediction [out_channels, h, w]
//
// Names: unit i's parameter p is diffusers' `diffusers_name(i, p)`
// ("down_blocks.1.attentions.0.proj_in.weight", "conv_out.bias").
//
// LoRA (hf::LoraConfig, as PEFT configures it on a diffusers UNet): the
// targets are matched against the module names of the projections
// dtrain adapts, each transformer block's attn1/attn2 to_q, to_k, to_v,
// to_out.0 and ff.net.0.proj, ff.net.2, and the attention blocks' proj_in
// and proj_out when they are Linear (use_linear_projection), the way PEFT
// matches target_modules: the whole name or a suffix after a dot
// ("to_q", "attn2.to_k", "mid_block.attentions.0.transformer_blocks.0.
// attn1.to_q"), or one regular expression over whole names (`regex`).
// Convolutions, the ResNet blocks' time_emb_proj and the time embedding
// take no adapters ("all-linear" is refused: in PEFT it takes those too).
// With adapters every other parameter is frozen; `adapted` lists the
// adapted modules by their diffusers names. Within one attention block the
// blocks' projections are adapted alike (SDXL's 2 or 10 layers).
//
// The units' GPU path is compiled but has not run on a GPU: with a GPU
// device they need DTRAIN_GPU_VISION=on (docs/gpu.md).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/hf/lora.hpp"
#include "dtrain/io/pattern.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/any_unit.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/diffusion_units.hpp"
#include "dtrain/nn/lanes.hpp"
#include "dtrain/nn/regression_loss.hpp"
#include "dtrain/nn/spatial_transformer.hpp"
#include "dtrain/nn/unet_units.hpp"

namespace dtrain::models {

// diffusers' UNet2DConditionModel config, the keys dtrain builds from
// (diffusers' names and defaults; per-block lists hold one value for every
// block or one per block, as diffusers accepts).
struct UNetConfig {
  std::int64_t in_channels = 4;
  std::int64_t out_channels = 4;
  std::vector<std::string> down_block_types{"CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                            "DownBlock2D"};
  std::string mid_block_type = "UNetMidBlock2DCrossAttn";  // or "" (no mid block)
  std::vector<std::string> up_block_types{"UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                                          "CrossAttnUpBlock2D"};
  std::vector<std::int64_t> block_out_channels{320, 640, 1280, 1280};
  std::vector<std::int64_t> layers_per_block{2};
  std::int64_t norm_num_groups = 32;
  float norm_eps = 1e-5f;
  std::int64_t cross_attention_dim = 1280;
  std::vector<std::int64_t> transformer_layers_per_block{1};
  // Heads per block: num_attention_heads, or (diffusers' historical naming)
  // attention_head_dim when num_attention_heads is null; head_dim is the
  // block's channels / heads.
  std::vector<std::int64_t> attention_heads{8};
  bool use_linear_projection = false;
  bool flip_sin_to_cos = true;
  double freq_shift = 0.0;
  float mid_block_scale_factor = 1.f;
  // SDXL: addition_embed_type "text_time"; the pooled text embedding is
  // projection_class_embeddings_input_dim - 6 x addition_time_embed_dim wide.
  std::string addition_embed_type;
  std::int64_t addition_time_embed_dim = 256;
  std::int64_t projection_class_embeddings_input_dim = 0;
  // The latents' size the model is built for (sample_size by default), and
  // the text tokens per record.
  std::int64_t sample_height = 64;
  std::int64_t sample_width = 64;
  std::int64_t context_length = 77;
};

namespace detail {

// A per-block list of `blocks` values: one value repeated, or one per block.
inline std::vector<std::int64_t> per_block(const std::vector<std::int64_t>& v, std::size_t blocks,
                                           const std::string& key) {
  if (v.size() == 1) return std::vector<std::int64_t>(blocks, v[0]);
  if (v.size() == blocks) return v;
  throw config_error("UNet config: " + key + " has " + std::to_string(v.size()) + " values for " +
                         std::to_string(blocks) + " down blocks",
                     "give one value, or one per block");
}

}  // namespace detail

// Checks a config dtrain can build, naming what it cannot.
inline void check_unet_config(const UNetConfig& c) {
  const auto need = [](bool ok, const std::string& what, const std::string& fix) {
    if (!ok) throw config_error("UNet config: " + what, fix);
  };
  const std::size_t n = c.block_out_channels.size();
  need(n >= 1, "block_out_channels is empty", "give one channel count per block");
  need(c.down_block_types.size() == n && c.up_block_types.size() == n,
       std::to_string(c.down_block_types.size()) + " down and " + std::to_string(c.up_block_types.size()) +
           " up blocks for " + std::to_string(n) + " block_out_channels",
       "give as many down and up block types as block_out_channels");
  for (const auto& t : c.down_block_types)
    need(t == "CrossAttnDownBlock2D" || t == "DownBlock2D", "down block type \"" + t + "\" is not supported",
         "use CrossAttnDownBlock2D or DownBlock2D (Stable Diffusion's and SDXL's)");
  for (const auto& t : c.up_block_types)
    need(t == "CrossAttnUpBlock2D" || t == "UpBlock2D", "up block type \"" + t + "\" is not supported",
         "use CrossAttnUpBlock2D or UpBlock2D (Stable Diffusion's and SDXL's)");
  need(c.mid_block_type.empty() || c.mid_block_type == "UNetMidBlock2DCrossAttn",
       "mid_block_type \"" + c.mid_block_type + "\" is not supported", "use UNetMidBlock2DCrossAttn or null");
  need(c.addition_embed_type.empty() || c.addition_embed_type == "text_time",
       "addition_embed_type \"" + c.addition_embed_type + "\" is not supported", "use text_time (SDXL's) or null");
  if (c.addition_embed_type == "text_time")
    need(c.projection_class_embeddings_input_dim > 6 * c.addition_time_embed_dim,
         "projection_class_embeddings_input_dim " + std::to_string(c.projection_class_embeddings_input_dim) +
             " leaves no room for the pooled text embedding beside 6 time ids of " +
             std::to_string(c.addition_time_embed_dim),
         "give SDXL's 2816 with addition_time_embed_dim 256 (a pooled embedding of 1280)");
  for (std::int64_t ch : c.block_out_channels)
    need(ch > 0 && ch % c.norm_num_groups == 0,
         "block_out_channels " + std::to_string(ch) + " is not a multiple of norm_num_groups " +
             std::to_string(c.norm_num_groups),
         "use channel counts the group norm divides (diffusers requires it too)");
  const auto heads = detail::per_block(c.attention_heads, n, "num_attention_heads");
  for (std::size_t i = 0; i < n; ++i)
    need(heads[i] > 0 && c.block_out_channels[i] % heads[i] == 0,
         "block " + std::to_string(i) + "'s " + std::to_string(c.block_out_channels[i]) +
             " channels do not split into " + std::to_string(heads[i]) + " heads",
         "give a head count that divides the block's channels");
  detail::per_block(c.layers_per_block, n, "layers_per_block");
  detail::per_block(c.transformer_layers_per_block, n, "transformer_layers_per_block");
  const std::int64_t scale = std::int64_t{1} << (n - 1);
  need(c.sample_height > 0 && c.sample_width > 0 && c.sample_height % scale == 0 && c.sample_width % scale == 0,
       "latents of " + std::to_string(c.sample_height) + " x " + std::to_string(c.sample_width) + " for " +
           std::to_string(n - 1) + " downsamplings",
       "use latents whose height and width divide by " + std::to_string(scale));
  need(c.context_length > 0 && c.cross_attention_dim > 0,
       "a text context of " + std::to_string(c.context_length) + " tokens of " + std::to_string(c.cross_attention_dim),
       "give positive sizes (Stable Diffusion: 77 tokens)");
}

// One unit of the UNet.
using UNetUnit = nn::OneOf<nn::TimestepInput, nn::ResnetBlock2D, nn::SpatialTransformer, nn::WriteLane, nn::ConcatLane,
                           nn::Conv2d, nn::Upsample2d, nn::GroupNorm, nn::SiLU>;

struct UNet2DCondition {
  static constexpr int temb_lane = 0;

  explicit UNet2DCondition(const UNetConfig& c, hf::LoraConfig adapters = {})
      : config((check_unet_config(c), c)), lora(std::move(adapters)) {
    build();
  }

  UNetConfig config;
  hf::LoraConfig lora;               // the adapters (r 0: none, every parameter trains)
  std::vector<std::string> adapted;  // the adapted modules' diffusers names, in unit order
  std::vector<UNetUnit> layers;
  std::vector<std::string> prefixes;  // diffusers' module of each unit ("" for none)
  nn::MSELoss loss;

  auto units() { return std::tie(layers); }
  std::size_t unit_count() const { return layers.size(); }

  std::int64_t input_features() const { return config.in_channels * config.sample_height * config.sample_width; }
  std::int64_t output_features() const { return config.out_channels * config.sample_height * config.sample_width; }

  // diffusers' state-dict key of unit `unit`'s parameter `param`.
  std::string diffusers_name(std::size_t unit, std::string_view param) const {
    if (unit >= prefixes.size())
      throw config_error("models::UNet2DCondition::diffusers_name: unit " + std::to_string(unit) + " of " +
                             std::to_string(prefixes.size()),
                         "number the units from 0 to unit_count() - 1");
    return prefixes[unit].empty() ? std::string(param) : prefixes[unit] + "." + std::string(param);
  }

 private:
  struct Skip {
    int lane;
    std::int64_t channels;
  };

  template <class U>
  void add(U unit, std::string prefix) {
    layers.emplace_back(std::move(unit));
    prefixes.push_back(std::move(prefix));
  }

  // The LoRA targets resolved, one attention block at a time.
  struct LoraTargets {
    const hf::LoraConfig& lora;
    std::optional<RegexPattern> pattern;
    std::map<std::string, std::size_t> hits;  // per target

    explicit LoraTargets(const hf::LoraConfig& l) : lora(l) {
      if (l.r < 0) throw config_error("lora_r " + std::to_string(l.r) + " is negative", "give lora_r >= 1");
      if (!l.on()) return;
      const std::string fix =
          "give lora_targets=to_q,to_k,to_v,to_out.0 (diffusers' LoRA scripts), and ff.net.0.proj,ff.net.2 for the "
          "feed-forward";
      if (l.targets.empty()) throw config_error("LoRA on the UNet needs target modules", fix);
      if (!l.modules_to_save.empty())
        throw config_error("LoRA modules_to_save on a UNet are not supported",
                           "train the adapters alone, or fine-tune the whole UNet (lora_r=0)");
      if (l.regex && l.targets.size() != 1)
        throw config_error("a regular expression target is one pattern, not " + std::to_string(l.targets.size()),
                           "give one pattern, or a list of module names");
      if (!l.regex && std::find(l.targets.begin(), l.targets.end(), "all-linear") != l.targets.end())
        throw config_error(
            "LoRA target all-linear would adapt the ResNet blocks' time_emb_proj and the time "
            "embedding, which dtrain does not adapt",
            fix);
      if (l.regex) pattern.emplace(l.targets[0]);
    }

    bool matches(const std::string& module) {
      bool any = false;
      for (const auto& t : lora.targets)
        if (pattern ? pattern->full_match(module) : hf::detail::names_module(t, module)) {
          ++hits[t];
          any = true;
        }
      return any;
    }

    // The projections of an attention block `prefix` of `layers`
    // transformer blocks that take adapters; their modules go to `adapted`.
    std::vector<std::string> of(const std::string& prefix, std::int64_t layers, bool linear_projection,
                                std::vector<std::string>& adapted) {
      std::vector<std::string> names;
      if (!lora.on()) return names;
      static const char* const inside[] = {"attn1.to_q", "attn1.to_k", "attn1.to_v",     "attn1.to_out.0", "attn2.to_q",
                                           "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ff.net.0.proj",  "ff.net.2"};
      for (const char* name : inside) {
        std::int64_t on = 0;
        for (std::int64_t l = 0; l < layers; ++l) {
          const std::string module = prefix + ".transformer_blocks." + std::to_string(l) + "." + name;
          if (matches(module)) {
            ++on;
            adapted.push_back(module);
          }
        }
        if (on == 0) continue;
        if (on != layers)
          throw config_error("the LoRA targets adapt " + std::string(name) + " in " + std::to_string(on) + " of " +
                                 prefix + "'s " + std::to_string(layers) + " transformer blocks",
                             "adapt a projection in every block of an attention block (a suffix such as \"" +
                                 std::string(name) + "\" does)");
        names.emplace_back(name);
      }
      for (const char* name : {"proj_in", "proj_out"}) {
        const std::string module = prefix + "." + name;
        if (!matches(module)) continue;
        if (!linear_projection)
          throw config_error("LoRA target " + module + " is a 1x1 convolution (use_linear_projection false)",
                             "leave proj_in and proj_out out of the targets: convolutions take no adapters in dtrain");
        adapted.push_back(module);
        names.emplace_back(name);
      }
      return names;
    }

    // Every target must have matched a projection dtrain adapts.
    void check_all_used() const {
      if (!lora.on()) return;
      for (const auto& t : lora.targets)
        if (!hits.contains(t))
          throw config_error("LoRA target \"" + t + "\" matches no projection dtrain adapts in this UNet",
                             "name attention or feed-forward projections (to_q, to_k, to_v, to_out.0, ff.net.0.proj, "
                             "ff.net.2; proj_in and proj_out where they are Linear): convolutions, time_emb_proj and "
                             "the time embedding take no adapters");
    }
  };

  void build() {
    const UNetConfig& c = config;
    const bool trainable = !lora.on();
    LoraTargets targets(lora);
    const std::size_t n = c.block_out_channels.size();
    const auto heads = detail::per_block(c.attention_heads, n, "num_attention_heads");
    const auto layers_per = detail::per_block(c.layers_per_block, n, "layers_per_block");
    const auto transformer_layers =
        detail::per_block(c.transformer_layers_per_block, n, "transformer_layers_per_block");
    const std::int64_t temb_dim = 4 * c.block_out_channels[0];
    nn::Extent2 ext{c.sample_height, c.sample_width};
    const bool text_time = c.addition_embed_type == "text_time";
    add(nn::TimestepInput(
            c.in_channels, c.block_out_channels[0], ext,
            {.temb_lane = temb_lane,
             .temb_dim = temb_dim,
             .flip_sin_to_cos = c.flip_sin_to_cos,
             .freq_shift = c.freq_shift,
             .text_time = text_time,
             .text = {.pooled_dim = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim,
                      .time_ids = 6,
                      .time_embed_dim = c.addition_time_embed_dim},
             .trainable = trainable}),
        "");
    std::vector<Skip> skips;
    int next_lane = temb_lane + 1;
    const auto keep = [&](std::int64_t channels) {
      add(nn::WriteLane(next_lane), "");
      skips.push_back({next_lane++, channels});
    };
    const auto resnet = [&](std::int64_t in, std::int64_t out, nn::Extent2 e, float scale) {
      return nn::ResnetBlock2D(in, out, e,
                               {.temb_lane = temb_lane,
                                .temb_dim = temb_dim,
                                .groups = c.norm_num_groups,
                                .eps = c.norm_eps,
                                .output_scale_factor = scale,
                                .trainable = trainable});
    };
    const auto attention = [&](std::int64_t channels, std::int64_t h, std::int64_t layers_n, nn::Extent2 e,
                               const std::string& prefix) {
      std::vector<std::string> adapters = targets.of(prefix, layers_n, c.use_linear_projection, adapted);
      const nn::LoraOptions rank = adapters.empty() ? nn::LoraOptions{} : lora.options();
      return nn::SpatialTransformer(channels, h, channels / h, c.cross_attention_dim, e,
                                    {.layers = layers_n,
                                     .use_linear_projection = c.use_linear_projection,
                                     .groups = c.norm_num_groups,
                                     .context_length = c.context_length,
                                     .layer_norm_eps = 1e-5f,
                                     .trainable = trainable,
                                     .lora = rank,
                                     .lora_targets = std::move(adapters)});
    };
    std::int64_t ch = c.block_out_channels[0];
    keep(ch);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string block = "down_blocks." + std::to_string(i);
      const std::int64_t out = c.block_out_channels[i];
      const bool cross = c.down_block_types[i] == "CrossAttnDownBlock2D";
      for (std::int64_t j = 0; j < layers_per[i]; ++j) {
        add(resnet(ch, out, ext, 1.f), block + ".resnets." + std::to_string(j));
        ch = out;
        if (cross)
          add(attention(out, heads[i], transformer_layers[i], ext, block + ".attentions." + std::to_string(j)),
              block + ".attentions." + std::to_string(j));
        keep(out);
      }
      if (i + 1 < n) {
        nn::Conv2d down(out, out, {3, 3}, ext, {.stride = {2, 2}, .padding = {1, 1}, .trainable = trainable});
        ext = {down.out_h(), down.out_w()};
        add(std::move(down), block + ".downsamplers.0.conv");
        keep(out);
      }
    }
    if (!c.mid_block_type.empty()) {
      add(resnet(ch, ch, ext, c.mid_block_scale_factor), "mid_block.resnets.0");
      add(attention(ch, heads[n - 1], transformer_layers[n - 1], ext, "mid_block.attentions.0"),
          "mid_block.attentions.0");
      add(resnet(ch, ch, ext, c.mid_block_scale_factor), "mid_block.resnets.1");
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t r = n - 1 - i;  // the matching down block
      const std::string block = "up_blocks." + std::to_string(i);
      const std::int64_t out = c.block_out_channels[r];
      const bool cross = c.up_block_types[i] == "CrossAttnUpBlock2D";
      for (std::int64_t j = 0; j <= layers_per[r]; ++j) {
        const Skip s = skips.back();
        skips.pop_back();
        add(nn::ConcatLane(s.lane, s.channels * ext.h * ext.w), "");
        add(resnet(ch + s.channels, out, ext, 1.f), block + ".resnets." + std::to_string(j));
        ch = out;
        if (cross)
          add(attention(out, heads[r], transformer_layers[r], ext, block + ".attentions." + std::to_string(j)),
              block + ".attentions." + std::to_string(j));
      }
      if (i + 1 < n) {
        add(nn::Upsample2d(out, ext, 2), "");
        ext = {2 * ext.h, 2 * ext.w};
        add(nn::Conv2d(out, out, {3, 3}, ext, {.padding = {1, 1}, .trainable = trainable}),
            block + ".upsamplers.0.conv");
      }
    }
    add(nn::GroupNorm(c.norm_num_groups, ch, ext, {.eps = c.norm_eps, .trainable = trainable}), "conv_norm_out");
    add(nn::SiLU{}, "");
    add(nn::Conv2d(ch, c.out_channels, {3, 3}, ext, {.padding = {1, 1}, .trainable = trainable}), "conv_out");
    targets.check_all_used();
  }
};

}  // namespace dtrain::models
