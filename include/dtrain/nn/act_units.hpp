#pragma once
// The units of LeRobot's ACT policy after its image backbone (models/act.hpp
// puts them together). Between them the activation is a packed sequence per
// sample, [batch * rows, 2 * dim] with rows = 1 + tokens (+ chunk once the
// decoder starts):
//   row 0            the latent's statistics: mu [latent], log sigma^2
//                    [latent], zeros (both zero without the VAE or outside
//                    training), carried to the loss for the KL term
//   rows 1 .. tokens the encoder's tokens: [x | pos], pos the position
//                    embedding the queries and keys add at every layer
//   then chunk rows  the decoder's tokens, [x | pos] likewise
// so every unit reads one activation and the library's strategies, FSDP
// wrapping and activation checkpointing apply per unit as for any model.
//
//   nn::ActTokens        backbone features [B, cameras * channels * h * w]
//                        -> packed rows 0 .. tokens: the conditional VAE
//                        encoder (training with use_vae: cls, state and
//                        action tokens through its layers, the latent's mu
//                        and log sigma^2, z = mu + exp(log sigma^2 / 2) eps),
//                        the latent, state and image tokens and their
//                        positions (learned for latent and state, the 2-D
//                        sine embedding for image features)
//   nn::ActEncoder       one encoder layer over the tokens
//   nn::ActDecoderStart  (pre-norm: the encoder's final norm on the memory)
//                        appends the chunk's decoder rows [0 | learned pos]
//   nn::ActDecoder       one decoder layer: the chunk rows attend to each
//                        other and to the memory
//   nn::ActHead          the decoder's norm and the action head: one row per
//                        sample, [chunk * action_dim actions | mu | log sigma^2]
//   nn::ActLoss          per sample: sum over the chunk of |a_hat - a| where
//                        "action_is_pad" is 0, / (chunk * action_dim),
//                        + kl_weight * sum(-(1 + ls - mu^2 - exp(ls)) / 2);
//                        the count is the samples: LeRobot's means, exactly,
//                        over any micro-batch and rank split
//
// Batch tensors: "action" float [B, chunk, action_dim], "action_is_pad"
// [B, chunk] (int64, int32, uint8 or bool; 1 = padded), "observation.state"
// float [B, state_dim] when the model has a state, optional "latent_noise"
// float [B, latent] (eps; without it eps is drawn from the unit's random
// stream).
//
// Parameter names are LeRobot's (after "model."), so a state dict maps one
// to one. The units run on any device; their GPU path is compiled but not
// yet run on a GPU (docs/gpu.md): on a GPU they need DTRAIN_GPU_VISION=on.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/matrix.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/batch_inputs.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/positional_transformer.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::nn {

// The sizes every ACT unit shares.
struct ActShape {
  std::int64_t dim = 512;
  std::int64_t heads = 8;
  std::int64_t feedforward = 3200;
  float dropout = 0.1f;
  bool pre_norm = false;
  ffn_activation activation = ffn_activation::relu;
  std::int64_t chunk = 100;
  std::int64_t action_dim = 0;
  std::int64_t state_dim = 0;  // 0: no robot state
  std::int64_t latent = 32;
  bool use_vae = true;
  std::int64_t vae_layers = 4;
  float kl_weight = 10.f;
  std::int64_t cameras = 1;
  std::int64_t feature_channels = 512;  // the backbone's output channels
  std::int64_t feature_h = 3;           // and its feature map
  std::int64_t feature_w = 3;

  std::int64_t width() const { return 2 * dim; }
  std::int64_t tokens_1d() const { return 1 + (state_dim > 0 ? 1 : 0); }
  std::int64_t image_tokens() const { return cameras * feature_h * feature_w; }
  std::int64_t tokens() const { return tokens_1d() + image_tokens(); }
  std::int64_t vae_tokens() const { return 1 + (state_dim > 0 ? 1 : 0) + chunk; }
  std::int64_t output_width() const { return chunk * action_dim + 2 * latent; }
  PositionalLayerOptions layer() const { return {dim, heads, feedforward, dropout, pre_norm, activation}; }
};

namespace detail {

// dst rows (b * dst_per + dst_first + t), columns dst_col.. (+)= the same of
// src (zeros when src is null); run over batch * count * width.
template <Dtype T>
struct CopyBlock {
  const T* src;
  std::int64_t src_per, src_first, src_ld, src_col;
  T* dst;
  std::int64_t dst_per, dst_first, dst_ld, dst_col;
  std::int64_t count, width;
  bool add;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t c = n % width, t = (n / width) % count, b = n / (width * count);
    const T v = src != nullptr ? src[(b * src_per + src_first + t) * src_ld + src_col + c] : dtype_cast<T>(0.f);
    T& d = dst[(b * dst_per + dst_first + t) * dst_ld + dst_col + c];
    d = add ? dtype_cast<T>(static_cast<float>(d) + static_cast<float>(v)) : v;
  }
};

// CopyBlock a row at a time (the host's form): index i is (b, t), its
// `width` values copied in order. Run over batch * count.
template <Dtype T>
struct CopyBlockRows {
  CopyBlock<T> c;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t t = n % c.count, b = n / c.count;
    const T* src = c.src != nullptr ? c.src + (b * c.src_per + c.src_first + t) * c.src_ld + c.src_col : nullptr;
    T* dst = c.dst + (b * c.dst_per + c.dst_first + t) * c.dst_ld + c.dst_col;
    for (std::int64_t k = 0; k < c.width; ++k) {
      const float v = src != nullptr ? static_cast<float>(src[k]) : 0.f;
      dst[k] = c.add ? dtype_cast<T>(static_cast<float>(dst[k]) + v) : (src != nullptr ? src[k] : dtype_cast<T>(0.f));
    }
  }
  std::size_t work_per_index() const { return static_cast<std::size_t>(c.width); }
};

// One block of rows and columns of a [batch * per, ld] matrix.
template <class T>
struct Rows {
  T* base;
  std::int64_t per, first, ld, col;
};

template <class Dev, class T>
void copy_rows(Dev& dev, Rows<const T> src, Rows<T> dst, std::int64_t batch, std::int64_t count, std::int64_t width,
               bool add = false) {
  if (batch * count * width == 0) return;
  const CopyBlock<T> c{src.base,  src.per, src.first, src.ld, src.col, dst.base, dst.per,
                       dst.first, dst.ld,  dst.col,   count,  width,   add};
  if constexpr (Dev::host_accessible)
    dev.for_each(static_cast<std::size_t>(batch * count), CopyBlockRows<T>{c});
  else
    dev.for_each(static_cast<std::size_t>(batch * count * width), c);
}
// A contiguous [batch * count, width] block.
template <class T>
Rows<T> dense(T* base, std::int64_t count, std::int64_t width) {
  return {base, count, 0, width, 0};
}

// out[t, c] = sum over b of src rows (b * per + first + t), column col + c:
// an embedding's gradient from every sample; run over count * width.
template <Dtype T>
struct SumOverBatch {
  const T* src;
  std::int64_t per, first, ld, col, batch, width;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t t = n / width, c = n % width;
    float s = 0.f;
    for (std::int64_t b = 0; b < batch; ++b) s += static_cast<float>(src[(b * per + first + t) * ld + col + c]);
    out[n] = dtype_cast<T>(s);
  }
};

