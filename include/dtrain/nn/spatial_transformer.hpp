#pragma once
// nn::SpatialTransformer: the transformer over a feature map that a
// Stable Diffusion UNet (1.x, 2.x, SDXL) puts after the residual blocks of
// its cross-attention down, middle and up blocks: diffusers'
// Transformer2DModel over continuous inputs, with its parameter names.
//
// Like nn::Conv2d the unit is built for one image size and reads one image
// per row: x [B, C * H * W], NCHW flattened, P = H * W pixels; the output
// has the input's shape. The text context is the batch's
// "encoder_hidden_states" [B, context_length, cross_attention_dim] (float32,
// bf16 or fp16, converted to the compute dtype): cached text embeddings, so
// no gradient flows into it. Per image, with inner = heads * head_dim:
//
//   h = GroupNorm(groups, C, norm_eps)(x)
//   t = tokens(proj_in(h))    1x1 convolution C -> inner, then the P pixels
//                             as rows [P, inner]            (SD 1.x)
//   t = proj_in(tokens(h))    the pixels as rows [P, C], then a Linear
//                             C -> inner (use_linear_projection: SD 2.x, SDXL)
//   `layers` times (diffusers' BasicTransformerBlock, LayerNorms eps 1e-5):
//     t = t + attn1(norm1(t))                 self-attention over the pixels
//     t = t + attn2(norm2(t), context)        keys and values from the text
//     t = t + ff.net.2(a * gelu(g))           a | g = ff.net.0.proj(norm3(t)),
//                                             a the first half, width 4 inner
//   y = proj_out(t) back to C channels (the Linear on the rows then NCHW, or
//       NCHW then the 1x1 convolution, as proj_in) + x
//
// attn1 and attn2 are nn::Attention<Bidirectional, SeparateQkv, SelfInput>
// and <..., CrossInput> (nn/rotary_attention.hpp): heads of head_dim, scale
// 1 / sqrt(head_dim), q/k/v without biases, the output projection with one;
// gelu is the exact (erf) GELU. diffusers' UNet configs name the head count
// and width oddly (SD 1.x's attention_head_dim 8 is 8 heads of C / 8):
// give the unit the heads and head_dim the blocks really use. The batch's
// "encoder_attention_mask" [B, context_length] (int32 or int64, 1: a token,
// 0: padding) leaves padded text tokens out of attn2, as diffusers' mask
// does; the self-attention reads no mask.
//
// Parameters (diffusers' names and shapes, in its state-dict order):
//   norm.weight, norm.bias                          [C]
//   proj_in.weight [inner, C, 1, 1] or [inner, C], proj_in.bias [inner]
//   transformer_blocks.<i>. (i < layers):
//     norm1.weight, norm1.bias                      [inner]
//     attn1.to_q.weight, to_k.weight, to_v.weight   [inner, inner]
//     attn1.to_out.0.weight [inner, inner], attn1.to_out.0.bias [inner]
//     norm2.*, attn2.to_q.weight [inner, inner],
//     attn2.to_k.weight, attn2.to_v.weight          [inner, cross_attention_dim]
//     attn2.to_out.0.weight, attn2.to_out.0.bias, norm3.*
//     ff.net.0.proj.weight [8 inner, inner], ff.net.0.proj.bias [8 inner]
//     ff.net.2.weight [inner, 4 inner], ff.net.2.bias [inner]
//   proj_out.weight [C, inner, 1, 1] or [C, inner], proj_out.bias [C]
//
// Saved (ctx.saved), with N = B * P, I = inner, F = 4 I, W = max(I, C),
// L = context_length, D = cross_attention_dim:
//   B C P      the norm's output (pixels as rows with the linear projection)
//   B L D      the text context in the compute dtype
//   N I        the first block's input
//   per block  18 N I (the three norms' outputs, the two residual sums, the
//              feed-forward's projection [N, 2F] and gate product [N, F], the
//              block's output) + the attentions' own: attn1 4 N I + B heads
//              P^2, attn2 2 N I + 2 B L I + B heads P L
//   N I        the last block's output as NCHW (convolution projection only)
//   the adapters' rows (LoRA, below), per block and for proj_in/proj_out
//   3 N W + 3 N F   gradient scratch for backward (also forward's scratch)
// The attention probabilities are kept whole: B heads P^2 per block (no
// fused attention here), which dominates at SD's 64 x 64 latents.
//
// LoRA (nn/lora.hpp): SpatialTransformerOptions::lora_targets names the
// projections that get adapters, by their names inside a block
// ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", the same
// for attn2, "ff.net.0.proj", "ff.net.2"; every block of the unit alike) or
// of the unit ("proj_in", "proj_out", the Linear projections only: a 1x1
// convolution takes no adapter here). An adapted projection's weight and
// bias are frozen; its "<name>.lora_A" [r, in] and "<name>.lora_B"
// [out, r] follow its own parameters, PEFT's layout. attn2's k and v
// adapters read the text context. `trainable` false freezes every other
// parameter (what LoRA training does to a UNet). Each adapter keeps
// rows x r more elements in the saved view (and rows x in with dropout).
//
// Backward is exact and overwrites every parameter gradient; the input
// gradient is skipped when empty. Dropout is not modelled (diffusers'
// default 0). On a GPU the unit runs only with DTRAIN_GPU_VISION=on (and its
// attentions with DTRAIN_GPU_ATTENTION=on): compiled, not yet run there.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/attention_policies.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/diffusion_units.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/lora.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::nn {

