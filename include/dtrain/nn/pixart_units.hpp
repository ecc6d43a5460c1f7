#pragma once
// The units of diffusers' PixArtTransformer2DModel (PixArt-alpha, PixArt-
// Sigma), with diffusers' parameter names; models::PixArt (models/pixart.hpp)
// chains them:
//
//  - nn::PixArtInput(latent_channels, dim, latents, options): the model's
//    first unit. Over the batch's noisy latents x [B, C * H * W] (NCHW rows):
//      tokens = pos_embed.proj(x)            Conv2d kernel = stride = patch,
//                                            the h x w patches as T = h w rows
//                                            of dim (row i * w + j)
//               + pos(t)                     diffusers' fixed 2-D sin-cos
//                                            embedding (get_2d_sincos_pos_embed),
//                                            computed in double, no parameter
//      caption = linear_2(gelu_tanh(linear_1(batch "encoder_hidden_states")))
//                                            caption_projection, per text token
//      emb     = linear_2(silu(linear_1(sinusoid(batch "timesteps"))))
//                                            adaln_single.emb.timestep_embedder,
//                                            256 sinusoid channels, flip_sin_to_cos,
//                                            shift 0 (nn::get_timestep_embedding)
//      t6      = adaln_single.linear(silu(emb))   [B, 6 dim]
//    The row output is the token sequence [B, T * dim]; caption [B, L * dim],
//    t6 [B, 6 dim] and emb [B, dim] are written to lanes (model/unit.hpp)
//    options.caption_lane, modulation_lane and timestep_lane.
//    pos(t, c) for token t = i * w + j, with dim / 4 frequencies
//    omega_k = 10000^(-k / (dim / 4)) and the grid positions
//    gj = j / (w / base_size) / interpolation_scale (gi likewise with h):
//    columns [0, dim / 2) embed gj, [dim / 2, dim) embed gi, each half
//    [sin(g omega_k) | cos(g omega_k)] (diffusers' meshgrid puts the column
//    position first).
//    params pos_embed.proj.{weight [dim, C, p, p], bias},
//           caption_projection.linear_1.* [dim, caption_channels],
//           caption_projection.linear_2.* [dim, dim],
//           adaln_single.emb.timestep_embedder.linear_1.* [dim, 256],
//           adaln_single.emb.timestep_embedder.linear_2.* [dim, dim],
//           adaln_single.linear.* [6 dim, dim]
//    Batch: "x" float [B, C, H, W] (or [B, C * H * W]), "timesteps" float
//    [B], "encoder_hidden_states" [B, context_length, caption_channels]
//    (float32, bf16 or fp16).
//
//  - nn::PixArtBlock(heads, head_dim, tokens, options): diffusers'
//    BasicTransformerBlock with norm_type "ada_norm_single", over
//    x [B, T * dim], dim = heads * head_dim, per token row:
//      shift1 | scale1 | gate1 | shift2 | scale2 | gate2
//             = scale_shift_table [6, dim] + t6 (the modulation lane)
//      u1 = x + gate1 * attn1(norm1(x) * (1 + scale1) + shift1)
//      u2 = u1 + attn2(u1, caption)            (no norm before attn2: PixArt's)
//      y  = u2 + gate2 * ff.net.2(gelu_tanh(ff.net.0.proj(
//                                  norm2(u2) * (1 + scale2) + shift2)))
//    norm1, norm2 LayerNorms without affine parameters (eps norm_eps);
//    attn1 nn::Attention<Bidirectional, SeparateQkv, SelfInput>, attn2
//    <..., CrossInput> over the caption lane: heads of head_dim, q/k/v and
//    the output projection with biases (attention_bias). The batch's
//    "encoder_attention_mask" [B, context_length] (int32 or int64, 1: a
//    token, 0: padding) leaves padded caption tokens out of attn2, as
//    diffusers' -10000 bias does; the self-attention reads no mask. The
//    feed-forward is 4 dim wide.
//    params attn1.to_q.weight, to_k.weight, to_v.weight, to_out.0.weight
//           [dim, dim], then to_q.bias, to_k.bias, to_v.bias, to_out.0.bias;
//           attn2.* the same; ff.net.0.proj.{weight [4 dim, dim], bias},
//           ff.net.2.{weight [dim, 4 dim], bias}; scale_shift_table [6, dim]
//
//  - nn::PixArtOutput(dim, out_channels, latents, patch, options): norm_out
//    (LayerNorm without affine, eps 1e-6), shift | scale = scale_shift_table
//    [2, dim] + emb (the timestep lane, added to both rows), z =
//    proj_out(norm_out(x) * (1 + scale) + shift) [T, p p out_channels] per
//    record, unpatchified as diffusers does (token i * w + j, column
//    (r * p + q) * out_channels + c is pixel (c, i p + r, j p + q)): the
//    prediction [B, out_channels * H * W], NCHW.
//    params scale_shift_table [2, dim], proj_out.{weight [p p out, dim], bias}
//
// Saved (ctx.saved; N = B T token rows, D = dim, F = 4 D, L =
// context_length, K = caption_channels):
//   input   B (L K + 3 L D + 256 + 5 D + D T): the caption, linear_1's output
//           and its GELU, a gradient scratch, the sinusoids, the timestep
//           MLPs' activations and scratch, the convolution's NCHW output
//   block   12 B D + 11 N D + 3 N F + B L D + the attentions' own (attn1
//           4 N D + B heads T^2, attn2 2 N D + 2 B L D + B heads T L): the
//           modulation and its gradient, the norms' normalised inputs and
//           modulated outputs, attn1's output, the residual sums, the
//           feed-forward's activations, and the gradient scratch (three
//           N D, one N F, the caption's B L D)
//   output  B (4 D + T p p out_channels) + 2 N D
//
// Backward is exact and overwrites every parameter gradient (skipping the
// empty ones of frozen parameters); the readers of the lanes ADD their
// gradient into the lanes' (the caption's and the modulation's from every
// block, the embedded timestep's from the output unit), which nn::PixArtInput
// carries back into the caption projection and the timestep MLPs. Dropout
// is not modelled (diffusers' default 0).
//
// On a GPU the units run only with DTRAIN_GPU_VISION=on (and their
// attentions with DTRAIN_GPU_ATTENTION=on): compiled, not yet run there.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/attention_policies.hpp"
#include "dtrain/nn/batch_inputs.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/diffusion_units.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/spatial_transformer.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::nn {