// out[c] = sum over b and t < count of src rows (b * per + first + t).
template <Dtype T>
struct SumRows {
  const T* src;
  std::int64_t per, first, ld, col, batch, count, width;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto c = static_cast<std::int64_t>(i);
    float s = 0.f;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t t = 0; t < count; ++t) s += static_cast<float>(src[(b * per + first + t) * ld + col + c]);
    out[c] = dtype_cast<T>(s);
  }
};

template <Dtype T>
struct FromFloat {
  const float* in;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { out[i] = dtype_cast<T>(in[i]); }
};

// Standard normal numbers from a stream (Box-Muller on two uniforms).
template <Dtype T>
struct NormalNoise {
  std::uint64_t stream;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const float u1 = dtrain::detail::uniform01(stream, 2 * i), u2 = dtrain::detail::uniform01(stream, 2 * i + 1);
    const float r = std::sqrt(-2.f * std::log(u1 > 1e-12f ? u1 : 1e-12f));
    out[i] = dtype_cast<T>(r * std::cos(6.283185307179586f * u2));
  }
};

// LeRobot's 1-D table: position t, column j: t / 10000^(2 (j / 2) / dim),
// sine on even j, cosine on odd; rows b * time + t (the same for every b).
template <Dtype T>
struct SineTable1d {
  T* out;
  std::int64_t time, dim;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t j = n % dim, t = (n / dim) % time;
    const double angle = static_cast<double>(t) / ::pow(10000.0, 2.0 * static_cast<double>(j / 2) / dim);
    out[n] = dtype_cast<T>(static_cast<float>(j % 2 == 0 ? ::sin(angle) : ::cos(angle)));
  }
};

// ACTSinusoidalPositionEmbedding2d over an h x w map, as token rows
// (h-major) of `dim` columns: the first dim / 2 from the row coordinate,
// the rest from the column's; within each half channel k is
// sin (k even) or cos (k odd) of coord / 10000^(2 (k / 2) / (dim / 2)), the
// coordinate (i + 1) / (h + 1e-6) * 2 pi. Written into rows of a packed
// matrix: token f of camera c of sample b at row b * per + first + c * h * w + f.
template <Dtype T>
struct SineTable2d {
  T* out;
  std::int64_t per, first, ld, col;
  std::int64_t cameras, h, w, dim;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t ch = n % dim, f = (n / dim) % (h * w), cam = (n / (dim * h * w)) % cameras;
    const std::int64_t b = n / (dim * h * w * cameras), half = dim / 2;
    const std::int64_t k = ch % half;
    const bool x_axis = ch >= half;
    const float pos = static_cast<float>(x_axis ? f % w + 1 : f / w + 1);
    const float extent = static_cast<float>(x_axis ? w : h);
    const float coord = pos / (extent + 1e-6f) * 6.2831853071795864769f;
    const float freq = static_cast<float>(::pow(10000.0, 2.0 * static_cast<double>(k / 2) / static_cast<double>(half)));
    const float a = coord / freq;
    out[(b * per + first + cam * h * w + f) * ld + col + ch] = dtype_cast<T>(k % 2 == 0 ? std::sin(a) : std::cos(a));
  }
};

// keep[b, t] for the VAE encoder's keys: 1 for the cls and state tokens,
// 1 - pad for the action tokens.
template <class M>
struct KeysFromPadding {
  const M* pad;
  std::int32_t* keep;
  std::int64_t lead, chunk;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t t = n % (lead + chunk), b = n / (lead + chunk);
    keep[n] = t < lead ? 1 : (pad[b * chunk + t - lead] != 0 ? 0 : 1);
  }
};

// Calls f(const M* pad) for the padding tensor's element type.
template <class F>
void with_padding(const DeviceTensor& t, const char* unit, F&& f) {
  switch (t.type) {
    case element_type::i64: return f(t.data<std::int64_t>());
    case element_type::i32: return f(t.data<std::int32_t>());
    case element_type::u8: return f(t.data<std::uint8_t>());
    case element_type::boolean: return f(reinterpret_cast<const std::uint8_t*>(t.device));
    default:
      throw config_error(std::string(unit) + ": \"action_is_pad\" holds " + std::string(element_name(t.type)),
                         "store action_is_pad as int64, int32, uint8 or bool (1 = padded)");
  }
}

// The latent: z = mu + exp(ls / 2) eps; pdf rows [mu | ls].
template <Dtype T>
struct Reparameterise {
  const T* pdf;
  const T* eps;
  T* z;
  std::int64_t latent;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t b = n / latent, l = n % latent;
    const float mu = static_cast<float>(pdf[b * 2 * latent + l]),
                ls = static_cast<float>(pdf[b * 2 * latent + latent + l]);
    z[n] = dtype_cast<T>(mu + std::exp(ls * 0.5f) * static_cast<float>(eps[n]));
  }
};
// d_pdf = d_stats (the KL's, from row 0) + the latent's: dmu += dz,
// dls += dz eps exp(ls / 2) / 2.
template <Dtype T>
struct ReparameteriseBackward {
  const T* pdf;
  const T* eps;
  const T* dz;
  T* d_pdf;  // holds the statistics' gradient on entry
  std::int64_t latent;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t b = n / latent, l = n % latent;
    const float ls = static_cast<float>(pdf[b * 2 * latent + latent + l]), g = static_cast<float>(dz[n]);
    T& dmu = d_pdf[b * 2 * latent + l];
    T& dls = d_pdf[b * 2 * latent + latent + l];
    dmu = dtype_cast<T>(static_cast<float>(dmu) + g);
    dls = dtype_cast<T>(static_cast<float>(dls) + g * static_cast<float>(eps[n]) * 0.5f * std::exp(ls * 0.5f));
  }
};

// y [rows, out] (ld ldy) = x [rows, in] W^T + b.
template <class Dev, class T>
void affine(Dev& dev, const T* x, std::int64_t rows, std::int64_t in, const T* w, const T* b, std::int64_t out, T* y,
            std::int64_t ldy) {
  if (rows == 0) return;
  if (b != nullptr) copy_rows(dev, Rows<const T>{b, 0, 0, 0, 0}, Rows<T>{y, rows, 0, ldy, 0}, 1, rows, out);
  dev.gemm(false, true, rows, out, in, 1.f, x, in, w, in, b != nullptr ? 1.f : 0.f, y, ldy);
}
// Its gradients: dW = dy^T x, db = column sums, dx = dy W (each skipped when null).
template <class Dev, class T>
void affine_backward(Dev& dev, const T* x, std::int64_t rows, std::int64_t in, const T* w, std::int64_t out,
                     const T* dy, std::int64_t lddy, T* dw, T* db, T* dx) {
  if (dw != nullptr) dev.gemm(true, false, out, in, rows, 1.f, dy, lddy, x, in, 0.f, dw, in);
  if (db != nullptr) dev.for_each(static_cast<std::size_t>(out), SumOverBatch<T>{dy, 1, 0, lddy, 0, rows, out, db});
  if (dx != nullptr) dev.gemm(false, false, rows, in, out, 1.f, dy, lddy, w, in, 0.f, dx, in);
}