struct SpatialTransformerOptions {
  std::int64_t layers = 1;                  // transformer blocks (SDXL's transformer_layers_per_block, up to 10)
  bool use_linear_projection = false;       // Linear proj_in/proj_out (SD 2.x, SDXL); false: 1x1 convolutions (SD 1.x)
  std::int64_t groups = 32;                 // the GroupNorm's (norm_num_groups)
  float norm_eps = 1e-6f;                   // the GroupNorm's
  std::int64_t context_length = 77;         // text tokens per image in encoder_hidden_states
  float layer_norm_eps = 1e-5f;             // norm1..norm3's (diffusers' norm_eps)
  bool trainable = true;                    // false freezes every parameter but the adapters
  LoraOptions lora{};                       // the adapters' rank, alpha, dropout (r 0: none)
  std::vector<std::string> lora_targets{};  // the adapted projections (see the header)
};

namespace detail {

// diffusers' GEGLU on the feed-forward projection h [rows, 2 F] = a | g:
// y = a * gelu(g), the first half times the exact GELU of the second.
template <Dtype T>
struct GegluFirstHalf {
  MatView<const T> h;
  MatView<T> y;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void at(std::int64_t r, std::int64_t j) const {
    const float a = static_cast<float>(h(r, j)), g = static_cast<float>(h(r, y.cols + j));
    y(r, j) = dtype_cast<T>(a * gelu_op::forward(g));
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    at(static_cast<std::int64_t>(i) / y.cols, static_cast<std::int64_t>(i) % y.cols);
  }
  // the host's rows (backend/host/device_isa.hpp: HostSpanFunctor)
  void span(std::size_t begin, std::size_t end) const {
    dtrain::detail::row_pieces(begin, end, y.cols, [this](std::int64_t r, std::int64_t j0, std::int64_t j1) {
      for (std::int64_t j = j0; j < j1; ++j) at(r, j);
    });
  }
};

// Its gradient: dh = dy * gelu(g) | gelu'(g) * dy * a.
template <Dtype T>
struct GegluFirstHalfBackward {
  MatView<const T> h;
  MatView<const T> dy;
  MatView<T> dh;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void at(std::int64_t r, std::int64_t j) const {
    const float a = static_cast<float>(h(r, j)), g = static_cast<float>(h(r, dy.cols + j));
    const float d = static_cast<float>(dy(r, j));
    dh(r, j) = dtype_cast<T>(d * gelu_op::forward(g));
    dh(r, dy.cols + j) = dtype_cast<T>(gelu_op::backward(g, 0.f, d * a));
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    at(static_cast<std::int64_t>(i) / dy.cols, static_cast<std::int64_t>(i) % dy.cols);
  }
  void span(std::size_t begin, std::size_t end) const {
    dtrain::detail::row_pieces(begin, end, dy.cols, [this](std::int64_t r, std::int64_t j0, std::int64_t j1) {
      for (std::int64_t j = j0; j < j1; ++j) at(r, j);
    });
  }
};

// An attention's context inside a composite unit: the unit's with the
// attention's own saved view and random stream (part i), `batch` sequences
// of `time` rows, and the batch it sees: `masks` (a cross-attention's text
// mask) or none (the batch's other tensors describe the text, not the
// unit's rows).
template <class T>
UnitContext<T> sequence_ctx(const UnitContext<T>& ctx, MatView<T> saved, std::uint64_t i, std::int64_t batch,
                            std::int64_t time, const DeviceBatch* masks = nullptr) {
  UnitContext<T> c = ctx.part(saved, i);
  c.shape = {batch, time};
  c.batch = masks;
  return c;
}

// The batch's encoder_attention_mask alone (or nothing).
template <class T>
DeviceBatch encoder_mask(const UnitContext<T>& ctx) {
  DeviceBatch b;
  if (ctx.batch != nullptr)
    if (const DeviceTensor* m = ctx.batch->find("encoder_attention_mask"); m != nullptr)
      b.set("encoder_attention_mask", *m);
  return b;
}

// The attention family's projection names (q, k, v, o) as diffusers'
// Attention names them (to_q, to_k, to_v, to_out.0).
inline std::vector<ParamSpec> diffusers_attention_params(std::vector<ParamSpec> specs) {
  for (auto& s : specs) {
    const std::size_t dot = s.name.find('.');
    const std::string head = s.name.substr(0, dot), rest = dot == std::string::npos ? "" : s.name.substr(dot);
    if (head == "q" || head == "k" || head == "v")
      s.name = "to_" + head + rest;
    else if (head == "o")
      s.name = "to_out.0" + rest;
  }
  return specs;
}

}  // namespace detail