namespace detail {

// diffusers' get_2d_sincos_pos_embed for a grid of gh x gw patches: the
// value of token t = i * gw + j, column c, in double (see above).
struct PixArtPositions {
  std::int64_t gh, gw, dim;
  double base_size, interpolation_scale;
  DTRAIN_HOST_DEVICE double value(std::int64_t t, std::int64_t c) const {
    const std::int64_t half = dim / 2, quarter = dim / 4;
    const bool column = c < half;  // the first half embeds the column position
    const std::int64_t k = c % half, f = k % quarter;
    const double g = column ? static_cast<double>(t % gw) / (static_cast<double>(gw) / base_size) / interpolation_scale
                            : static_cast<double>(t / gw) / (static_cast<double>(gh) / base_size) / interpolation_scale;
    const double omega = 1.0 / ::pow(10000.0, static_cast<double>(f) / static_cast<double>(quarter));
    const double a = g * omega;
    return k < quarter ? ::sin(a) : ::cos(a);
  }
};

// tokens [B T, D] = the convolution's NCHW output [B, D, T] as rows, plus
// the position embedding (summed in double, rounded once). Run over B T D.
template <Dtype T>
struct PatchTokens {
  const T* conv;
  T* tokens;
  PixArtPositions pos;
  std::int64_t count;  // T, the tokens per record
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t c = idx % pos.dim, t = (idx / pos.dim) % count, b = idx / (pos.dim * count);
    const double v = static_cast<double>(static_cast<float>(conv[(b * pos.dim + c) * count + t])) + pos.value(t, c);
    tokens[idx] = dtype_cast<T>(static_cast<float>(v));
  }
};

// out[b, j] = table[j] + lane[b, j % lane_width] over [B, width] (width a
// multiple of lane_width): a modulation table plus each record's timestep
// conditioning. Run over B * width.
template <Dtype T>
struct AddTable {
  const T* table;
  const T* lane;
  T* out;
  std::int64_t width, lane_width;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t b = idx / width, j = idx % width;
    out[idx] = dtype_cast<T>(static_cast<float>(table[j]) + static_cast<float>(lane[b * lane_width + j % lane_width]));
  }
};

// Its gradients: dtable[j] = the sum over records of dmod[b, j] (run over
// width), and lane_grad[b, c] += the sum of dmod[b, k lane_width + c] over k
// (run over B * lane_width).
template <Dtype T>
struct TableGrad {
  const T* dmod;
  T* dtable;
  std::int64_t records, width;
  std::size_t work_per_index() const { return static_cast<std::size_t>(records); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto j = static_cast<std::int64_t>(i);
    double s = 0.0;
    for (std::int64_t b = 0; b < records; ++b) s += static_cast<double>(static_cast<float>(dmod[b * width + j]));
    dtable[j] = dtype_cast<T>(static_cast<float>(s));
  }
};

template <Dtype T>
struct FoldIntoLane {
  const T* dmod;
  T* lane_grad;
  std::int64_t width, lane_width;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t b = idx / lane_width, c = idx % lane_width;
    float s = static_cast<float>(lane_grad[idx]);
    for (std::int64_t k = 0; k < width / lane_width; ++k) s += static_cast<float>(dmod[b * width + k * lane_width + c]);
    lane_grad[idx] = dtype_cast<T>(s);
  }
};

// Where one modulation's rows are: record b's shift, scale or gate over the
// D columns is mod[b * stride + at + c], for token rows of `tokens` per record.
template <Dtype T>
struct Modulation {
  const T* mod;
  std::int64_t stride, tokens;
  DTRAIN_HOST_DEVICE float at(std::int64_t row, std::int64_t offset, std::int64_t c) const {
    return static_cast<float>(mod[(row / tokens) * stride + offset + c]);
  }
};

// Row r's mean and 1 / sqrt(variance + eps), in double.
template <Dtype T>
DTRAIN_HOST_DEVICE inline void row_moments(MatView<const T> x, std::int64_t r, float eps, double& mean, double& rstd) {
  const std::int64_t n = x.cols;
  double sum = 0.0, var = 0.0;
  for (std::int64_t c = 0; c < n; ++c) sum += static_cast<double>(static_cast<float>(x(r, c)));
  mean = sum / static_cast<double>(n);
  for (std::int64_t c = 0; c < n; ++c) {
    const double d = static_cast<double>(static_cast<float>(x(r, c))) - mean;
    var += d * d;
  }
  rstd = 1.0 / ::sqrt(var / static_cast<double>(n) + static_cast<double>(eps));
}

// A LayerNorm without affine parameters, then modulated: xhat = (x - mean)
// * rstd (kept), y = xhat * (1 + scale) + shift. The moments in double.
// Run over rows.
template <Dtype T>
struct ModulatedNorm {
  MatView<const T> x;
  Modulation<T> m;
  std::int64_t shift, scale;  // column offsets in the modulation rows
  MatView<T> xhat, y;
  float eps;
  std::size_t work_per_index() const { return static_cast<std::size_t>(x.cols); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    const std::int64_t n = x.cols;
    double mean = 0.0, rstd = 0.0;
    row_moments(x, r, eps, mean, rstd);
    for (std::int64_t c = 0; c < n; ++c) {
      const auto h = static_cast<float>((static_cast<double>(static_cast<float>(x(r, c))) - mean) * rstd);
      xhat(r, c) = dtype_cast<T>(h);
      y(r, c) = dtype_cast<T>(h * (1.f + m.at(r, scale, c)) + m.at(r, shift, c));
    }
  }
};

// Its input gradient from dy (the modulated output's): with g = dy * (1 +
// scale), dx = base + rstd * (g - mean(g) - xhat * mean(g * xhat)); base
// (another path's gradient of x) may be null. Run over rows.
template <Dtype T>
struct ModulatedNormBackward {
  MatView<const T> x, dy;
  Modulation<T> m;
  std::int64_t scale;
  const T* base;
  MatView<T> dx;
  float eps;
  std::size_t work_per_index() const { return static_cast<std::size_t>(3 * x.cols); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    const std::int64_t n = x.cols;
    double mean = 0.0, rstd = 0.0;
    row_moments(x, r, eps, mean, rstd);
    double mean_g = 0.0, mean_gx = 0.0;
    for (std::int64_t c = 0; c < n; ++c) {
      const double g = static_cast<double>(static_cast<float>(dy(r, c))) * (1.0 + m.at(r, scale, c));
      mean_g += g;
      mean_gx += g * (static_cast<double>(static_cast<float>(x(r, c))) - mean) * rstd;
    }
    mean_g /= static_cast<double>(n);
    mean_gx /= static_cast<double>(n);
    for (std::int64_t c = 0; c < n; ++c) {
      const double g = static_cast<double>(static_cast<float>(dy(r, c))) * (1.0 + m.at(r, scale, c));
      const double h = (static_cast<double>(static_cast<float>(x(r, c))) - mean) * rstd;
      double v = rstd * (g - mean_g - h * mean_gx);
      if (base != nullptr) v += static_cast<double>(static_cast<float>(base[r * n + c]));
      dx(r, c) = dtype_cast<T>(static_cast<float>(v));
    }
  }
};