template <class Dev, class T>
std::uint64_t unit_stream(const UnitContext<T>& ctx, std::uint64_t k) {
  return dtrain::detail::derive_stream(ctx.stream, k);
}

}  // namespace detail

// Backbone features -> packed rows 0 .. tokens (see the top of this file).
class ActTokens {
 public:
  explicit ActTokens(const ActShape& s) : s_(s) {
    if (s.use_vae) vae_.assign(static_cast<std::size_t>(s.vae_layers), PositionalEncoderLayer(s.layer()));
    if (s.dim % 4 != 0)
      throw config_error("nn::ActTokens: dim_model " + std::to_string(s.dim) + " is not a multiple of 4",
                         "the 2-D sine embedding splits dim_model in two even halves: choose a multiple of 4");
    if (2 * s.latent > 2 * s.dim)
      throw config_error("nn::ActTokens: latent_dim " + std::to_string(s.latent) + " exceeds dim_model",
                         "choose latent_dim <= dim_model");
  }

  const ActShape& shape() const { return s_; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    const auto linear = [&](const std::string& name, std::int64_t in, std::int64_t o) {
      const float bound = 1.f / std::sqrt(static_cast<float>(in));
      out.push_back({name + ".weight", {o, in}, Init::uniform(-bound, bound)});
      out.push_back({name + ".bias", {o}, Init::uniform(-bound, bound), true, {}, {"bias"}});
    };
    if (s_.use_vae) {
      for (std::size_t i = 0; i < vae_.size(); ++i)
        detail::append_params(out, "vae_encoder.layers." + std::to_string(i), vae_[i].params());
      if (s_.pre_norm) detail::append_params(out, "vae_encoder.norm", LayerNorm(s_.dim).params());
      out.push_back({"vae_encoder_cls_embed.weight", {1, s_.dim}, Init::normal(0.f, 1.f), true, {}, {"embedding"}});
      if (s_.state_dim > 0) linear("vae_encoder_robot_state_input_proj", s_.state_dim, s_.dim);
      linear("vae_encoder_action_input_proj", s_.action_dim, s_.dim);
      linear("vae_encoder_latent_output_proj", s_.dim, 2 * s_.latent);
    }
    if (s_.state_dim > 0) linear("encoder_robot_state_input_proj", s_.state_dim, s_.dim);
    linear("encoder_latent_input_proj", s_.latent, s_.dim);
    {
      const float bound = 1.f / std::sqrt(static_cast<float>(s_.feature_channels));
      out.push_back(
          {"encoder_img_feat_input_proj.weight", {s_.dim, s_.feature_channels, 1, 1}, Init::uniform(-bound, bound)});
      out.push_back({"encoder_img_feat_input_proj.bias", {s_.dim}, Init::uniform(-bound, bound), true, {}, {"bias"}});
    }
    out.push_back({"encoder_1d_feature_pos_embed.weight",
                   {s_.tokens_1d(), s_.dim},
                   Init::normal(0.f, 1.f),
                   true,
                   {},
                   {"embedding"}});
    return out;
  }

  std::int64_t out_features(std::int64_t in) const {
    detail::check_width("nn::ActTokens", in, s_.cameras * s_.feature_channels * s_.feature_h * s_.feature_w);
    return s_.width();
  }
  SeqShape out_shape(SeqShape in, SeqShape) const { return {in.rows(), 1 + s_.tokens()}; }