class SpatialTransformer {
 public:
  using SelfAttention = Attention<Bidirectional, SeparateQkv, SelfInput>;
  using CrossAttention = Attention<Bidirectional, SeparateQkv, CrossInput>;

  // `image`: the height and width of the input feature maps.
  SpatialTransformer(std::int64_t channels, std::int64_t heads, std::int64_t head_dim, std::int64_t cross_attention_dim,
                     Extent2 image, SpatialTransformerOptions options = {})
      : channels_(checked(channels, heads, head_dim, cross_attention_dim, image, options)),
        heads_(heads),
        inner_(heads * head_dim),
        cross_dim_(cross_attention_dim),
        image_(image),
        o_(options),
        norm_(options.groups, channels, image, {.eps = options.norm_eps, .trainable = options.trainable}),
        conv_in_(channels, inner_, {1, 1}, image, {.trainable = options.trainable}),
        conv_out_(inner_, channels, {1, 1}, image, {.trainable = options.trainable}),
        linear_in_(channels, inner_, linear_options("proj_in")),
        linear_out_(inner_, channels, linear_options("proj_out")),
        ln_(inner_, {.eps = options.layer_norm_eps, .trainable = options.trainable}),
        attn1_(inner_, heads, attention_options(head_dim, 0, "attn1")),
        attn2_(inner_, heads, attention_options(head_dim, cross_attention_dim, "attn2")),
        ff_in_(inner_, 8 * inner_, linear_options("ff.net.0.proj")),
        ff_out_(4 * inner_, inner_, linear_options("ff.net.2")),
        at_(offsets()) {}