// out = base + gate * a, gate one modulation over the token rows; base may
// be null (out = gate * a: a gated branch's input gradient). Run over rows * D.
template <Dtype T>
struct GatedAdd {
  const T* base;
  const T* a;
  Modulation<T> m;
  std::int64_t gate, dim;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t r = idx / dim, c = idx % dim;
    const float v = m.at(r, gate, c) * static_cast<float>(a[idx]);
    out[idx] = dtype_cast<T>(base != nullptr ? static_cast<float>(base[idx]) + v : v);
  }
};

// Per record and column, the sum over the record's token rows of a (times
// b unless null), in double: a modulation's gradient, into
// out[record * stride + c]. Run over B * D.
template <Dtype T>
struct RecordColumnSums {
  const T* a;
  const T* b;
  T* out;
  std::int64_t tokens, dim, stride;
  std::size_t work_per_index() const { return static_cast<std::size_t>(tokens); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t rec = idx / dim, c = idx % dim;
    double s = 0.0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t e = (rec * tokens + t) * dim + c;
      const double v = static_cast<double>(static_cast<float>(a[e]));
      s += b != nullptr ? v * static_cast<double>(static_cast<float>(b[e])) : v;
    }
    out[rec * stride + c] = dtype_cast<T>(static_cast<float>(s));
  }
};

// proj_out's rows [B T, p p C] <-> the NCHW prediction [B, C, gh p, gw p]
// (to_image: unpatchify). Run over B T p p C.
template <Dtype T>
struct Unpatchify {
  const T* src;
  T* dst;
  std::int64_t gh, gw, patch, channels;
  bool to_image;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);  // an element of the token rows
    const std::int64_t width = patch * patch * channels, tokens = gh * gw;
    const std::int64_t col = idx % width, t = (idx / width) % tokens, b = idx / (width * tokens);
    const std::int64_t c = col % channels, q = (col / channels) % patch, r = col / (channels * patch);
    const std::int64_t y = (t / gw) * patch + r, x = (t % gw) * patch + q;
    const std::int64_t pixel = ((b * channels + c) * gh * patch + y) * gw * patch + x;
    if (to_image)
      dst[pixel] = src[idx];
    else
      dst[idx] = src[pixel];
  }
};

// A batch's float tensor (float32, bf16 or fp16) of `want` shape -> out in T.
template <class Dev, class T>
void load_batch_rows(Dev& dev, const char* unit, const DeviceBatch* batch, const char* name,
                     const std::vector<std::int64_t>& want, T* out, const std::string& fix) {
  const DeviceTensor* t = batch != nullptr ? batch->find(name) : nullptr;
  if (t == nullptr) throw config_error(std::string(unit) + ": the batch has no \"" + name + "\"", fix);
  if (t->shape != want)
    throw config_error(std::string(unit) + ": the batch's " + name + " are " + shape_text(t->shape) +
                           ", the unit reads " + shape_text(want),
                       fix);
  std::size_t n = 1;
  for (const std::int64_t d : want) n *= static_cast<std::size_t>(d);
  switch (t->type) {
    case element_type::f32: return dev.for_each(n, Cast<float, T>{t->data<float>(), out});
    case element_type::bf16: return dev.for_each(n, Cast<bf16, T>{t->data<bf16>(), out});
    case element_type::f16: return dev.for_each(n, Cast<fp16, T>{t->data<fp16>(), out});
    default:
      throw config_error(std::string(unit) + ": the batch's " + name + " hold " + std::string(element_name(t->type)),
                         fix);
  }
}

// A lane checked against the rows and width a unit expects.
template <class T>
MatView<T> pixart_lane(const char* unit, const UnitContext<T>& ctx, int id, std::int64_t rows, std::int64_t width,
                       bool grad) {
  const MatView<T> l = grad ? ctx.lane_grad(id) : ctx.lane(id);
  if (l.rows != rows || l.cols != width)
    throw config_error(std::string(unit) + ": lane " + std::to_string(id) + " is " + std::to_string(l.rows) + " x " +
                           std::to_string(l.cols) + ", " + std::to_string(rows) + " x " + std::to_string(width) +
                           " expected",
                       "put nn::PixArtInput, built for the same width and context length, first in the model");
  return l;
}

}  // namespace detail

// The lanes nn::PixArtInput writes and the other units read.
struct PixArtLanes {
  int caption = 0;     // the projected caption [B, L * dim]
  int modulation = 1;  // adaln_single's output t6 [B, 6 dim]
  int timestep = 2;    // the embedded timestep [B, dim]
};

struct PixArtInputOptions {
  std::int64_t patch_size = 2;
  std::int64_t base_size = 64;           // sample_size / patch_size
  double interpolation_scale = 1.0;      // diffusers' default: max(sample_size / 64, 1)
  std::int64_t caption_channels = 4096;  // the text encoder's width (T5-XXL's)
  std::int64_t context_length = 120;     // text tokens per record (PixArt-alpha: 120, Sigma: 300)
  PixArtLanes lanes{};
};

class PixArtInput {
 public:
  static constexpr std::int64_t timestep_channels = 256;

  // `latents`: the latents' height and width (multiples of the patch size).
  PixArtInput(std::int64_t latent_channels, std::int64_t dim, Extent2 latents, PixArtInputOptions options = {})
      : dim_(checked(latent_channels, dim, latents, options)),
        latents_(latents),
        o_(options),
        proj_(latent_channels, dim, {options.patch_size, options.patch_size}, latents,
              {.stride = {options.patch_size, options.patch_size}}),
        cap1_(options.caption_channels, dim),
        cap2_(dim, dim),
        t1_(timestep_channels, dim),
        t2_(dim, dim),
        ada_(dim, 6 * dim) {}