  std::int64_t saved_size(SeqShape in, std::int64_t) const { return layout(in.rows()).total; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::ActTokens");
    const std::int64_t B = x.rows, D = s_.dim, L = s_.latent, W = s_.width(), per = 1 + s_.tokens();
    const Layout l = layout(B);
    detail::check_saved("nn::ActTokens", ctx.saved.size(), l.total, "size the saved view with saved_size(shape, in)");
    T* sv = ctx.saved.data;
    const Params<const T> q = params_of(p);
    dev.zero(y.data, static_cast<std::size_t>(y.size()));
    const bool vae = s_.use_vae && ctx.training;
    T* pdf = sv + l.pdf;
    T* z = sv + l.z;
    if (s_.state_dim > 0) {
      const float* st = detail::batch_floats("nn::ActTokens", ctx.batch, "observation.state", B * s_.state_dim,
                                             "give the robot state [B, state_dim] as \"observation.state\"");
      dev.for_each(static_cast<std::size_t>(B * s_.state_dim), detail::FromFloat<T>{st, sv + l.state});
    }
    if (vae) {
      vae_forward(dev, q, B, sv, l, ctx);
      // z = mu + exp(ls / 2) eps
      T* eps = sv + l.eps;
      if (const DeviceTensor* n = ctx.batch == nullptr ? nullptr : ctx.batch->find("latent_noise"); n != nullptr) {
        const float* e = detail::batch_floats("nn::ActTokens", ctx.batch, "latent_noise", B * L,
                                              "give latent_noise as float [B, latent_dim]");
        dev.for_each(static_cast<std::size_t>(B * L), detail::FromFloat<T>{e, eps});
      } else {
        dev.for_each(static_cast<std::size_t>(B * L), detail::NormalNoise<T>{detail::unit_stream<Dev>(ctx, 7), eps});
      }
      dev.for_each(static_cast<std::size_t>(B * L), detail::Reparameterise<T>{pdf, eps, z, L});
      // the statistics row
      detail::copy_rows(dev, detail::Rows<const T>{pdf, 1, 0, 2 * L, 0}, detail::Rows<T>{y.data, per, 0, W, 0}, B, 1,
                        2 * L);
    } else {
      dev.zero(z, static_cast<std::size_t>(B * L));
    }
    // latent token (row 1), state token (row 2)
    detail::affine(dev, static_cast<const T*>(z), B, L, q.latent_w, q.latent_b, D, y.data + W, per * W);
    if (s_.state_dim > 0)
      detail::affine(dev, static_cast<const T*>(sv + l.state), B, s_.state_dim, q.state_w, q.state_b, D, y.data + 2 * W,
                     per * W);
    // the learned positions of the 1-D tokens
    detail::copy_rows(dev, detail::Rows<const T>{q.pos1d, 0, 0, D, 0}, detail::Rows<T>{y.data, per, 1, W, D}, B,
                      s_.tokens_1d(), D);
    // image tokens: per image, features [channels, h w] -> [h w, dim]
    const std::int64_t F = s_.feature_h * s_.feature_w, C = s_.feature_channels, first = 1 + s_.tokens_1d();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t cam = 0; cam < s_.cameras; ++cam) {
        T* out = y.data + (b * per + first + cam * F) * W;
        detail::copy_rows(dev, detail::Rows<const T>{q.img_b, 0, 0, 0, 0}, detail::Rows<T>{out, F, 0, W, 0}, 1, F, D);
        dev.gemm(true, true, F, D, C, 1.f, x.data + (b * s_.cameras + cam) * C * F, F, q.img_w, C, 1.f, out, W);
      }
    dev.for_each(static_cast<std::size_t>(B * s_.image_tokens() * D),
                 detail::SineTable2d<T>{y.data, per, first, W, D, s_.cameras, s_.feature_h, s_.feature_w, D});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const std::int64_t B = x.rows, D = s_.dim, L = s_.latent, W = s_.width(), per = 1 + s_.tokens();
    const Layout l = layout(B);
    T* sv = ctx.saved.data;
    const Params<const T> q = params_of(p);
    const Params<T> g = params_of(grad);
    const bool vae = s_.use_vae && ctx.training;
    // positions of the 1-D tokens
    if (g.pos1d != nullptr)
      dev.for_each(static_cast<std::size_t>(s_.tokens_1d() * D),
                   detail::SumOverBatch<T>{dy.data, per, 1, W, D, B, D, g.pos1d});
    // latent token: dz = d W
    T* dz = sv + l.dz;
    detail::affine_backward(dev, static_cast<const T*>(sv + l.z), B, L, q.latent_w, D, dy.data + W, per * W, g.latent_w,
                            g.latent_b, vae ? dz : static_cast<T*>(nullptr));
    if (s_.state_dim > 0)
      detail::affine_backward(dev, static_cast<const T*>(sv + l.state), B, s_.state_dim, q.state_w, D, dy.data + 2 * W,
                              per * W, g.state_w, g.state_b, static_cast<T*>(nullptr));
    // image tokens
    const std::int64_t F = s_.feature_h * s_.feature_w, C = s_.feature_channels, first = 1 + s_.tokens_1d();
    bool started = false;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t cam = 0; cam < s_.cameras; ++cam) {
        const T* d_tok = dy.data + (b * per + first + cam * F) * W;
        const T* img = x.data + (b * s_.cameras + cam) * C * F;
        if (g.img_w != nullptr) dev.gemm(true, true, D, C, F, 1.f, d_tok, W, img, F, started ? 1.f : 0.f, g.img_w, C);
        started = true;
        if (!dx.empty())
          dev.gemm(true, true, C, F, D, 1.f, q.img_w, C, d_tok, W, 0.f, dx.data + (b * s_.cameras + cam) * C * F, F);
      }
    if (g.img_b != nullptr)
      dev.for_each(static_cast<std::size_t>(D),
                   detail::SumRows<T>{dy.data, per, first, W, 0, B, s_.image_tokens(), D, g.img_b});
    if (vae) {
      // d_pdf = the statistics row's gradient, plus the latent's
      T* d_pdf = sv + l.d_pdf;
      detail::copy_rows(dev, detail::Rows<const T>{dy.data, per, 0, W, 0}, detail::dense(d_pdf, 1, 2 * L), B, 1, 2 * L);
      dev.for_each(static_cast<std::size_t>(B * L),
                   detail::ReparameteriseBackward<T>{sv + l.pdf, sv + l.eps, dz, d_pdf, L});
      vae_backward(dev, q, g, B, sv, l, ctx);
    } else if (s_.use_vae) {
      // outside training the VAE does not run: zero gradients for its parameters
      for (std::size_t i = 0; i < vae_param_count(); ++i)
        if (!grad[i].empty()) dev.zero(grad[i].data, static_cast<std::size_t>(grad[i].size()));
    }
  }

 private:
  template <class T>
  struct Params {
    std::vector<UnitParams<T>> layers;
    UnitParams<T> vae_norm;
    T* cls = nullptr;
    T* vstate_w = nullptr;
    T* vstate_b = nullptr;
    T* vaction_w = nullptr;
    T* vaction_b = nullptr;
    T* pdf_w = nullptr;
    T* pdf_b = nullptr;
    T* state_w = nullptr;
    T* state_b = nullptr;
    T* latent_w = nullptr;
    T* latent_b = nullptr;
    T* img_w = nullptr;
    T* img_b = nullptr;
    T* pos1d = nullptr;
  };
  template <class T>
  Params<T> params_of(UnitParams<T> p) const {
    Params<T> q;
    std::size_t i = 0;
    const auto next = [&] { return p[i++].data; };
    if (s_.use_vae) {
      for (std::size_t k = 0; k < vae_.size(); ++k) {
        q.layers.push_back(p.subspan(i, 12));
        i += 12;
      }
      if (s_.pre_norm) {
        q.vae_norm = p.subspan(i, 2);
        i += 2;
      }
      q.cls = next();
      if (s_.state_dim > 0) {
        q.vstate_w = next();
        q.vstate_b = next();
      }
      q.vaction_w = next();
      q.vaction_b = next();
      q.pdf_w = next();
      q.pdf_b = next();
    }
    if (s_.state_dim > 0) {
      q.state_w = next();
      q.state_b = next();
    }
    q.latent_w = next();
    q.latent_b = next();
    q.img_w = next();
    q.img_b = next();
    q.pos1d = next();
    return q;
  }

  // Offsets into the saved view (elements of T).
  struct Layout {
    std::int64_t state, action, eps, z, dz, pdf, d_pdf, keep, tokens, pos, outs, layer_saved, normed, scratch, dtok,
        dtok2, total;
  };
  Layout layout(std::int64_t B) const {
    const std::int64_t D = s_.dim, L = s_.latent, Tv = s_.vae_tokens(), n = B * Tv * D;
    Layout l{};
    std::int64_t at = 0;
    const auto take = [&](std::int64_t k) {
      const std::int64_t o = at;
      at += k;
      return o;
    };
    // the key mask first: int32 on the saved view's alignment
    l.keep = take(s_.use_vae ? 2 * B * Tv : 0);
    l.state = take(B * s_.state_dim);
    l.z = take(B * L);
    if (s_.use_vae) {
      const std::int64_t layers = static_cast<std::int64_t>(vae_.size());
      const std::int64_t one = layers > 0 ? vae_[0].saved_size(B, Tv) : 0;
      const std::int64_t scratch = layers > 0 ? vae_[0].scratch_size(B, Tv) : 0;
      l.action = take(B * s_.chunk * s_.action_dim);
      l.eps = take(B * L);
      l.dz = take(B * L);
      l.pdf = take(B * 2 * L);
      l.d_pdf = take(B * 2 * L);
      l.tokens = take(n);
      l.pos = take(n);
      l.outs = take(n * layers);
      l.layer_saved = take(one * layers);
      l.normed = take(s_.pre_norm ? n : 0);
      l.dtok = take(n);
      l.dtok2 = take(n);
      l.scratch = take(scratch);
    }
    l.total = at;
    return l;
  }

  template <class Dev, class T>
  void vae_forward(Dev& dev, const Params<const T>& q, std::int64_t B, T* sv, const Layout& l,
                   const UnitContext<T>& ctx) {
    const std::int64_t D = s_.dim, Tv = s_.vae_tokens(), lead = Tv - s_.chunk, A = s_.action_dim;
    const float* act = detail::batch_floats("nn::ActTokens", ctx.batch, "action", B * s_.chunk * A,
                                            "give the action chunk [B, chunk_size, action_dim] as \"action\"");
    dev.for_each(static_cast<std::size_t>(B * s_.chunk * A), detail::FromFloat<T>{act, sv + l.action});
    const DeviceTensor* pad = ctx.batch->find("action_is_pad");
    if (pad == nullptr)
      throw config_error("nn::ActTokens: the batch has no \"action_is_pad\"",
                         "give action_is_pad [B, chunk_size] (1 where the episode ended before the chunk)");
    if (pad->numel() != B * s_.chunk)
      throw config_error("nn::ActTokens: \"action_is_pad\" holds " + std::to_string(pad->numel()) + " values " +
                             shape_text(pad->shape) + ", the model needs " + std::to_string(B * s_.chunk),
                         "give action_is_pad [B, chunk_size]");
    auto* keep = reinterpret_cast<std::int32_t*>(sv + l.keep);
    detail::with_padding(*pad, "nn::ActTokens", [&](const auto* m) {
      using M = std::remove_cvref_t<decltype(*m)>;
      dev.for_each(static_cast<std::size_t>(B * Tv), detail::KeysFromPadding<M>{m, keep, lead, s_.chunk});
    });
    // tokens: cls, state, actions
    T* tok = sv + l.tokens;
    for (std::int64_t b = 0; b < B; ++b)
      detail::copy_rows(dev, detail::dense(q.cls, 1, D), detail::Rows<T>{tok + b * Tv * D, 0, 0, D, 0}, 1, 1, D);
    if (s_.state_dim > 0)
      detail::affine(dev, static_cast<const T*>(sv + l.state), B, s_.state_dim, q.vstate_w, q.vstate_b, D, tok + D,
                     Tv * D);
    for (std::int64_t b = 0; b < B; ++b)
      detail::affine(dev, static_cast<const T*>(sv + l.action + b * s_.chunk * A), s_.chunk, A, q.vaction_w,
                     q.vaction_b, D, tok + (b * Tv + lead) * D, D);
    dev.for_each(static_cast<std::size_t>(B * Tv * D), detail::SineTable1d<T>{sv + l.pos, Tv, D});
    const std::int64_t n = B * Tv * D, one = vae_.empty() ? 0 : vae_[0].saved_size(B, Tv);
    const T* in = tok;
    for (std::size_t i = 0; i < vae_.size(); ++i) {
      T* out = sv + l.outs + static_cast<std::int64_t>(i) * n;
      vae_[i].forward<Dev, T>(dev, q.layers[i], B, Tv, in, sv + l.pos, keep, out,
                              sv + l.layer_saved + static_cast<std::int64_t>(i) * one, true,
                              detail::unit_stream<Dev>(ctx, 100 + i));
      in = out;
    }
    if (s_.pre_norm) {
      LayerNorm(D).forward<Dev, T>(dev, q.vae_norm, {in, B * Tv, D}, {sv + l.normed, B * Tv, D});
      in = sv + l.normed;
    }
    // the cls token's output (row 0 of each sample, Tv * D apart) -> [mu | ls]
    const std::int64_t L2 = 2 * s_.latent;
    detail::copy_rows(dev, detail::Rows<const T>{q.pdf_b, 0, 0, 0, 0}, detail::dense(sv + l.pdf, 1, L2), B, 1, L2);
    dev.gemm(false, true, B, L2, D, 1.f, in, Tv * D, q.pdf_w, D, 1.f, sv + l.pdf, L2);
  }

  template <class Dev, class T>
  void vae_backward(Dev& dev, const Params<const T>& q, const Params<T>& g, std::int64_t B, T* sv, const Layout& l,
                    const UnitContext<T>& ctx) {
    const std::int64_t D = s_.dim, Tv = s_.vae_tokens(), lead = Tv - s_.chunk, A = s_.action_dim;
    const std::int64_t n = B * Tv * D, one = vae_.empty() ? 0 : vae_[0].saved_size(B, Tv);
    // d_out of the encoder: only the cls rows
    T* d = sv + l.dtok;
    T* d2 = sv + l.dtok2;
    dev.zero(d, static_cast<std::size_t>(n));
    pdf_backward(dev, q, g, B, sv, l, d);
    if (s_.pre_norm) {
      const T* before = vae_.empty() ? sv + l.tokens : sv + l.outs + (vae_.size() - 1) * n;
      LayerNorm(D).backward<Dev, T>(dev, q.vae_norm, g.vae_norm, {before, B * Tv, D}, {sv + l.normed, B * Tv, D},
                                    {d, B * Tv, D}, {d2, B * Tv, D});
      std::swap(d, d2);
    }
    for (std::size_t k = vae_.size(); k-- > 0;) {
      const T* in = k == 0 ? sv + l.tokens : sv + l.outs + static_cast<std::int64_t>(k - 1) * n;
      const T* out = sv + l.outs + static_cast<std::int64_t>(k) * n;
      vae_[k].backward<Dev, T>(dev, q.layers[k], g.layers[k], B, Tv, in, sv + l.pos,
                               reinterpret_cast<const std::int32_t*>(sv + l.keep), out, d, d2, nullptr,
                               sv + l.layer_saved + static_cast<std::int64_t>(k) * one, sv + l.scratch, true,
                               detail::unit_stream<Dev>(ctx, 100 + k));
      std::swap(d, d2);
    }
    // d now holds the tokens' gradient: cls, state, actions
    if (g.cls != nullptr)
      dev.for_each(static_cast<std::size_t>(D), detail::SumOverBatch<T>{d, Tv, 0, D, 0, B, D, g.cls});
    if (s_.state_dim > 0)
      detail::affine_backward(dev, static_cast<const T*>(sv + l.state), B, s_.state_dim, q.vstate_w, D, d + D, Tv * D,
                              g.vstate_w, g.vstate_b, static_cast<T*>(nullptr));
    // the action tokens: gather to [B chunk, D], one GEMM
    T* da = d2;
    detail::copy_rows(dev, detail::Rows<const T>{d, Tv, lead, D, 0}, detail::dense(da, s_.chunk, D), B, s_.chunk, D);
    detail::affine_backward(dev, static_cast<const T*>(sv + l.action), B * s_.chunk, A, q.vaction_w, D, da, D,
                            g.vaction_w, g.vaction_b, static_cast<T*>(nullptr));
  }

  // [mu | ls] = cls rows W^T + b: d_pdf -> the pdf parameters' gradients and
  // the cls rows' (d, rows b * Tv).
  template <class Dev, class T>
  void pdf_backward(Dev& dev, const Params<const T>& q, const Params<T>& g, std::int64_t B, T* sv, const Layout& l,
                    T* d) {
    const std::int64_t D = s_.dim, Tv = s_.vae_tokens(), L2 = 2 * s_.latent;
    const T* in =
        s_.pre_norm ? sv + l.normed : (vae_.empty() ? sv + l.tokens : sv + l.outs + (vae_.size() - 1) * B * Tv * D);
    if (g.pdf_w != nullptr) dev.gemm(true, false, L2, D, B, 1.f, sv + l.d_pdf, L2, in, Tv * D, 0.f, g.pdf_w, D);
    if (g.pdf_b != nullptr)
      dev.for_each(static_cast<std::size_t>(L2), detail::SumOverBatch<T>{sv + l.d_pdf, 1, 0, L2, 0, B, L2, g.pdf_b});
    dev.gemm(false, false, B, D, L2, 1.f, sv + l.d_pdf, L2, q.pdf_w, D, 0.f, d, Tv * D);
  }

  std::size_t vae_param_count() const {
    return 12 * vae_.size() + (s_.pre_norm ? 2 : 0) + 1 + (s_.state_dim > 0 ? 2 : 0) + 4;
  }

  ActShape s_;
  std::vector<PositionalEncoderLayer> vae_;
};