  std::int64_t channels() const noexcept { return channels_; }
  std::int64_t heads() const noexcept { return heads_; }
  std::int64_t inner_dim() const noexcept { return inner_; }
  std::int64_t cross_attention_dim() const noexcept { return cross_dim_; }
  const SpatialTransformerOptions& options() const noexcept { return o_; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "norm", norm_.params());
    detail::append_params(out, "proj_in", o_.use_linear_projection ? linear_in_.params() : conv_in_.params());
    for (std::int64_t l = 0; l < o_.layers; ++l) {
      const std::string b = "transformer_blocks." + std::to_string(l) + ".";
      detail::append_params(out, b + "norm1", ln_.params());
      detail::append_params(out, b + "attn1", detail::diffusers_attention_params(attn1_.params()));
      detail::append_params(out, b + "norm2", ln_.params());
      detail::append_params(out, b + "attn2", detail::diffusers_attention_params(attn2_.params()));
      detail::append_params(out, b + "norm3", ln_.params());
      detail::append_params(out, b + "ff.net.0.proj", ff_in_.params());
      detail::append_params(out, b + "ff.net.2", ff_out_.params());
    }
    detail::append_params(out, "proj_out", o_.use_linear_projection ? linear_out_.params() : conv_out_.params());
    return out;
  }

  std::int64_t out_features(std::int64_t in) const {
    const std::int64_t want = channels_ * pixels();
    if (in != want)
      throw config_error("nn::SpatialTransformer expects " + std::to_string(channels_) + " channels of " +
                             detail::extent_text(image_) + " images, " + std::to_string(want) +
                             " values per row (NCHW), got rows of " + std::to_string(in),
                         "give one flattened [channels, height, width] feature map per row, or build the unit for "
                         "the feature maps' size");
    return want;
  }

  // s.rows(): the images.
  std::int64_t saved_size(SeqShape s, std::int64_t) const { return layout(s.rows()).total; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::SpatialTransformer");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_shape("nn::SpatialTransformer", "output", y, x.rows, x.cols);
    const std::int64_t B = x.rows, N = s.n, I = inner_, C = channels_;
    load_context(dev, ctx, B, s.mem.data);
    const DeviceBatch cross_batch = cross_masks(ctx);
    const MatView<const T> mem = s.mem;
    // norm, proj_in -> the first block's input t0 [N, I]
    if (o_.use_linear_projection) {
      const MatView<T> h{s.g1.data, B, C * pixels()};
      norm_.forward<Dev, T>(dev, p.subspan(norm, 2), x, h);
      detail::permute_heads(dev, pixel_layout(B, C), h.data, s.pin.data, false);
      linear_in_.forward<Dev, T>(dev, p.subspan(at_.proj_in, at_.n_proj_in), s.pin, s.t0,
                                 ctx.part(s.lpin, key_proj_in));
    } else {
      norm_.forward<Dev, T>(dev, p.subspan(norm, 2), x, s.pin);
      const MatView<T> h{s.g1.data, B, I * pixels()};
      conv_in_.forward<Dev, T>(dev, p.subspan(at_.proj_in, at_.n_proj_in), s.pin, h);
      detail::permute_heads(dev, pixel_layout(B, I), h.data, s.t0.data, false);
    }
    MatView<const T> t = s.t0;
    for (std::int64_t l = 0; l < o_.layers; ++l) {
      const Block<T> b = s.block(l);
      const std::size_t at = block_param(l);
      const auto add = [&](MatView<T> sum, MatView<const T> other) {
        dev.for_each(static_cast<std::size_t>(N * I), AddElements<T>{sum.data, other.data, sum.data});
      };
      ln_.forward<Dev, T>(dev, p.subspan(at + at_.norm1, 2), t, b.n1);
      attn1_.template forward<Dev, T>(dev, p.subspan(at + at_.attn1, at_.n_attn1), b.n1, b.u1,
                                      attention_ctx(ctx, b.a1, 2 * l, B));
      add(b.u1, t);
      ln_.forward<Dev, T>(dev, p.subspan(at + at_.norm2, 2), b.u1, b.n2);
      attn2_.template forward<Dev, T>(dev, p.subspan(at + at_.attn2, at_.n_attn2), b.n2, mem, b.u2,
                                      attention_ctx(ctx, b.a2, 2 * l + 1, B, &cross_batch));
      add(b.u2, b.u1);
      ln_.forward<Dev, T>(dev, p.subspan(at + at_.norm3, 2), b.u2, b.n3);
      ff_in_.forward<Dev, T>(dev, p.subspan(at + at_.ff0, at_.n_ff0), b.n3, b.h, ctx.part(b.f0, key_ff + 2 * l));
      dev.for_each(static_cast<std::size_t>(N * 4 * I), detail::GegluFirstHalf<T>{b.h, b.g});
      ff_out_.forward<Dev, T>(dev, p.subspan(at + at_.ff2, at_.n_ff2), b.g, b.out, ctx.part(b.f2, key_ff + 2 * l + 1));
      add(b.out, b.u2);
      t = b.out;
    }
    // proj_out, back to NCHW, + x
    if (o_.use_linear_projection) {
      const MatView<T> z{s.g1.data, N, C};
      linear_out_.forward<Dev, T>(dev, p.subspan(proj_out(), at_.n_proj_out), t, z, ctx.part(s.lpout, key_proj_out));
      detail::permute_heads(dev, pixel_layout(B, C), z.data, y.data, true);
    } else {
      detail::permute_heads(dev, pixel_layout(B, I), t.data, s.tout.data, true);
      conv_out_.forward<Dev, T>(dev, p.subspan(proj_out(), at_.n_proj_out), s.tout, y);
    }
    dev.for_each(static_cast<std::size_t>(y.size()), AddElements<T>{y.data, x.data, y.data});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::SpatialTransformer");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::SpatialTransformer", "gradients", grad.size(), p.size());
    detail::check_shape("nn::SpatialTransformer", "output gradient", dy, x.rows, x.cols);
    if (!dx.empty()) detail::check_shape("nn::SpatialTransformer", "input gradient", dx, x.rows, x.cols);
    const std::int64_t B = x.rows, N = s.n, I = inner_, C = channels_;
    const DeviceBatch cross_batch = cross_masks(ctx);
    const MatView<const T> mem = s.mem;
    const MatView<T> g1{s.g1.data, N, I}, g2{s.g2.data, N, I}, g3{s.g3.data, N, I};
    // dt (the last block's output gradient) -> g1
    if (o_.use_linear_projection) {
      const MatView<T> dyt{s.g2.data, N, C};
      detail::permute_heads(dev, pixel_layout(B, C), dy.data, dyt.data, false);
      const MatView<const T> t = s.block(o_.layers - 1).out;
      linear_out_.backward<Dev, T>(dev, p.subspan(proj_out(), at_.n_proj_out), grad.subspan(proj_out(), at_.n_proj_out),
                                   t, {}, dyt, g1, ctx.part(s.lpout, key_proj_out));
    } else {
      const MatView<T> dt{s.g2.data, B, I * pixels()};
      conv_out_.backward<Dev, T>(dev, p.subspan(proj_out(), at_.n_proj_out), grad.subspan(proj_out(), at_.n_proj_out),
                                 s.tout, {}, dy, dt);
      detail::permute_heads(dev, pixel_layout(B, I), dt.data, g1.data, false);
    }
    const auto add = [&](MatView<T> sum, MatView<const T> other) {
      dev.for_each(static_cast<std::size_t>(N * I), AddElements<T>{sum.data, other.data, sum.data});
    };
    for (std::int64_t l = o_.layers - 1; l >= 0; --l) {
      const Block<T> b = s.block(l);
      const MatView<const T> t = l == 0 ? MatView<const T>(s.t0) : MatView<const T>(s.block(l - 1).out);
      const std::size_t at = block_param(l);
      const auto ps = [&](std::size_t first, std::size_t count) { return p.subspan(at + first, count); };
      const auto gs = [&](std::size_t first, std::size_t count) { return grad.subspan(at + first, count); };
      // feed-forward: g1 holds d out = d u2 (residual) + the branch's
      ff_out_.backward<Dev, T>(dev, ps(at_.ff2, at_.n_ff2), gs(at_.ff2, at_.n_ff2), b.g, {}, g1, s.dg,
                               ctx.part(b.f2, key_ff + 2 * l + 1));
      dev.for_each(static_cast<std::size_t>(N * 4 * I), detail::GegluFirstHalfBackward<T>{b.h, s.dg, s.dh});
      ff_in_.backward<Dev, T>(dev, ps(at_.ff0, at_.n_ff0), gs(at_.ff0, at_.n_ff0), b.n3, {}, s.dh, g2,
                              ctx.part(b.f0, key_ff + 2 * l));
      ln_.backward<Dev, T>(dev, ps(at_.norm3, 2), gs(at_.norm3, 2), b.u2, {}, g2, g3);
      add(g1, g3);  // d u2
      attn2_.template backward<Dev, T>(dev, ps(at_.attn2, at_.n_attn2), gs(at_.attn2, at_.n_attn2), b.n2, mem, g1, g2,
                                       MatView<T>{}, attention_ctx(ctx, b.a2, 2 * l + 1, B, &cross_batch));
      ln_.backward<Dev, T>(dev, ps(at_.norm2, 2), gs(at_.norm2, 2), b.u1, {}, g2, g3);
      add(g1, g3);  // d u1
      attn1_.template backward<Dev, T>(dev, ps(at_.attn1, at_.n_attn1), gs(at_.attn1, at_.n_attn1), b.n1, {}, g1, g2,
                                       attention_ctx(ctx, b.a1, 2 * l, B));
      ln_.backward<Dev, T>(dev, ps(at_.norm1, 2), gs(at_.norm1, 2), t, {}, g2, g3);
      add(g1, g3);  // d t
    }
    // proj_in, norm: the norm's output gradient -> g3 [B, C P]
    const MatView<T> dh{s.g3.data, B, C * pixels()};
    if (o_.use_linear_projection) {
      const MatView<T> dht{s.g2.data, N, C};
      linear_in_.backward<Dev, T>(dev, p.subspan(at_.proj_in, at_.n_proj_in), grad.subspan(at_.proj_in, at_.n_proj_in),
                                  s.pin, {}, g1, dht, ctx.part(s.lpin, key_proj_in));
      detail::permute_heads(dev, pixel_layout(B, C), dht.data, dh.data, true);
    } else {
      const MatView<T> dt0{s.g2.data, B, I * pixels()};
      detail::permute_heads(dev, pixel_layout(B, I), g1.data, dt0.data, true);
      conv_in_.backward<Dev, T>(dev, p.subspan(at_.proj_in, at_.n_proj_in), grad.subspan(at_.proj_in, at_.n_proj_in),
                                s.pin, {}, dt0, dh);
    }
    norm_.backward<Dev, T>(dev, p.subspan(norm, 2), grad.subspan(norm, 2), x, {}, dh, dx);
    if (!dx.empty()) dev.for_each(static_cast<std::size_t>(dx.size()), AddElements<T>{dx.data, dy.data, dx.data});
  }

 private:
  // The parameters' positions: the norm, proj_in, then per block (the
  // offsets from the block's first), then proj_out; each projection's
  // adapters, if any, after its own parameters.
  static constexpr std::size_t norm = 0;
  struct Offsets {
    std::size_t proj_in, n_proj_in, first_block, block, n_proj_out;
    std::size_t norm1, attn1, n_attn1, norm2, attn2, n_attn2, norm3, ff0, n_ff0, ff2, n_ff2;
  };
  Offsets offsets() const {
    Offsets o{};
    o.proj_in = 2;
    o.n_proj_in = (o_.use_linear_projection ? linear_in_.params() : conv_in_.params()).size();
    o.first_block = o.proj_in + o.n_proj_in;
    o.norm1 = 0;
    o.attn1 = 2;
    o.n_attn1 = attn1_.params().size();
    o.norm2 = o.attn1 + o.n_attn1;
    o.attn2 = o.norm2 + 2;
    o.n_attn2 = attn2_.params().size();
    o.norm3 = o.attn2 + o.n_attn2;
    o.ff0 = o.norm3 + 2;
    o.n_ff0 = ff_in_.params().size();
    o.ff2 = o.ff0 + o.n_ff0;
    o.n_ff2 = ff_out_.params().size();
    o.block = o.ff2 + o.n_ff2;
    o.n_proj_out = (o_.use_linear_projection ? linear_out_.params() : conv_out_.params()).size();
    return o;
  }
  std::size_t block_param(std::int64_t l) const { return at_.first_block + static_cast<std::size_t>(l) * at_.block; }
  std::size_t proj_out() const { return block_param(o_.layers); }
  std::size_t param_count() const { return proj_out() + at_.n_proj_out; }
  // The random-stream keys of the Linear projections' adapters (dropout);
  // the attentions' are 2 l and 2 l + 1.
  static constexpr std::uint64_t key_proj_in = 1u << 20, key_proj_out = key_proj_in + 1, key_ff = 1u << 21;

  // The projections inside a block, and the unit's own, that take adapters.
  static const std::set<std::string>& lora_names() {
    static const std::set<std::string> names{"attn1.to_q",    "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                                             "attn2.to_q",    "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
                                             "ff.net.0.proj", "ff.net.2",   "proj_in",    "proj_out"};
    return names;
  }
  bool adapted(const std::string& name) const {
    return std::find(o_.lora_targets.begin(), o_.lora_targets.end(), name) != o_.lora_targets.end();
  }
  LoraOptions lora_on(const std::string& name) const { return adapted(name) ? o_.lora : LoraOptions{}; }
  LinearOptions linear_options(const std::string& name) const {
    return {.trainable = o_.trainable, .lora = lora_on(name)};
  }

  std::int64_t pixels() const { return image_.h * image_.w; }

  static std::int64_t checked(std::int64_t channels, std::int64_t heads, std::int64_t head_dim, std::int64_t cross,
                              Extent2 image, const SpatialTransformerOptions& o) {
    const std::string name = "nn::SpatialTransformer(" + std::to_string(channels) + " channels, " +
                             std::to_string(heads) + " heads of " + std::to_string(head_dim) + ", context width " +
                             std::to_string(cross) + ") for " + detail::extent_text(image) + " images";
    if (channels < 1 || heads < 1 || head_dim < 1 || cross < 1 || image.h < 1 || image.w < 1)
      throw config_error(name + ": channels, heads, head_dim, cross_attention_dim and image extents must be >= 1",
                         "give positive sizes (SD 1.5's first block: 320 channels, 8 heads of 40, context 768)");
    if (o.layers < 1)
      throw config_error(name + ": " + std::to_string(o.layers) + " transformer layers",
                         "give at least one layer (SDXL's transformer_layers_per_block: 1, 2 or 10)");
    if (o.groups < 1 || channels % o.groups != 0)
      throw config_error(name + ": " + std::to_string(channels) + " channels do not split into " +
                             std::to_string(o.groups) + " equal GroupNorm groups",
                         "use a group count that divides the channel count (diffusers' norm_num_groups, 32)");
    if (o.context_length < 1)
      throw config_error(name + ": context_length " + std::to_string(o.context_length) + " must be >= 1",
                         "give the text tokens per image in encoder_hidden_states (77 for CLIP's)");
    if (!(o.norm_eps > 0.f) || !(o.layer_norm_eps > 0.f))
      throw config_error(name + ": norm_eps and layer_norm_eps must be > 0",
                         "give positive epsilons (diffusers: 1e-6 for the GroupNorm, 1e-5 for the LayerNorms)");
    for (const std::string& t : o.lora_targets) {
      if (!lora_names().contains(t))
        throw config_error(name + ": no projection \"" + t + "\" takes a LoRA adapter",
                           "name attn1/attn2's to_q, to_k, to_v, to_out.0, ff.net.0.proj, ff.net.2, or the linear "
                           "proj_in and proj_out");
      if ((t == "proj_in" || t == "proj_out") && !o.use_linear_projection)
        throw config_error(name + ": " + t + " is a 1x1 convolution here (use_linear_projection false)",
                           "leave " + t + " out of the LoRA targets: convolutions take no adapters in dtrain");
    }
    if (o.lora.on() != !o.lora_targets.empty())
      throw config_error(name + (o.lora.on() ? ": a LoRA rank but no target" : ": LoRA targets but rank 0"),
                         "give both the rank (lora.r > 0) and the projections to adapt, or neither");
    return channels;
  }

  GroupedAttentionOptions attention_options(std::int64_t head_dim, std::int64_t memory_dim,
                                            const std::string& name) const {
    GroupedAttentionOptions a;
    a.trainable = o_.trainable;
    a.q_lora = lora_on(name + ".to_q");
    a.k_lora = lora_on(name + ".to_k");
    a.v_lora = lora_on(name + ".to_v");
    a.o_lora = lora_on(name + ".to_out.0");
    a.out_bias = true;
    a.head_dim = head_dim;
    a.memory_dim = memory_dim;
    a.batch_masks = false;  // the batch's attention_mask and position_ids are the text's, not the pixels'
    return a;
  }

  // NCHW rows [B, ch P] <-> pixel rows [B P, ch]: the head layout of ch
  // heads of width 1 over P positions.
  HeadLayout pixel_layout(std::int64_t batch, std::int64_t ch) const { return {batch, pixels(), ch, 1, 1}; }

  // One block's saved activations.
  template <class T>
  struct Block {
    MatView<T> n1, u1, n2, u2, n3;  // norm1's output, t + attn1, norm2's, u1 + attn2, norm3's
    MatView<T> h, g, out;           // ff.net.0.proj's output [N, 2F], a * gelu(g) [N, F], the block's output
    MatView<T> a1, a2;              // the attentions' own (one row each)
    MatView<T> f0, f2;              // the feed-forward's adapters' (one row each; empty without)
  };

  // Offsets into the saved view (elements of T) for `batch` images.
  struct Layout {
    std::int64_t n, pin, mem, t0, blocks, block, a1, a2, f0, f2, tout, lpin, lpout, g, dh, dg, total;
  };
  Layout layout(std::int64_t batch) const {
    Layout l{};
    const std::int64_t P = pixels(), N = batch * P, I = inner_, F = 4 * I, W = std::max(I, channels_);
    l.n = N;
    l.a1 = attn1_.saved_size({batch, P}, P);
    l.a2 = attn2_.saved_size({batch, P}, o_.context_length);
    l.f0 = ff_in_.saved_size({batch, P}, I);
    l.f2 = ff_out_.saved_size({batch, P}, F);
    l.block = 6 * N * I + 3 * N * F + l.a1 + l.a2 + l.f0 + l.f2;
    l.pin = 0;
    l.mem = l.pin + batch * channels_ * P;
    l.t0 = l.mem + batch * o_.context_length * cross_dim_;
    l.blocks = l.t0 + N * I;
    l.tout = l.blocks + o_.layers * l.block;
    l.lpin = l.tout + (o_.use_linear_projection ? 0 : N * I);
    l.lpout = l.lpin + (o_.use_linear_projection ? linear_in_.saved_size({batch, P}, channels_) : 0);
    l.g = l.lpout + (o_.use_linear_projection ? linear_out_.saved_size({batch, P}, I) : 0);
    l.dh = l.g + 3 * N * W;
    l.dg = l.dh + 2 * N * F;
    l.total = l.dg + N * F;
    return l;
  }

  template <class T>
  struct Parts {
    std::int64_t n;          // pixel rows, B P
    MatView<T> pin;          // proj_in's input: the norm's output (NCHW, or pixel rows with a Linear)
    MatView<T> mem;          // the context [B L, D]
    MatView<T> t0;           // the first block's input [N, I]
    MatView<T> tout;         // the last block's output as NCHW (convolution only)
    MatView<T> lpin, lpout;  // the linear projections' adapters' (one row each; empty without)
    MatView<T> g1, g2, g3;   // scratch, N W each (viewed as needed)
    MatView<T> dh, dg;       // the feed-forward's gradients [N, 2F], [N, F]
    T* blocks;               // the blocks' activations
    std::int64_t block_size, a1_size, a2_size, f0_size, f2_size, inner;
    Block<T> block(std::int64_t l) const {
      detail::Carve<T> c(blocks + l * block_size);
      auto mat = [&](std::int64_t cols) { return MatView<T>{c.take(n * cols), n, cols}; };
      Block<T> b;
      b.n1 = mat(inner);
      b.u1 = mat(inner);
      b.n2 = mat(inner);
      b.u2 = mat(inner);
      b.n3 = mat(inner);
      b.h = mat(8 * inner);
      b.g = mat(4 * inner);
      b.out = mat(inner);
      b.a1 = {c.take(a1_size), 1, a1_size};
      b.a2 = {c.take(a2_size), 1, a2_size};
      b.f0 = {c.take(f0_size), 1, f0_size};
      b.f2 = {c.take(f2_size), 1, f2_size};
      return b;
    }
  };

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::SpatialTransformer", "parameters", p.size(), param_count());
    out_features(x.cols);
    const Layout l = layout(x.rows);
    detail::check_saved("nn::SpatialTransformer", ctx.saved.size(), l.total,
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    T* at = ctx.saved.data;
    const std::int64_t N = l.n, I = inner_, F = 4 * I, W = std::max(I, channels_);
    Parts<T> s;
    s.n = N;
    s.pin = o_.use_linear_projection ? MatView<T>{at + l.pin, N, channels_}
                                     : MatView<T>{at + l.pin, x.rows, channels_ * pixels()};
    s.mem = {at + l.mem, x.rows * o_.context_length, cross_dim_};
    s.t0 = {at + l.t0, N, I};
    s.tout = {at + l.tout, x.rows, I * pixels()};
    s.lpin = {at + l.lpin, 1, l.lpout - l.lpin};
    s.lpout = {at + l.lpout, 1, l.g - l.lpout};
    s.g1 = {at + l.g, N, W};
    s.g2 = {at + l.g + N * W, N, W};
    s.g3 = {at + l.g + 2 * N * W, N, W};
    s.dh = {at + l.dh, N, 2 * F};
    s.dg = {at + l.dg, N, F};
    s.blocks = at + l.blocks;
    s.block_size = l.block;
    s.a1_size = l.a1;
    s.a2_size = l.a2;
    s.f0_size = l.f0;
    s.f2_size = l.f2;
    s.inner = I;
    return s;
  }

  // Attention i's context: the pixels as B sequences of P, its saved view,
  // and (cross-attention) a batch holding the text's padding mask only.
  template <class T>
  UnitContext<T> attention_ctx(const UnitContext<T>& ctx, MatView<T> saved, std::int64_t i, std::int64_t batch,
                               const DeviceBatch* masks = nullptr) const {
    return detail::sequence_ctx(ctx, saved, static_cast<std::uint64_t>(i), batch, pixels(), masks);
  }
  template <class T>
  static DeviceBatch cross_masks(const UnitContext<T>& ctx) {
    return detail::encoder_mask(ctx);
  }

  // The batch's encoder_hidden_states [B, L, D] -> out [B L, D] in T.
  template <class Dev, class T>
  void load_context(Dev& dev, const UnitContext<T>& ctx, std::int64_t batch, T* out) const {
    const DeviceTensor* t = ctx.batch != nullptr ? ctx.batch->find("encoder_hidden_states") : nullptr;
    const std::vector<std::int64_t> want{batch, o_.context_length, cross_dim_};
    const std::string fix = "put the text encoder's hidden states into the batch as \"encoder_hidden_states\" " +
                            shape_text(want) + " (float32, bf16 or fp16)";
    if (t == nullptr) throw config_error("nn::SpatialTransformer: the batch has no \"encoder_hidden_states\"", fix);
    if (t->shape != want)
      throw config_error("nn::SpatialTransformer: the batch's encoder_hidden_states are " + shape_text(t->shape) +
                             ", the unit reads " + shape_text(want) + " (images, context_length, cross_attention_dim)",
                         fix);
    const auto n = static_cast<std::size_t>(batch * o_.context_length * cross_dim_);
    switch (t->type) {
      case element_type::f32: return dev.for_each(n, Cast<float, T>{t->data<float>(), out});
      case element_type::bf16: return dev.for_each(n, Cast<bf16, T>{t->data<bf16>(), out});
      case element_type::f16: return dev.for_each(n, Cast<fp16, T>{t->data<fp16>(), out});
      default:
        throw config_error(
            "nn::SpatialTransformer: the batch's encoder_hidden_states hold " + std::string(element_name(t->type)),
            fix);
    }
  }

  std::int64_t channels_, heads_, inner_, cross_dim_;
  Extent2 image_;
  SpatialTransformerOptions o_;
  GroupNorm norm_;
  Conv2d conv_in_, conv_out_;      // proj_in, proj_out as 1x1 convolutions (SD 1.x)
  Linear linear_in_, linear_out_;  // or as Linears (use_linear_projection)
  LayerNorm ln_;                   // norm1..norm3 of every block (one shape, parameters per block)
  SelfAttention attn1_;
  CrossAttention attn2_;
  Linear ff_in_, ff_out_;  // ff.net.0.proj (inner -> 8 inner), ff.net.2 (4 inner -> inner)
  Offsets at_;             // the parameters' positions (after the units above: it counts theirs)
};

}  // namespace dtrain::nn