  std::int64_t dim() const noexcept { return dim_; }
  std::int64_t tokens() const noexcept { return grid_h() * grid_w(); }
  std::int64_t grid_h() const noexcept { return latents_.h / o_.patch_size; }
  std::int64_t grid_w() const noexcept { return latents_.w / o_.patch_size; }
  const PixArtInputOptions& options() const noexcept { return o_; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "pos_embed.proj", proj_.params());
    detail::append_params(out, "caption_projection.linear_1", cap1_.params());
    detail::append_params(out, "caption_projection.linear_2", cap2_.params());
    detail::append_params(out, "adaln_single.emb.timestep_embedder.linear_1", t1_.params());
    detail::append_params(out, "adaln_single.emb.timestep_embedder.linear_2", t2_.params());
    detail::append_params(out, "adaln_single.linear", ada_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const {
    proj_.out_features(in);
    return tokens() * dim_;
  }
  std::vector<LaneSpec> lanes_written(SeqShape in, std::int64_t) const {
    return {{o_.lanes.caption, in.rows(), o_.context_length * dim_},
            {o_.lanes.modulation, in.rows(), 6 * dim_},
            {o_.lanes.timestep, in.rows(), dim_}};
  }
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    const std::int64_t L = o_.context_length;
    return s.rows() * (L * o_.caption_channels + 3 * L * dim_ + timestep_channels + 5 * dim_ + dim_ * tokens());
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::PixArtInput");
    const Parts<T> s = parts(p, x, ctx);
    const std::int64_t B = x.rows, D = dim_;
    detail::check_shape("nn::PixArtInput", "output", y, B, tokens() * D);
    const MatView<T> caption =
        detail::pixart_lane("nn::PixArtInput", ctx, o_.lanes.caption, B, o_.context_length * D, false);
    const MatView<T> t6 = detail::pixart_lane("nn::PixArtInput", ctx, o_.lanes.modulation, B, 6 * D, false);
    const MatView<T> emb = detail::pixart_lane("nn::PixArtInput", ctx, o_.lanes.timestep, B, D, false);
    if (B == 0) return;
    // the patches, as token rows, plus their positions
    proj_.template forward<Dev, T>(dev, p.subspan(proj, 2), x, s.conv);
    dev.for_each(static_cast<std::size_t>(B * tokens() * D),
                 detail::PatchTokens<T>{s.conv.data, y.data, positions(), tokens()});
    // the caption projection
    const std::vector<std::int64_t> text_shape{B, o_.context_length, o_.caption_channels};
    detail::load_batch_rows(dev, "nn::PixArtInput", ctx.batch, "encoder_hidden_states", text_shape, s.text.data,
                            "put the text encoder's hidden states into the batch as \"encoder_hidden_states\" " +
                                shape_text(text_shape) + " (float32, bf16 or fp16)");
    cap1_.template forward<Dev, T>(dev, p.subspan(c1, 2), s.text, s.c1);
    gelu_.template forward<Dev, T>(dev, {}, s.c1, s.g1);
    cap2_.template forward<Dev, T>(dev, p.subspan(c2, 2), s.g1, MatView<T>{caption.data, B * o_.context_length, D});
    // the timestep embedding and its modulation
    const float* t = detail::batch_floats("nn::PixArtInput", ctx.batch, "timesteps", B,
                                          "give the batch \"timesteps\" float [B]: each record's timestep");
    get_timestep_embedding(dev, t, s.sin,
                           {.dim = timestep_channels, .flip_sin_to_cos = true, .downscale_freq_shift = 0.0});
    t1_.template forward<Dev, T>(dev, p.subspan(e1, 2), s.sin, s.a);
    silu_.template forward<Dev, T>(dev, {}, s.a, s.sa);
    t2_.template forward<Dev, T>(dev, p.subspan(e2, 2), s.sa, emb);
    silu_.template forward<Dev, T>(dev, {}, emb, s.se);
    ada_.template forward<Dev, T>(dev, p.subspan(ada, 2), s.se, t6);
  }