// One encoder layer over the packed tokens (rows 1 .. tokens of each sample);
// the statistics row and the positions pass through.
class ActEncoder {
 public:
  explicit ActEncoder(const ActShape& s) : s_(s), layer_(s.layer()) {}

  std::vector<ParamSpec> params() const { return layer_.params(); }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::ActEncoder", in, s_.width()); }
  // x, pos, y (gathered), the layer's, its scratch, dy, dx, d_pos
  std::int64_t saved_size(SeqShape in, std::int64_t) const {
    const std::int64_t B = in.batch, n = B * s_.tokens() * s_.dim;
    return 6 * n + layer_.saved_size(B, s_.tokens()) + layer_.scratch_size(B, s_.tokens());
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::ActEncoder");
    const std::int64_t B = ctx.shape.batch, T_ = s_.tokens(), D = s_.dim, W = s_.width(), per = 1 + T_;
    detail::check_saved("nn::ActEncoder", ctx.saved.size(), saved_size(ctx.shape, W),
                        "size the saved view with saved_size(shape, in)");
    const Buffers<T> b = carve(ctx.saved.data, B);
    detail::copy_rows(dev, detail::Rows<const T>{x.data, per, 1, W, 0}, detail::dense(b.x, T_, D), B, T_, D);
    detail::copy_rows(dev, detail::Rows<const T>{x.data, per, 1, W, D}, detail::dense(b.pos, T_, D), B, T_, D);
    layer_.forward<Dev, T>(dev, p, B, T_, b.x, b.pos, nullptr, b.y, b.layer, ctx.training,
                           detail::unit_stream<Dev>(ctx, 0));
    dev.copy(y.data, x.data, static_cast<std::size_t>(x.size()));
    detail::copy_rows(dev, detail::dense(static_cast<const T*>(b.y), T_, D), detail::Rows<T>{y.data, per, 1, W, 0}, B,
                      T_, D);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    (void)x;
    const std::int64_t B = ctx.shape.batch, T_ = s_.tokens(), D = s_.dim, W = s_.width(), per = 1 + T_;
    const Buffers<T> b = carve(ctx.saved.data, B);
    detail::copy_rows(dev, detail::Rows<const T>{dy.data, per, 1, W, 0}, detail::dense(b.dy, T_, D), B, T_, D);
    layer_.backward<Dev, T>(dev, p, grad, B, T_, b.x, b.pos, nullptr, b.y, b.dy, b.dx, b.dpos, b.layer, b.scratch,
                            ctx.training, detail::unit_stream<Dev>(ctx, 0));
    if (dx.empty()) return;
    dev.copy(dx.data, dy.data, static_cast<std::size_t>(dy.size()));
    detail::copy_rows(dev, detail::dense(static_cast<const T*>(b.dx), T_, D), detail::Rows<T>{dx.data, per, 1, W, 0}, B,
                      T_, D);
    detail::copy_rows(dev, detail::dense(static_cast<const T*>(b.dpos), T_, D), detail::Rows<T>{dx.data, per, 1, W, D},
                      B, T_, D, true);
  }