  // The lanes' gradients are what the blocks and the output unit added.
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::PixArtInput");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::PixArtInput", "gradients", grad.size(), p.size());
    const std::int64_t B = x.rows, D = dim_, L = o_.context_length;
    detail::check_shape("nn::PixArtInput", "output gradient", dy, B, tokens() * D);
    const MatView<T> dcaption = detail::pixart_lane("nn::PixArtInput", ctx, o_.lanes.caption, B, L * D, true);
    const MatView<T> dt6 = detail::pixart_lane("nn::PixArtInput", ctx, o_.lanes.modulation, B, 6 * D, true);
    const MatView<T> demb = detail::pixart_lane("nn::PixArtInput", ctx, o_.lanes.timestep, B, D, true);
    const MatView<T> emb = detail::pixart_lane("nn::PixArtInput", ctx, o_.lanes.timestep, B, D, false);
    // the patches: the tokens' gradient back to NCHW, then the convolution's
    detail::permute_heads(dev, HeadLayout{B, tokens(), D, 1, 1}, dy.data, s.conv.data, true);
    proj_.template backward<Dev, T>(dev, p.subspan(proj, 2), grad.subspan(proj, 2), x, {}, s.conv, dx);
    // the caption projection (the text encoder does not train here)
    cap2_.template backward<Dev, T>(dev, p.subspan(c2, 2), grad.subspan(c2, 2), s.g1, {},
                                    MatView<const T>{dcaption.data, B * L, D}, s.dc);
    gelu_.template backward<Dev, T>(dev, {}, {}, s.c1, s.g1, s.dc, s.dc);
    cap1_.template backward<Dev, T>(dev, p.subspan(c1, 2), grad.subspan(c1, 2), s.text, {}, s.dc, MatView<T>{});
    // adaln_single.linear, then the timestep MLP from emb's whole gradient
    ada_.template backward<Dev, T>(dev, p.subspan(ada, 2), grad.subspan(ada, 2), s.se, {}, dt6, s.d1);
    silu_.template backward<Dev, T>(dev, {}, {}, emb, s.se, s.d1, s.d1);
    dev.for_each(static_cast<std::size_t>(B * D), AddElements<T>{s.d1.data, demb.data, s.d1.data});
    t2_.template backward<Dev, T>(dev, p.subspan(e2, 2), grad.subspan(e2, 2), s.sa, {}, s.d1, s.d2);
    silu_.template backward<Dev, T>(dev, {}, {}, s.a, s.sa, s.d2, s.d2);
    t1_.template backward<Dev, T>(dev, p.subspan(e1, 2), grad.subspan(e1, 2), s.sin, {}, s.d2, MatView<T>{});
  }

 private:
  static constexpr std::size_t proj = 0, c1 = 2, c2 = 4, e1 = 6, e2 = 8, ada = 10;

  template <class T>
  struct Parts {
    MatView<T> text;        // the caption [B L, K]
    MatView<T> c1, g1, dc;  // linear_1's output, its GELU, gradient scratch [B L, D]
    MatView<T> sin;         // the timesteps' sinusoids [B, 256]
    MatView<T> a, sa;       // timestep_embedder.linear_1's output and its SiLU [B, D]
    MatView<T> se;          // silu(emb) [B, D]
    MatView<T> d1, d2;      // gradient scratch [B, D]
    MatView<T> conv;        // the convolution's NCHW output (and its gradient) [B, D T]
  };

  detail::PixArtPositions positions() const {
    return {grid_h(), grid_w(), dim_, static_cast<double>(o_.base_size), o_.interpolation_scale};
  }

  static std::int64_t checked(std::int64_t channels, std::int64_t dim, Extent2 latents, const PixArtInputOptions& o) {
    const std::string name = "nn::PixArtInput(" + std::to_string(channels) + " latent channels, width " +
                             std::to_string(dim) + ", patch " + std::to_string(o.patch_size) + ") for " +
                             detail::extent_text(latents) + " latents";
    if (channels < 1 || dim < 1 || o.patch_size < 1 || o.caption_channels < 1 || o.context_length < 1)
      throw config_error(name + ": channels, width, patch size, caption_channels and context_length must be >= 1",
                         "give positive sizes (PixArt-alpha: 4 channels, width 1152, patch 2, 4096 caption "
                         "channels, 120 tokens)");
    if (dim % 4 != 0)
      throw config_error(name + ": the 2-D sin-cos position embedding needs a width divisible by 4",
                         "use heads x head_dim divisible by 4 (diffusers refuses the others too)");
    if (latents.h < o.patch_size || latents.w < o.patch_size || latents.h % o.patch_size != 0 ||
        latents.w % o.patch_size != 0)
      throw config_error(name + ": the latents do not split into whole patches",
                         "use latents whose height and width divide by the patch size");
    if (o.base_size < 1 || !(o.interpolation_scale > 0.0))
      throw config_error(name + ": base_size " + std::to_string(o.base_size) + ", interpolation_scale " +
                             std::to_string(o.interpolation_scale),
                         "give base_size = sample_size / patch_size and a positive interpolation_scale");
    if (o.lanes.caption < 0 || o.lanes.modulation < 0 || o.lanes.timestep < 0 ||
        o.lanes.caption == o.lanes.modulation || o.lanes.caption == o.lanes.timestep ||
        o.lanes.modulation == o.lanes.timestep)
      throw config_error(name + ": lanes " + std::to_string(o.lanes.caption) + ", " +
                             std::to_string(o.lanes.modulation) + ", " + std::to_string(o.lanes.timestep),
                         "give three different lane ids >= 0");
    return dim;
  }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::PixArtInput", "parameters", p.size(), ada + 2);
    out_features(x.cols);
    detail::check_saved("nn::PixArtInput", ctx.saved.size(), saved_size(SeqShape{x.rows, 1}, x.cols),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    const std::int64_t B = x.rows, L = o_.context_length, D = dim_;
    detail::Carve<T> c(ctx.saved.data);
    auto mat = [&](std::int64_t rows, std::int64_t cols) { return MatView<T>{c.take(rows * cols), rows, cols}; };
    Parts<T> s;
    s.text = mat(B * L, o_.caption_channels);
    s.c1 = mat(B * L, D);
    s.g1 = mat(B * L, D);
    s.dc = mat(B * L, D);
    s.sin = mat(B, timestep_channels);
    s.a = mat(B, D);
    s.sa = mat(B, D);
    s.se = mat(B, D);
    s.d1 = mat(B, D);
    s.d2 = mat(B, D);
    s.conv = mat(B, D * tokens());
    return s;
  }

  std::int64_t dim_;
  Extent2 latents_;
  PixArtInputOptions o_;
  Conv2d proj_;
  Linear cap1_, cap2_;  // caption_projection
  Linear t1_, t2_;      // adaln_single.emb.timestep_embedder
  Linear ada_;          // adaln_single.linear
  GELUTanh gelu_;
  SiLU silu_;
};

struct PixArtBlockOptions {
  std::int64_t context_length = 120;  // caption tokens per record
  float norm_eps = 1e-6f;             // norm1's and norm2's (diffusers' norm_eps)
  PixArtLanes lanes{};
};

class PixArtBlock {
 public:
  using SelfAttention = Attention<Bidirectional, SeparateQkv, SelfInput>;
  using CrossAttention = Attention<Bidirectional, SeparateQkv, CrossInput>;

  // `tokens`: the patches per record (T).
  PixArtBlock(std::int64_t heads, std::int64_t head_dim, std::int64_t tokens, PixArtBlockOptions options = {})
      : dim_(checked(heads, head_dim, tokens, options)),
        heads_(heads),
        tokens_(tokens),
        o_(options),
        attn1_(dim_, heads, attention_options(head_dim)),
        attn2_(dim_, heads, attention_options(head_dim)),
        ff_in_(dim_, 4 * dim_),
        ff_out_(4 * dim_, dim_) {}

  std::int64_t dim() const noexcept { return dim_; }
  std::int64_t heads() const noexcept { return heads_; }
  std::int64_t tokens() const noexcept { return tokens_; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "attn1", detail::diffusers_attention_params(attn1_.params()));
    detail::append_params(out, "attn2", detail::diffusers_attention_params(attn2_.params()));
    detail::append_params(out, "ff.net.0.proj", ff_in_.params());
    detail::append_params(out, "ff.net.2", ff_out_.params());
    out.push_back({"scale_shift_table", {6, dim_}, Init::normal(0.f, 1.f / std::sqrt(static_cast<float>(dim_)))});
    return out;
  }
  std::int64_t out_features(std::int64_t in) const {
    if (in != tokens_ * dim_)
      throw config_error("nn::PixArtBlock expects " + std::to_string(tokens_) + " tokens of " + std::to_string(dim_) +
                             " per row, " + std::to_string(tokens_ * dim_) + " values, got rows of " +
                             std::to_string(in),
                         "build the block for the latents' patches and the model's width");
    return in;
  }
  std::vector<int> lanes_read() const { return {o_.lanes.caption, o_.lanes.modulation}; }
  // s.rows(): the records.
  std::int64_t saved_size(SeqShape s, std::int64_t) const { return layout(s.rows()).total; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::PixArtBlock");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_shape("nn::PixArtBlock", "output", y, x.rows, x.cols);
    const std::int64_t B = x.rows, N = s.n, D = dim_;
    const MatView<T> caption = lane(ctx, o_.lanes.caption, B, o_.context_length * D, false);
    const MatView<T> t6 = lane(ctx, o_.lanes.modulation, B, 6 * D, false);
    if (B == 0) return;
    const MatView<const T> mem{caption.data, B * o_.context_length, D};
    const MatView<const T> xt{x.data, N, D};
    const DeviceBatch cross_batch = cross_masks(ctx);
    dev.for_each(static_cast<std::size_t>(B * 6 * D), detail::AddTable<T>{p[table].data, t6.data, s.mod, 6 * D, 6 * D});
    const detail::Modulation<T> m = modulation(s);
    const auto n_elems = static_cast<std::size_t>(N * D);
    dev.for_each(static_cast<std::size_t>(N), detail::ModulatedNorm<T>{xt, m, 0, D, s.xh1, s.m1, o_.norm_eps});
    attn1_.template forward<Dev, T>(dev, p.subspan(attn1, 8), s.m1, s.a1, attention_ctx(ctx, s.att1, 0, B));
    dev.for_each(n_elems, detail::GatedAdd<T>{x.data, s.a1.data, m, 2 * D, D, s.u1.data});
    attn2_.template forward<Dev, T>(dev, p.subspan(attn2, 8), s.u1, mem, s.u2,
                                    attention_ctx(ctx, s.att2, 1, B, &cross_batch));
    dev.for_each(n_elems, AddElements<T>{s.u2.data, s.u1.data, s.u2.data});
    dev.for_each(static_cast<std::size_t>(N),
                 detail::ModulatedNorm<T>{s.u2, m, 3 * D, 4 * D, s.xh2, s.m2, o_.norm_eps});
    ff_in_.template forward<Dev, T>(dev, p.subspan(ff0, 2), s.m2, s.h);
    gelu_.template forward<Dev, T>(dev, {}, s.h, s.g);
    ff_out_.template forward<Dev, T>(dev, p.subspan(ff2, 2), s.g, s.f);
    dev.for_each(n_elems, detail::GatedAdd<T>{s.u2.data, s.f.data, m, 5 * D, D, y.data});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::PixArtBlock");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::PixArtBlock", "gradients", grad.size(), p.size());
    detail::check_shape("nn::PixArtBlock", "output gradient", dy, x.rows, x.cols);
    if (!dx.empty()) detail::check_shape("nn::PixArtBlock", "input gradient", dx, x.rows, x.cols);
    const std::int64_t B = x.rows, N = s.n, D = dim_, L = o_.context_length;
    const MatView<T> caption = lane(ctx, o_.lanes.caption, B, L * D, false);
    const MatView<T> dcaption = lane(ctx, o_.lanes.caption, B, L * D, true);
    const MatView<T> dt6 = lane(ctx, o_.lanes.modulation, B, 6 * D, true);
    if (B == 0) {  // no records: zero parameter gradients
      for (const auto& g : grad)
        if (!g.empty()) dev.zero(g.data, static_cast<std::size_t>(g.size()));
      return;
    }
    const MatView<const T> mem{caption.data, B * L, D};
    const MatView<const T> xt{x.data, N, D};
    const DeviceBatch cross_batch = cross_masks(ctx);
    const detail::Modulation<T> m = modulation(s);
    const auto n_elems = static_cast<std::size_t>(N * D);
    const auto sums = [&](const T* a, const T* b, std::int64_t k) {
      dev.for_each(static_cast<std::size_t>(B * D),
                   detail::RecordColumnSums<T>{a, b, s.dmod + k * D, tokens_, D, 6 * D});
    };
    // y = u2 + gate2 * f
    sums(dy.data, s.f.data, 5);
    dev.for_each(n_elems, detail::GatedAdd<T>{nullptr, dy.data, m, 5 * D, D, s.gA.data});
    ff_out_.template backward<Dev, T>(dev, p.subspan(ff2, 2), grad.subspan(ff2, 2), s.g, {}, s.gA, s.dh);
    gelu_.template backward<Dev, T>(dev, {}, {}, s.h, s.g, s.dh, s.dh);
    ff_in_.template backward<Dev, T>(dev, p.subspan(ff0, 2), grad.subspan(ff0, 2), s.m2, {}, s.dh, s.gB);
    sums(s.gB.data, nullptr, 3);
    sums(s.gB.data, s.xh2.data, 4);
    dev.for_each(static_cast<std::size_t>(N),
                 detail::ModulatedNormBackward<T>{s.u2, s.gB, m, 4 * D, dy.data, s.gC, o_.norm_eps});  // d u2
    // u2 = u1 + attn2(u1, caption): the caption's gradient into its lane
    attn2_.template backward<Dev, T>(dev, p.subspan(attn2, 8), grad.subspan(attn2, 8), s.u1, mem, s.gC, s.gA, s.dmem,
                                     attention_ctx(ctx, s.att2, 1, B, &cross_batch));
    dev.for_each(static_cast<std::size_t>(B * L * D), AddElements<T>{dcaption.data, s.dmem.data, dcaption.data});
    dev.for_each(n_elems, AddElements<T>{s.gA.data, s.gC.data, s.gA.data});  // d u1
    // u1 = x + gate1 * attn1(m1)
    sums(s.gA.data, s.a1.data, 2);
    dev.for_each(n_elems, detail::GatedAdd<T>{nullptr, s.gA.data, m, 2 * D, D, s.gB.data});
    attn1_.template backward<Dev, T>(dev, p.subspan(attn1, 8), grad.subspan(attn1, 8), s.m1, {}, s.gB, s.gC,
                                     attention_ctx(ctx, s.att1, 0, B));
    sums(s.gC.data, nullptr, 0);
    sums(s.gC.data, s.xh1.data, 1);
    if (!dx.empty())
      dev.for_each(static_cast<std::size_t>(N),
                   detail::ModulatedNormBackward<T>{xt, s.gC, m, D, s.gA.data, MatView<T>{dx.data, N, D}, o_.norm_eps});
    // the modulation: scale_shift_table's gradient, and t6's into its lane
    if (!grad[table].empty())
      dev.for_each(static_cast<std::size_t>(6 * D), detail::TableGrad<T>{s.dmod, grad[table].data, B, 6 * D});
    dev.for_each(static_cast<std::size_t>(B * 6 * D), AddElements<T>{dt6.data, s.dmod, dt6.data});
  }

 private:
  // The parameters' positions: attn1, attn2 (8 each), the feed-forward, the table.
  static constexpr std::size_t attn1 = 0, attn2 = 8, ff0 = 16, ff2 = 18, table = 20;

  static std::int64_t checked(std::int64_t heads, std::int64_t head_dim, std::int64_t tokens,
                              const PixArtBlockOptions& o) {
    const std::string name = "nn::PixArtBlock(" + std::to_string(heads) + " heads of " + std::to_string(head_dim) +
                             ", " + std::to_string(tokens) + " tokens)";
    if (heads < 1 || head_dim < 1 || tokens < 1 || o.context_length < 1)
      throw config_error(name + ": heads, head_dim, tokens and context_length must be >= 1",
                         "give positive sizes (PixArt-alpha: 16 heads of 72, 120 caption tokens)");
    if (!(o.norm_eps > 0.f))
      throw config_error(name + ": norm_eps must be > 0", "give a positive norm_eps (diffusers' default 1e-6)");
    return heads * head_dim;
  }

  static GroupedAttentionOptions attention_options(std::int64_t head_dim) {
    GroupedAttentionOptions a;
    a.qkv_bias = true;
    a.out_bias = true;
    a.head_dim = head_dim;
    a.batch_masks = false;  // the batch's attention_mask and position_ids are not the patches'
    return a;
  }

  template <class T>
  struct Parts {
    std::int64_t n;                           // token rows, B T
    T* mod;                                   // the six modulations [B, 6 D]
    MatView<T> xh1, m1, a1, u1, u2, xh2, m2;  // [N, D]: see forward
    MatView<T> h, g;                          // ff.net.0.proj's output and its GELU [N, F]
    MatView<T> f;                             // ff.net.2's output [N, D]
    MatView<T> att1, att2;                    // the attentions' own (one row each)
    MatView<T> gA, gB, gC;                    // gradient scratch [N, D]
    MatView<T> dh;                            // [N, F]
    T* dmod;                                  // [B, 6 D]
    MatView<T> dmem;                          // the caption's gradient [B L, D]
  };

  struct Layout {
    std::int64_t att1, att2, total;
  };
  Layout layout(std::int64_t batch) const {
    const std::int64_t N = batch * tokens_, D = dim_, F = 4 * D, L = o_.context_length;
    Layout l{};
    l.att1 = attn1_.saved_size({batch, tokens_}, tokens_);
    l.att2 = attn2_.saved_size({batch, tokens_}, L);
    l.total = 12 * batch * D + 11 * N * D + 3 * N * F + batch * L * D + l.att1 + l.att2;
    return l;
  }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::PixArtBlock", "parameters", p.size(), table + 1);
    out_features(x.cols);
    const Layout l = layout(x.rows);
    detail::check_saved("nn::PixArtBlock", ctx.saved.size(), l.total,
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    const std::int64_t B = x.rows, N = B * tokens_, D = dim_, F = 4 * D;
    detail::Carve<T> c(ctx.saved.data);
    auto mat = [&](std::int64_t rows, std::int64_t cols) { return MatView<T>{c.take(rows * cols), rows, cols}; };
    Parts<T> s;
    s.n = N;
    s.mod = c.take(6 * B * D);
    s.xh1 = mat(N, D);
    s.m1 = mat(N, D);
    s.a1 = mat(N, D);
    s.u1 = mat(N, D);
    s.u2 = mat(N, D);
    s.xh2 = mat(N, D);
    s.m2 = mat(N, D);
    s.h = mat(N, F);
    s.g = mat(N, F);
    s.f = mat(N, D);
    s.att1 = mat(1, l.att1);
    s.att2 = mat(1, l.att2);
    s.gA = mat(N, D);
    s.gB = mat(N, D);
    s.gC = mat(N, D);
    s.dh = mat(N, F);
    s.dmod = c.take(6 * B * D);
    s.dmem = mat(B * o_.context_length, D);
    return s;
  }

  template <class T>
  detail::Modulation<T> modulation(const Parts<T>& s) const {
    return {s.mod, 6 * dim_, tokens_};
  }

  template <class T>
  MatView<T> lane(const UnitContext<T>& ctx, int id, std::int64_t rows, std::int64_t width, bool grad) const {
    return detail::pixart_lane("nn::PixArtBlock", ctx, id, rows, width, grad);
  }

  // Attention i's context: the records as B sequences of T tokens, its
  // saved view, and (cross-attention) a batch holding the caption's mask only.
  template <class T>
  UnitContext<T> attention_ctx(const UnitContext<T>& ctx, MatView<T> saved, std::int64_t i, std::int64_t batch,
                               const DeviceBatch* masks = nullptr) const {
    return detail::sequence_ctx(ctx, saved, static_cast<std::uint64_t>(i), batch, tokens_, masks);
  }
  template <class T>
  static DeviceBatch cross_masks(const UnitContext<T>& ctx) {
    return detail::encoder_mask(ctx);
  }

  std::int64_t dim_, heads_, tokens_;
  PixArtBlockOptions o_;
  SelfAttention attn1_;
  CrossAttention attn2_;
  Linear ff_in_, ff_out_;  // ff.net.0.proj (D -> 4 D), ff.net.2 (4 D -> D)
  GELUTanh gelu_;
};