 private:
  template <class T>
  struct Buffers {
    T *x, *pos, *y, *dy, *dx, *dpos, *layer, *scratch;
  };
  template <class T>
  Buffers<T> carve(T* at, std::int64_t B) const {
    const std::int64_t n = B * s_.tokens() * s_.dim;
    nn::detail::Carve<T> c(at);
    Buffers<T> b{};
    b.x = c.take(n);
    b.pos = c.take(n);
    b.y = c.take(n);
    b.dy = c.take(n);
    b.dx = c.take(n);
    b.dpos = c.take(n);
    b.layer = c.take(layer_.saved_size(B, s_.tokens()));
    b.scratch = c.take(0);
    return b;
  }

  ActShape s_;
  PositionalEncoderLayer layer_;
};

// The memory's final norm (pre-norm only: LeRobot's encoder.norm) and the
// decoder's rows: [0 | decoder_pos_embed] for each of the chunk's steps.
class ActDecoderStart {
 public:
  explicit ActDecoderStart(const ActShape& s) : s_(s), norm_(s.dim) {}

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    if (s_.pre_norm) nn::detail::append_params(out, "encoder.norm", norm_.params());
    out.push_back({"decoder_pos_embed.weight", {s_.chunk, s_.dim}, Init::normal(0.f, 1.f), true, {}, {"embedding"}});
    return out;
  }
  std::int64_t out_features(std::int64_t in) const {
    return detail::check_width("nn::ActDecoderStart", in, s_.width());
  }
  SeqShape out_shape(SeqShape in, SeqShape) const { return {in.batch, 1 + s_.tokens() + s_.chunk}; }
  // pre-norm: the memory gathered, normed, and their gradients
  std::int64_t saved_size(SeqShape in, std::int64_t) const {
    return s_.pre_norm ? 4 * in.batch * s_.tokens() * s_.dim : 0;
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const std::int64_t B = ctx.shape.batch, T_ = s_.tokens(), D = s_.dim, W = s_.width(), in_per = 1 + T_;
    const std::int64_t per = in_per + s_.chunk, n = B * T_ * D;
    detail::copy_rows(dev, detail::Rows<const T>{x.data, in_per, 0, W, 0}, detail::Rows<T>{y.data, per, 0, W, 0}, B,
                      in_per, W);
    if (s_.pre_norm) {
      T* m = ctx.saved.data;
      detail::copy_rows(dev, detail::Rows<const T>{x.data, in_per, 1, W, 0}, detail::dense(m, T_, D), B, T_, D);
      norm_.forward<Dev, T>(dev, p.subspan(0, 2), {m, B * T_, D}, {m + n, B * T_, D});
      detail::copy_rows(dev, detail::dense(static_cast<const T*>(m + n), T_, D), detail::Rows<T>{y.data, per, 1, W, 0},
                        B, T_, D);
    }
    const T* pos = p[s_.pre_norm ? 2 : 0].data;
    detail::copy_rows(dev, detail::Rows<const T>{pos, 0, 0, D, 0}, detail::Rows<T>{y.data, per, in_per, W, D}, B,
                      s_.chunk, D);
    detail::copy_rows(dev, detail::Rows<const T>{nullptr, 0, 0, 0, 0}, detail::Rows<T>{y.data, per, in_per, W, 0}, B,
                      s_.chunk, D);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const std::int64_t B = ctx.shape.batch, T_ = s_.tokens(), D = s_.dim, W = s_.width(), in_per = 1 + T_;
    const std::int64_t per = in_per + s_.chunk, n = B * T_ * D;
    T* gpos = grad[s_.pre_norm ? 2 : 0].data;
    if (gpos != nullptr)
      dev.for_each(static_cast<std::size_t>(s_.chunk * D),
                   detail::SumOverBatch<T>{dy.data, per, in_per, W, D, B, D, gpos});
    if (!dx.empty())
      detail::copy_rows(dev, detail::Rows<const T>{dy.data, per, 0, W, 0}, detail::Rows<T>{dx.data, in_per, 0, W, 0}, B,
                        in_per, W);
    if (s_.pre_norm) {
      T* m = ctx.saved.data;
      T* dm = m + 2 * n;
      detail::copy_rows(dev, detail::Rows<const T>{x.data, in_per, 1, W, 0}, detail::dense(m, T_, D), B, T_, D);
      detail::copy_rows(dev, detail::Rows<const T>{dy.data, per, 1, W, 0}, detail::dense(dm, T_, D), B, T_, D);
      norm_.backward<Dev, T>(dev, p.subspan(0, 2), grad.subspan(0, 2), {m, B * T_, D}, {m + n, B * T_, D},
                             {dm, B * T_, D}, {dm + n, B * T_, D});
      if (!dx.empty())
        detail::copy_rows(dev, detail::dense(static_cast<const T*>(dm + n), T_, D),
                          detail::Rows<T>{dx.data, in_per, 1, W, 0}, B, T_, D);
    }
  }

 private:
  ActShape s_;
  LayerNorm norm_;
};

// One decoder layer: the chunk rows attend to each other and to the memory.
class ActDecoder {
 public:
  explicit ActDecoder(const ActShape& s) : s_(s), layer_(s.layer()) {}

  std::vector<ParamSpec> params() const { return layer_.params(); }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::ActDecoder", in, s_.width()); }
  std::int64_t saved_size(SeqShape in, std::int64_t) const {
    const std::int64_t B = in.batch, n = B * s_.chunk * s_.dim, m = B * s_.tokens() * s_.dim;
    return 6 * n + 4 * m + layer_.saved_size(B, s_.chunk, s_.tokens()) + layer_.scratch_size(B, s_.chunk, s_.tokens());
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::ActDecoder");
    const std::int64_t B = ctx.shape.batch, T_ = s_.tokens(), C = s_.chunk, D = s_.dim, W = s_.width();
    const std::int64_t per = 1 + T_ + C;
    detail::check_saved("nn::ActDecoder", ctx.saved.size(), saved_size(ctx.shape, W),
                        "size the saved view with saved_size(shape, in)");
    const Buffers<T> b = carve(ctx.saved.data, B);
    gather(dev, x.data, b, B);
    layer_.forward<Dev, T>(dev, p, B, C, T_, b.x, b.qpos, b.mem, b.mpos, b.y, b.layer, ctx.training,
                           detail::unit_stream<Dev>(ctx, 0));
    dev.copy(y.data, x.data, static_cast<std::size_t>(x.size()));
    detail::copy_rows(dev, detail::dense(static_cast<const T*>(b.y), C, D), detail::Rows<T>{y.data, per, 1 + T_, W, 0},
                      B, C, D);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T>, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const std::int64_t B = ctx.shape.batch, T_ = s_.tokens(), C = s_.chunk, D = s_.dim, W = s_.width();
    const std::int64_t per = 1 + T_ + C;
    const Buffers<T> b = carve(ctx.saved.data, B);
    detail::copy_rows(dev, detail::Rows<const T>{dy.data, per, 1 + T_, W, 0}, detail::dense(b.dy, C, D), B, C, D);
    layer_.backward<Dev, T>(dev, p, grad, B, C, T_, b.x, b.mem, b.y, b.dy, b.dx, b.dqpos, b.dmem, b.dmpos, b.layer,
                            b.scratch, ctx.training, detail::unit_stream<Dev>(ctx, 0));
    if (dx.empty()) return;
    dev.copy(dx.data, dy.data, static_cast<std::size_t>(dy.size()));
    const auto put = [&](const T* src, std::int64_t first, std::int64_t count, std::int64_t col, bool add) {
      detail::copy_rows(dev, detail::dense(src, count, D), detail::Rows<T>{dx.data, per, first, W, col}, B, count, D,
                        add);
    };
    put(b.dx, 1 + T_, C, 0, false);
    put(b.dqpos, 1 + T_, C, D, true);
    put(b.dmem, 1, T_, 0, true);
    put(b.dmpos, 1, T_, D, true);
  }

 private:
  template <class T>
  struct Buffers {
    T *x, *qpos, *y, *dy, *dx, *dqpos, *mem, *mpos, *dmem, *dmpos, *layer, *scratch;
  };
  template <class T>
  Buffers<T> carve(T* at, std::int64_t B) const {
    const std::int64_t n = B * s_.chunk * s_.dim, m = B * s_.tokens() * s_.dim;
    nn::detail::Carve<T> c(at);
    Buffers<T> b{};
    b.x = c.take(n);
    b.qpos = c.take(n);
    b.y = c.take(n);
    b.dy = c.take(n);
    b.dx = c.take(n);
    b.dqpos = c.take(n);
    b.mem = c.take(m);
    b.mpos = c.take(m);
    b.dmem = c.take(m);
    b.dmpos = c.take(m);
    b.layer = c.take(layer_.saved_size(B, s_.chunk, s_.tokens()));
    b.scratch = c.take(0);
    return b;
  }
  template <class Dev, class T>
  void gather(Dev& dev, const T* x, const Buffers<T>& b, std::int64_t B) const {
    const std::int64_t T_ = s_.tokens(), C = s_.chunk, D = s_.dim, W = s_.width(), per = 1 + T_ + C;
    detail::copy_rows(dev, detail::Rows<const T>{x, per, 1 + T_, W, 0}, detail::dense(b.x, C, D), B, C, D);
    detail::copy_rows(dev, detail::Rows<const T>{x, per, 1 + T_, W, D}, detail::dense(b.qpos, C, D), B, C, D);
    detail::copy_rows(dev, detail::Rows<const T>{x, per, 1, W, 0}, detail::dense(b.mem, T_, D), B, T_, D);
    detail::copy_rows(dev, detail::Rows<const T>{x, per, 1, W, D}, detail::dense(b.mpos, T_, D), B, T_, D);
  }

  ActShape s_;
  PositionalDecoderLayer layer_;
};