struct PixArtOutputOptions {
  PixArtLanes lanes{};
  float norm_eps = 1e-6f;  // norm_out's (fixed in diffusers)
};

class PixArtOutput {
 public:
  // `latents`: the latents' height and width (multiples of `patch`).
  PixArtOutput(std::int64_t dim, std::int64_t out_channels, Extent2 latents, std::int64_t patch,
               PixArtOutputOptions options = {})
      : dim_(checked(dim, out_channels, latents, patch)),
        out_(out_channels),
        latents_(latents),
        patch_(patch),
        o_(options),
        proj_(dim, patch * patch * out_channels) {}

  std::int64_t dim() const noexcept { return dim_; }
  std::int64_t out_channels() const noexcept { return out_; }
  std::int64_t tokens() const noexcept { return (latents_.h / patch_) * (latents_.w / patch_); }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    out.push_back({"scale_shift_table", {2, dim_}, Init::normal(0.f, 1.f / std::sqrt(static_cast<float>(dim_)))});
    detail::append_params(out, "proj_out", proj_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const {
    if (in != tokens() * dim_)
      throw config_error("nn::PixArtOutput expects " + std::to_string(tokens()) + " tokens of " + std::to_string(dim_) +
                             " per row, got rows of " + std::to_string(in),
                         "build the output unit for the latents' patches and the model's width");
    return out_ * latents_.h * latents_.w;
  }
  std::vector<int> lanes_read() const { return {o_.lanes.timestep}; }
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    const std::int64_t N = s.rows() * tokens();
    return s.rows() * 4 * dim_ + 3 * N * dim_ + N * patch_ * patch_ * out_;
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::PixArtOutput");
    const Parts<T> s = parts(p, x, ctx);
    const std::int64_t B = x.rows, D = dim_, N = B * tokens();
    detail::check_shape("nn::PixArtOutput", "output", y, B, out_features(x.cols));
    const MatView<T> emb = detail::pixart_lane("nn::PixArtOutput", ctx, o_.lanes.timestep, B, D, false);
    if (B == 0) return;
    dev.for_each(static_cast<std::size_t>(B * 2 * D), detail::AddTable<T>{p[table].data, emb.data, s.mod, 2 * D, D});
    dev.for_each(static_cast<std::size_t>(N),
                 detail::ModulatedNorm<T>{MatView<const T>{x.data, N, D}, modulation(s), 0, D, s.xh, s.m, o_.norm_eps});
    proj_.template forward<Dev, T>(dev, p.subspan(proj, 2), s.m, s.z);
    dev.for_each(static_cast<std::size_t>(s.z.size()),
                 detail::Unpatchify<T>{s.z.data, y.data, latents_.h / patch_, latents_.w / patch_, patch_, out_, true});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::PixArtOutput");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::PixArtOutput", "gradients", grad.size(), p.size());
    const std::int64_t B = x.rows, D = dim_, N = B * tokens();
    detail::check_shape("nn::PixArtOutput", "output gradient", dy, B, out_features(x.cols));
    if (!dx.empty()) detail::check_shape("nn::PixArtOutput", "input gradient", dx, x.rows, x.cols);
    const MatView<T> demb = detail::pixart_lane("nn::PixArtOutput", ctx, o_.lanes.timestep, B, D, true);
    if (B == 0) {
      for (const auto& g : grad)
        if (!g.empty()) dev.zero(g.data, static_cast<std::size_t>(g.size()));
      return;
    }
    dev.for_each(static_cast<std::size_t>(s.z.size()), detail::Unpatchify<T>{dy.data, s.z.data, latents_.h / patch_,
                                                                             latents_.w / patch_, patch_, out_, false});
    proj_.template backward<Dev, T>(dev, p.subspan(proj, 2), grad.subspan(proj, 2), s.m, {}, s.z, s.g);
    dev.for_each(static_cast<std::size_t>(B * D),
                 detail::RecordColumnSums<T>{s.g.data, nullptr, s.dmod, tokens(), D, 2 * D});
    dev.for_each(static_cast<std::size_t>(B * D),
                 detail::RecordColumnSums<T>{s.g.data, s.xh.data, s.dmod + D, tokens(), D, 2 * D});
    if (!dx.empty())
      dev.for_each(static_cast<std::size_t>(N),
                   detail::ModulatedNormBackward<T>{MatView<const T>{x.data, N, D}, s.g, modulation(s), D, nullptr,
                                                    MatView<T>{dx.data, N, D}, o_.norm_eps});
    if (!grad[table].empty())
      dev.for_each(static_cast<std::size_t>(2 * D), detail::TableGrad<T>{s.dmod, grad[table].data, B, 2 * D});
    dev.for_each(static_cast<std::size_t>(B * D), detail::FoldIntoLane<T>{s.dmod, demb.data, 2 * D, D});
  }

 private:
  static constexpr std::size_t table = 0, proj = 1;

  template <class T>
  struct Parts {
    T* mod;            // shift | scale [B, 2 D]
    T* dmod;           // their gradient
    MatView<T> xh, m;  // norm_out's normalised input and the modulated [N, D]
    MatView<T> g;      // the modulated rows' gradient [N, D]
    MatView<T> z;      // proj_out's output (and its gradient) [N, p p C]
  };

  static std::int64_t checked(std::int64_t dim, std::int64_t out_channels, Extent2 latents, std::int64_t patch) {
    if (dim < 1 || out_channels < 1 || patch < 1 || latents.h < patch || latents.w < patch || latents.h % patch != 0 ||
        latents.w % patch != 0)
      throw config_error("nn::PixArtOutput(width " + std::to_string(dim) + ", " + std::to_string(out_channels) +
                             " channels, patch " + std::to_string(patch) + ") for " + detail::extent_text(latents) +
                             " latents",
                         "give positive sizes and latents whose height and width divide by the patch size");
    return dim;
  }

  template <class T>
  detail::Modulation<T> modulation(const Parts<T>& s) const {
    return {s.mod, 2 * dim_, tokens()};
  }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::PixArtOutput", "parameters", p.size(), proj + 2);
    out_features(x.cols);
    detail::check_saved("nn::PixArtOutput", ctx.saved.size(), saved_size(SeqShape{x.rows, 1}, x.cols),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    const std::int64_t B = x.rows, N = B * tokens(), D = dim_;
    detail::Carve<T> c(ctx.saved.data);
    auto mat = [&](std::int64_t rows, std::int64_t cols) { return MatView<T>{c.take(rows * cols), rows, cols}; };
    Parts<T> s;
    s.mod = c.take(2 * B * D);
    s.dmod = c.take(2 * B * D);
    s.xh = mat(N, D);
    s.m = mat(N, D);
    s.g = mat(N, D);
    s.z = mat(N, patch_ * patch_ * out_);
    return s;
  }

  std::int64_t dim_, out_;
  Extent2 latents_;
  std::int64_t patch_;
  PixArtOutputOptions o_;
  Linear proj_;
};

}  // namespace dtrain::nn