// The decoder's final norm and the action head: one row per sample,
// [chunk * action_dim actions | mu | log sigma^2].
class ActHead {
 public:
  explicit ActHead(const ActShape& s) : s_(s), norm_(s.dim), head_(s.dim, s.action_dim) {}

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    nn::detail::append_params(out, "decoder.norm", norm_.params());
    nn::detail::append_params(out, "action_head", head_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const {
    detail::check_width("nn::ActHead", in, s_.width());
    return s_.output_width();
  }
  SeqShape out_shape(SeqShape in, SeqShape) const { return {in.batch, 1}; }
  // the decoder rows, normed, the actions, and the gradients of each
  std::int64_t saved_size(SeqShape in, std::int64_t) const {
    const std::int64_t rows = in.batch * s_.chunk;
    return 4 * rows * s_.dim + 2 * rows * s_.action_dim;
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const std::int64_t B = ctx.shape.batch, C = s_.chunk, D = s_.dim, A = s_.action_dim, L2 = 2 * s_.latent;
    const std::int64_t per = 1 + s_.tokens() + C, first = 1 + s_.tokens(), rows = B * C, OW = s_.output_width();
    T* h = ctx.saved.data;
    T* n = h + rows * D;
    T* a = n + rows * D;
    detail::copy_rows(dev, detail::Rows<const T>{x.data, per, first, s_.width(), 0}, detail::dense(h, C, D), B, C, D);
    norm_.forward<Dev, T>(dev, p.subspan(0, 2), {h, rows, D}, {n, rows, D});
    head_.forward<Dev, T>(dev, p.subspan(2, 2), {n, rows, D}, {a, rows, A});
    detail::copy_rows(dev, detail::dense(static_cast<const T*>(a), 1, C * A), detail::Rows<T>{y.data, 1, 0, OW, 0}, B,
                      1, C * A);
    detail::copy_rows(dev, detail::Rows<const T>{x.data, per, 0, s_.width(), 0},
                      detail::Rows<T>{y.data, 1, 0, OW, C * A}, B, 1, L2);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T>, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const std::int64_t B = ctx.shape.batch, C = s_.chunk, D = s_.dim, A = s_.action_dim, L2 = 2 * s_.latent;
    const std::int64_t per = 1 + s_.tokens() + C, first = 1 + s_.tokens(), rows = B * C, OW = s_.output_width();
    T* h = ctx.saved.data;
    T* n = h + rows * D;
    T* a = n + rows * D;
    T* da = a + rows * A;
    T* dn = da + rows * A;
    T* dh = dn + rows * D;
    detail::copy_rows(dev, detail::Rows<const T>{dy.data, 1, 0, OW, 0}, detail::dense(da, 1, C * A), B, 1, C * A);
    head_.backward<Dev, T>(dev, p.subspan(2, 2), grad.subspan(2, 2), {n, rows, D}, {a, rows, A}, {da, rows, A},
                           {dn, rows, D});
    norm_.backward<Dev, T>(dev, p.subspan(0, 2), grad.subspan(0, 2), {h, rows, D}, {n, rows, D}, {dn, rows, D},
                           {dh, rows, D});
    if (dx.empty()) return;
    dev.zero(dx.data, static_cast<std::size_t>(dx.size()));
    detail::copy_rows(dev, detail::dense(static_cast<const T*>(dh), C, D),
                      detail::Rows<T>{dx.data, per, first, s_.width(), 0}, B, C, D);
    detail::copy_rows(dev, detail::Rows<const T>{dy.data, 1, 0, OW, C * A},
                      detail::Rows<T>{dx.data, per, 0, s_.width(), 0}, B, 1, L2);
  }

 private:
  ActShape s_;
  LayerNorm norm_;
  Linear head_;
};

namespace detail {

template <class T, class M>
struct ActRowLoss {
  const T* y;
  const float* action;
  const M* pad;
  std::int64_t chunk, action_dim, latent, width;
  float kl_weight;
  std::size_t work_per_index() const { return static_cast<std::size_t>(width); }
  DTRAIN_HOST_DEVICE double operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    const T* row = y + r * width;
    double l1 = 0.0;
    for (std::int64_t c = 0; c < chunk; ++c) {
      if (pad[r * chunk + c] != 0) continue;
      for (std::int64_t a = 0; a < action_dim; ++a) {
        const double d =
            static_cast<double>(static_cast<float>(row[c * action_dim + a])) - action[(r * chunk + c) * action_dim + a];
        l1 += d < 0 ? -d : d;
      }
    }
    double kl = 0.0;
    for (std::int64_t l = 0; l < latent; ++l) {
      const double mu = static_cast<float>(row[chunk * action_dim + l]);
      const double ls = static_cast<float>(row[chunk * action_dim + latent + l]);
      kl += -0.5 * (1.0 + ls - mu * mu - ::exp(ls));
    }
    return l1 / static_cast<double>(chunk * action_dim) + kl_weight * kl;
  }
};

template <class T, class M>
struct ActLossGrad {
  const T* y;
  const float* action;
  const M* pad;
  T* dy;
  std::int64_t chunk, action_dim, latent, width;
  float kl_weight, scale;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t r = n / width, c = n % width, acts = chunk * action_dim;
    const float v = static_cast<float>(y[n]);
    float g;
    if (c < acts) {
      const float d = v - action[r * acts + c];
      const bool padded = pad[r * chunk + c / action_dim] != 0;
      g = padded ? 0.f : (d > 0.f ? 1.f : (d < 0.f ? -1.f : 0.f)) / static_cast<float>(acts);
    } else if (c < acts + latent) {
      g = kl_weight * v;  // d/d mu of -(1 + ls - mu^2 - e^ls) / 2
    } else {
      g = kl_weight * 0.5f * (std::exp(v) - 1.f);  // d/d ls
    }
    dy[n] = dtype_cast<T>(g * scale);
  }
};

}  // namespace detail

// LeRobot's ACT loss over nn::ActHead's rows (see the top of this file).
class ActLoss {
 public:
  ActLoss() = default;
  explicit ActLoss(const ActShape& s) : s_(s) {}

  double count(const Batch& batch) const { return static_cast<double>(batch.at("action").dim(0)); }

  template <class Dev, class T>
  double forward(Dev& dev, MatView<const T> y, const DeviceBatch& batch) {
    const float* action = inputs(y, batch);
    double total = 0;
    detail::with_padding(batch.at("action_is_pad"), "nn::ActLoss", [&](const auto* pad) {
      using M = std::remove_cvref_t<decltype(*pad)>;
      total = dev.sum(static_cast<std::size_t>(y.rows),
                      detail::ActRowLoss<T, M>{y.data, action, pad, s_.chunk, s_.action_dim, s_.latent, y.cols,
                                               s_.use_vae ? s_.kl_weight : 0.f});
    });
    return total;
  }

  template <class Dev, class T>
  void backward(Dev& dev, MatView<const T> y, const DeviceBatch& batch, MatView<T> dy, float scale) {
    const float* action = inputs(y, batch);
    detail::with_padding(batch.at("action_is_pad"), "nn::ActLoss", [&](const auto* pad) {
      using M = std::remove_cvref_t<decltype(*pad)>;
      dev.for_each(static_cast<std::size_t>(y.size()),
                   detail::ActLossGrad<T, M>{y.data, action, pad, dy.data, s_.chunk, s_.action_dim, s_.latent, y.cols,
                                             s_.use_vae ? s_.kl_weight : 0.f, scale});
    });
  }

  const ActShape& shape() const { return s_; }

 private:
  template <class T>
  const float* inputs(MatView<const T> y, const DeviceBatch& batch) const {
    if (y.cols != s_.output_width())
      throw config_error("nn::ActLoss: predictions of " + std::to_string(y.cols) + " columns, the model writes " +
                             std::to_string(s_.output_width()),
                         "use nn::ActLoss after nn::ActHead of the same ActShape");
    const DeviceTensor* pad = batch.find("action_is_pad");
    if (pad == nullptr || pad->numel() != y.rows * s_.chunk)
      throw config_error("nn::ActLoss: \"action_is_pad\" must hold [B, chunk_size] = [" + std::to_string(y.rows) +
                             ", " + std::to_string(s_.chunk) + "] values",
                         "give action_is_pad beside action (1 where the episode ended before the chunk)");
    return detail::batch_floats("nn::ActLoss", &batch, "action", y.rows * s_.chunk * s_.action_dim,
                                "give the action chunk [B, chunk_size, action_dim] as \"action\"");
  }

  ActShape s_;
};

}  // namespace dtrain::nn
