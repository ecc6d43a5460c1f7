#pragma once
// The composite units of diffusers' UNet2DConditionModel besides its
// transformers (nn/spatial_transformer.hpp), with diffusers' parameter names:
//
//  - nn::ResnetBlock2D(in_channels, out_channels, image, options): the
//    UNet's ResNet block, whose second half is shifted per channel by the
//    time embedding it reads from a lane (model/unit.hpp):
//      h = conv1(silu(norm1(x)))
//      h = h + time_emb_proj(silu(temb))       [batch, out] over every pixel
//      h = conv2(silu(norm2(h)))               (dropout: 0, not built)
//      y = (shortcut(x) + h) / output_scale_factor
//    norm1, norm2 GroupNorm(groups, eps); conv1, conv2 3x3 padding 1 with
//    bias; shortcut = x when in == out, else conv_shortcut, a 1x1 convolution
//    with bias. temb is lane options.temb_lane, [batch, temb_dim].
//    params norm1.{weight,bias}, conv1.{weight,bias}, time_emb_proj.{weight,
//    bias}, norm2.*, conv2.*, then conv_shortcut.* when in != out
//    saved  rows * (3 in + 5 out + 3 temb_dim + out_channels), in = in_channels
//           * h * w, out = out_channels * h * w: norm1's and the first SiLU's
//           outputs, conv1's output shifted, norm2's and the second SiLU's
//           outputs, silu(temb), then scratch for the gradients between the
//           parts (two output-sized, one or two input-sized, the shift's and
//           temb's)
//
//  - nn::TimestepInput(latent_channels, channels, image, options): the
//    model's first unit (a dtrain::InputUnit): conv_in over the batch's noisy
//    latents, and the time embedding every ResNet block reads, written to
//    lane options.temb_lane:
//      y    = conv_in(batch "x")                 3x3 padding 1
//      temb = linear_2(silu(linear_1(sinusoid(batch "timesteps"))))
//           (+ add_embedding's, with SDXL's "text_time" conditioning:
//              linear_2(silu(linear_1([batch "pooled" | sinusoid(batch
//              "time_ids") per id]))))
//    The sinusoids are nn::get_timestep_embedding with the model's
//    flip_sin_to_cos and freq_shift, channels (block_out_channels[0]) wide
//    for the timesteps, addition_time_embed_dim per time id.
//    params conv_in.*, time_embedding.linear_1.*, time_embedding.linear_2.*,
//           then add_embedding.linear_1.*, add_embedding.linear_2.*
//    Batch: "x" float [B, latent_channels, h, w] (or [B, c * h * w]),
//    "timesteps" float [B]; with text_time also "pooled" float
//    [B, pooled_dim] and "time_ids" float [B, time_ids].
//
// Like nn::Conv2d every unit is built for one image size and reads one image
// per row: x [batch, channels * height * width], NCHW flattened. Backward is
// exact and overwrites the gradients of the trainable parameters (empty
// views when frozen); the readers of the time embedding ADD their gradient
// into the lane's, which nn::TimestepInput carries back into its MLPs.
//
// On a GPU the units run only with DTRAIN_GPU_VISION=on (nn/convolution.hpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/convolution.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/batch_inputs.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/diffusion_units.hpp"
#include "dtrain/nn/lanes.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::nn {

namespace detail {

// y[plane i] += shift[i] over planes of `plane` values: a [batch, channels]
// shift broadcast over every pixel of the channel. Run over batch * channels.
template <Dtype T>
struct AddPlaneShift {
  const T* shift;
  T* y;
  std::int64_t plane;
  std::size_t work_per_index() const { return static_cast<std::size_t>(plane); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const float s = static_cast<float>(shift[i]);
    T* row = y + static_cast<std::int64_t>(i) * plane;
    for (std::int64_t p = 0; p < plane; ++p) row[p] = dtype_cast<T>(static_cast<float>(row[p]) + s);
  }
};

}  // namespace detail

struct ResnetBlockOptions {
  int temb_lane = 0;             // the lane of the time embedding
  std::int64_t temb_dim = 1280;  // its width (4 x block_out_channels[0])
  std::int64_t groups = 32;      // norm_num_groups
  float eps = 1e-5f;             // norm_eps
  float output_scale_factor = 1.f;
  bool trainable = true;  // false freezes every parameter
};

class ResnetBlock2D {
 public:
  // `image`: the height and width of the input images (and the output's).
  ResnetBlock2D(std::int64_t in_channels, std::int64_t out_channels, Extent2 image, ResnetBlockOptions options = {})
      : in_(in_channels),
        out_(out_channels),
        image_(image),
        o_(options),
        shortcut_(in_channels != out_channels),
        norm1_(options.groups, in_channels, image, {.eps = options.eps, .trainable = options.trainable}),
        conv1_(in_channels, out_channels, {3, 3}, image, {.padding = {1, 1}, .trainable = options.trainable}),
        temb_proj_(options.temb_dim, out_channels, {.trainable = options.trainable}),
        norm2_(options.groups, out_channels, image, {.eps = options.eps, .trainable = options.trainable}),
        conv2_(out_channels, out_channels, {3, 3}, image, {.padding = {1, 1}, .trainable = options.trainable}),
        conv_short_(in_channels, out_channels, {1, 1}, image, {.trainable = options.trainable}) {
    if (options.temb_dim < 1 || options.temb_lane < 0)
      throw config_error("nn::ResnetBlock2D: a time embedding of width " + std::to_string(options.temb_dim) +
                             " on lane " + std::to_string(options.temb_lane),
                         "give the time embedding's width (time_embed_dim) and its lane id (>= 0)");
    if (!(options.output_scale_factor > 0.f))
      throw config_error("nn::ResnetBlock2D: output_scale_factor " + std::to_string(options.output_scale_factor),
                         "give a positive output_scale_factor (diffusers' UNet uses 1)");
  }

  std::int64_t in_channels() const noexcept { return in_; }
  std::int64_t out_channels() const noexcept { return out_; }
  Extent2 extent() const noexcept { return image_; }
  bool has_shortcut() const noexcept { return shortcut_; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "norm1", norm1_.params());
    detail::append_params(out, "conv1", conv1_.params());
    detail::append_params(out, "time_emb_proj", temb_proj_.params());
    detail::append_params(out, "norm2", norm2_.params());
    detail::append_params(out, "conv2", conv2_.params());
    if (shortcut_) detail::append_params(out, "conv_shortcut", conv_short_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const {
    norm1_.out_features(in);
    return out_size();
  }
  std::vector<int> lanes_read() const { return {o_.temb_lane}; }
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    return s.rows() * (3 * in_size() + (shortcut_ ? in_size() : 0) + 5 * out_size() + 3 * o_.temb_dim + out_);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::ResnetBlock2D");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_shape("nn::ResnetBlock2D", "output", y, x.rows, out_size());
    if (x.rows == 0) return;
    const MatView<T> temb = lane(ctx, x.rows, false);
    norm1_.template forward<Dev, T>(dev, p.subspan(norm1, 2), x, s.n1);
    silu_.template forward<Dev, T>(dev, {}, s.n1, s.s1);
    conv1_.template forward<Dev, T>(dev, p.subspan(conv1, 2), s.s1, s.h);
    silu_.template forward<Dev, T>(dev, {}, temb, s.st);
    temb_proj_.template forward<Dev, T>(dev, p.subspan(proj, 2), s.st, s.t);
    dev.for_each(static_cast<std::size_t>(x.rows * out_), detail::AddPlaneShift<T>{s.t.data, s.h.data, plane()});
    norm2_.template forward<Dev, T>(dev, p.subspan(norm2, 2), s.h, s.n2);
    silu_.template forward<Dev, T>(dev, {}, s.n2, s.s2);
    conv2_.template forward<Dev, T>(dev, p.subspan(conv2, 2), s.s2, y);
    const auto n = static_cast<std::size_t>(y.size());
    if (shortcut_) {
      conv_short_.template forward<Dev, T>(dev, p.subspan(short_, 2), x, s.g1);
      dev.for_each(n, AddElements<T>{y.data, s.g1.data, y.data});
    } else {
      dev.for_each(n, AddElements<T>{y.data, x.data, y.data});
    }
    if (o_.output_scale_factor != 1.f) dev.for_each(n, Scale<T>{y.data, 1.f / o_.output_scale_factor});
  }

  // y = (shortcut(x) + h) / s: d(shortcut) = d(h) = dy / s; dx is the main
  // path's input gradient plus the shortcut's; temb's gradient is added to
  // the lane's.
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::ResnetBlock2D");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::ResnetBlock2D", "gradients", grad.size(), p.size());
    detail::check_shape("nn::ResnetBlock2D", "output gradient", dy, x.rows, out_size());
    if (!dx.empty()) detail::check_shape("nn::ResnetBlock2D", "input gradient", dx, x.rows, x.cols);
    if (x.rows == 0) {  // no images: zero parameter gradients
      for (const auto& g : grad)
        if (!g.empty()) dev.zero(g.data, static_cast<std::size_t>(g.size()));
      return;
    }
    const MatView<T> temb = lane(ctx, x.rows, false), dtemb = lane(ctx, x.rows, true);
    MatView<const T> g = dy;  // d(h) = d(shortcut)
    if (o_.output_scale_factor != 1.f) {
      dev.copy(s.g2.data, dy.data, static_cast<std::size_t>(dy.size()));
      dev.for_each(static_cast<std::size_t>(dy.size()), Scale<T>{s.g2.data, 1.f / o_.output_scale_factor});
      g = s.g2;
    }
    if (shortcut_)
      conv_short_.template backward<Dev, T>(dev, p.subspan(short_, 2), grad.subspan(short_, 2), x, {}, g,
                                            dx.empty() ? MatView<T>{} : s.dx_short);
    conv2_.template backward<Dev, T>(dev, p.subspan(conv2, 2), grad.subspan(conv2, 2), s.s2, {}, g, s.g1);
    silu_.template backward<Dev, T>(dev, {}, {}, s.n2, s.s2, s.g1, s.g3);
    norm2_.template backward<Dev, T>(dev, p.subspan(norm2, 2), grad.subspan(norm2, 2), s.h, {}, s.g3, s.g1);
    // the shift: d(t)[n, c] is the sum of d(h) over channel c's pixels
    dev.for_each(static_cast<std::size_t>(x.rows * out_), RowSum<T>{s.g1.data, s.dt.data, plane()});
    temb_proj_.template backward<Dev, T>(dev, p.subspan(proj, 2), grad.subspan(proj, 2), s.st, {}, s.dt, s.dst);
    silu_.template backward<Dev, T>(dev, {}, {}, temb, s.st, s.dst, s.dtemb);
    dev.for_each(static_cast<std::size_t>(dtemb.size()), AddElements<T>{dtemb.data, s.dtemb.data, dtemb.data});
    const bool want_dx = !dx.empty();
    conv1_.template backward<Dev, T>(dev, p.subspan(conv1, 2), grad.subspan(conv1, 2), s.s1, {}, s.g1,
                                     want_dx || trainable(grad, norm1) ? s.gi1 : MatView<T>{});
    if (!want_dx && !trainable(grad, norm1)) return;
    silu_.template backward<Dev, T>(dev, {}, {}, s.n1, s.s1, s.gi1, s.gi2);
    norm1_.template backward<Dev, T>(dev, p.subspan(norm1, 2), grad.subspan(norm1, 2), x, {}, s.gi2, dx);
    if (want_dx)
      dev.for_each(static_cast<std::size_t>(dx.size()),
                   AddElements<T>{dx.data, shortcut_ ? s.dx_short.data : g.data, dx.data});
  }

 private:
  // The parts' first parameters.
  static constexpr std::size_t norm1 = 0, conv1 = 2, proj = 4, norm2 = 6, conv2 = 8, short_ = 10;

  template <class T>
  struct Parts {
    MatView<T> n1, s1;          // norm1's and the first SiLU's outputs [rows, in]
    MatView<T> h, n2, s2;       // conv1's output (shifted), norm2's, the second SiLU's [rows, out]
    MatView<T> st;              // silu(temb) [rows, temb_dim]
    MatView<T> t;               // time_emb_proj's output [rows, out_channels]
    MatView<T> g1, g2, g3;      // output-sized gradient scratch (g2: dy / output_scale_factor)
    MatView<T> gi1, gi2;        // input-sized gradient scratch
    MatView<T> dx_short;        // the shortcut's input gradient
    MatView<T> dt, dst, dtemb;  // the shift's, silu(temb)'s and temb's gradients
  };

  std::int64_t plane() const { return image_.h * image_.w; }
  std::int64_t in_size() const { return in_ * plane(); }
  std::int64_t out_size() const { return out_ * plane(); }

  template <class T>
  static bool trainable(UnitParams<T> grad, std::size_t first) {
    return !grad[first].empty() || !grad[first + 1].empty();
  }

  template <class T>
  MatView<T> lane(const UnitContext<T>& ctx, std::int64_t rows, bool grad) const {
    const MatView<T> l = grad ? ctx.lane_grad(o_.temb_lane) : ctx.lane(o_.temb_lane);
    if (l.rows != rows || l.cols != o_.temb_dim)
      throw config_error("nn::ResnetBlock2D: the time embedding (lane " + std::to_string(o_.temb_lane) + ") is " +
                             std::to_string(l.rows) + " x " + std::to_string(l.cols) + ", " + std::to_string(rows) +
                             " x " + std::to_string(o_.temb_dim) + " expected",
                         "write one time embedding of temb_dim values per image before the block (nn::TimestepInput)");
    return l;
  }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::ResnetBlock2D", "parameters", p.size(), shortcut_ ? short_ + 2 : short_);
    out_features(x.cols);
    detail::check_saved("nn::ResnetBlock2D", ctx.saved.size(), saved_size(SeqShape{x.rows, 1}, x.cols),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    detail::Carve<T> c(ctx.saved.data);
    auto mat = [&](std::int64_t cols) { return MatView<T>{c.take(x.rows * cols), x.rows, cols}; };
    Parts<T> s;
    s.n1 = mat(in_size());
    s.s1 = mat(in_size());
    s.h = mat(out_size());
    s.n2 = mat(out_size());
    s.s2 = mat(out_size());
    s.st = mat(o_.temb_dim);
    s.t = mat(out_);
    s.g1 = mat(out_size());
    s.g2 = mat(out_size());
    s.g3 = s.n2;  // the second SiLU's input gradient over its input, element by element
    s.gi1 = mat(in_size());
    s.gi2 = s.s1;  // written by the first SiLU's backward, which reads only its input
    if (shortcut_) s.dx_short = mat(in_size());
    s.dt = s.t;  // the shift is not needed in backward
    s.dst = mat(o_.temb_dim);
    s.dtemb = mat(o_.temb_dim);
    return s;
  }

  std::int64_t in_, out_;
  Extent2 image_;
  ResnetBlockOptions o_;
  bool shortcut_;
  GroupNorm norm1_;
  Conv2d conv1_;
  Linear temb_proj_;
  GroupNorm norm2_;
  Conv2d conv2_;
  Conv2d conv_short_;  // unused when in == out
  SiLU silu_;
};

// SDXL's "text_time" conditioning (addition_embed_type): the pooled text
// embedding and the micro-conditioning ids (original size, crop, target
// size: 6 ids), each id's sinusoid addition_time_embed_dim wide.
struct TextTimeOptions {
  std::int64_t pooled_dim = 1280;  // the pooled text embedding's width
  std::int64_t time_ids = 6;
  std::int64_t time_embed_dim = 256;  // addition_time_embed_dim
  // projection_class_embeddings_input_dim
  std::int64_t input_dim() const { return pooled_dim + time_ids * time_embed_dim; }
};

struct TimestepInputOptions {
  int temb_lane = 0;          // the lane the time embedding is written to
  std::int64_t temb_dim = 0;  // time_embed_dim (0: 4 x channels)
  bool flip_sin_to_cos = true;
  double freq_shift = 0.0;
  bool text_time = false;  // SDXL's added conditioning (TextTimeOptions)
  TextTimeOptions text{};
  bool trainable = true;  // false freezes every parameter
};

class TimestepInput {
 public:
  // `image`: the latents' height and width; `channels`: conv_in's outputs
  // (block_out_channels[0]), also the timesteps' sinusoid width.
  TimestepInput(std::int64_t latent_channels, std::int64_t channels, Extent2 image, TimestepInputOptions options = {})
      : channels_(channels),
        o_(with_defaults(options, channels)),
        conv_in_(latent_channels, channels, {3, 3}, image, {.padding = {1, 1}, .trainable = options.trainable}),
        l1_(channels, o_.temb_dim, {.trainable = options.trainable}),
        l2_(o_.temb_dim, o_.temb_dim, {.trainable = options.trainable}) {
    if (o_.text_time) {
      a1_.emplace(o_.text.input_dim(), o_.temb_dim, LinearOptions{.trainable = options.trainable});
      a2_.emplace(o_.temb_dim, o_.temb_dim, LinearOptions{.trainable = options.trainable});
    }
    if (o_.temb_lane < 0)
      throw config_error("nn::TimestepInput: lane " + std::to_string(o_.temb_lane), "give a lane id >= 0");
  }

  std::int64_t out_channels() const noexcept { return channels_; }
  std::int64_t temb_dim() const noexcept { return o_.temb_dim; }
  int temb_lane() const noexcept { return o_.temb_lane; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "conv_in", conv_in_.params());
    detail::append_params(out, "time_embedding.linear_1", l1_.params());
    detail::append_params(out, "time_embedding.linear_2", l2_.params());
    if (o_.text_time) {
      detail::append_params(out, "add_embedding.linear_1", a1_->params());
      detail::append_params(out, "add_embedding.linear_2", a2_->params());
    }
    return out;
  }
  std::int64_t out_features(std::int64_t in) const { return conv_in_.out_features(in); }
  std::vector<LaneSpec> lanes_written(SeqShape in, std::int64_t) const {
    return {{o_.temb_lane, in.rows(), o_.temb_dim}};
  }
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    const std::int64_t text = o_.text_time ? 2 * o_.text.input_dim() + 3 * o_.temb_dim : 0;
    return s.rows() * (channels_ + 4 * o_.temb_dim + text);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::TimestepInput");
    const Parts<T> s = parts(p, x, ctx);
    const std::int64_t B = x.rows;
    detail::check_shape("nn::TimestepInput", "output", y, B, out_features(x.cols));
    const MatView<T> temb = ctx.lane(o_.temb_lane);
    detail::check_shape("nn::TimestepInput", "time embedding lane", temb, B, o_.temb_dim);
    if (B == 0) return;
    conv_in_.template forward<Dev, T>(dev, p.subspan(conv_in, 2), x, y);
    const float* t = detail::batch_floats("nn::TimestepInput", ctx.batch, "timesteps", B,
                                          "give the batch \"timesteps\" float [B]: each record's timestep");
    get_timestep_embedding(dev, t, s.sin, sinusoid(channels_));
    l1_.template forward<Dev, T>(dev, p.subspan(lin1, 2), s.sin, s.a);
    silu_.template forward<Dev, T>(dev, {}, s.a, s.sa);
    l2_.template forward<Dev, T>(dev, p.subspan(lin2, 2), s.sa, temb);
    if (!o_.text_time) return;
    const TextTimeOptions& tt = o_.text;
    const float* pooled = detail::batch_floats("nn::TimestepInput", ctx.batch, "pooled", B * tt.pooled_dim,
                                               "give the batch \"pooled\" float [B, pooled_dim]: the pooled text "
                                               "embedding SDXL's add_embedding reads (text_embeds)");
    const float* ids = detail::batch_floats("nn::TimestepInput", ctx.batch, "time_ids", B * tt.time_ids,
                                            "give the batch \"time_ids\" float [B, 6]: SDXL's original size, crop "
                                            "and target size");
    // [pooled | the ids' sinusoids], the ids' sinusoids first built in the scratch after the concatenation
    const MatView<T> id_sin{s.cat_grad.data, B * tt.time_ids, tt.time_embed_dim};
    get_timestep_embedding(dev, ids, id_sin, sinusoid(tt.time_embed_dim));
    const MatView<T> pooled_t{s.cat_grad.data + B * tt.time_ids * tt.time_embed_dim, B, tt.pooled_dim};
    dev.for_each(static_cast<std::size_t>(B * tt.pooled_dim), Cast<float, T>{pooled, pooled_t.data});
    dev.for_each(static_cast<std::size_t>(B), detail::ConcatRows<T>{pooled_t.data, id_sin.data, s.cat.data,
                                                                    tt.pooled_dim, tt.time_ids * tt.time_embed_dim});
    a1_->template forward<Dev, T>(dev, p.subspan(add1, 2), s.cat, s.b);
    silu_.template forward<Dev, T>(dev, {}, s.b, s.sb);
    a2_->template forward<Dev, T>(dev, p.subspan(add2, 2), s.sb, s.aug);
    dev.for_each(static_cast<std::size_t>(temb.size()), AddElements<T>{temb.data, s.aug.data, temb.data});
  }

  // The time embedding's gradient is what the blocks added into the lane.
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::TimestepInput");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::TimestepInput", "gradients", grad.size(), p.size());
    detail::check_shape("nn::TimestepInput", "output gradient", dy, x.rows, out_features(x.cols));
    conv_in_.template backward<Dev, T>(dev, p.subspan(conv_in, 2), grad.subspan(conv_in, 2), x, {}, dy, dx);
    const MatView<T> dtemb = ctx.lane_grad(o_.temb_lane);
    detail::check_shape("nn::TimestepInput", "time embedding gradient", dtemb, x.rows, o_.temb_dim);
    mlp_backward(dev, p, grad, lin1, s.sin, s.a, s.sa, dtemb, s);
    if (o_.text_time) mlp_backward(dev, p, grad, add1, s.cat, s.b, s.sb, dtemb, s);
  }

 private:
  static constexpr std::size_t conv_in = 0, lin1 = 2, lin2 = 4, add1 = 6, add2 = 8;

  template <class T>
  struct Parts {
    MatView<T> sin;       // the timesteps' sinusoids [rows, channels]
    MatView<T> a, sa;     // linear_1's output and its SiLU [rows, temb]
    MatView<T> d1, d2;    // gradient scratch [rows, temb] (d1: also add_embedding's output)
    MatView<T> cat;       // text_time: [pooled | ids' sinusoids] [rows, input_dim]
    MatView<T> cat_grad;  // scratch [rows, input_dim]
    MatView<T> b, sb;     // add_embedding.linear_1's output and its SiLU [rows, temb]
    MatView<T> aug;       // add_embedding's output [rows, temb]
  };

  static TimestepInputOptions with_defaults(TimestepInputOptions o, std::int64_t channels) {
    if (o.temb_dim == 0) o.temb_dim = 4 * channels;
    if (channels < 1 || o.temb_dim < 1)
      throw config_error("nn::TimestepInput: " + std::to_string(channels) + " channels, a time embedding of " +
                             std::to_string(o.temb_dim),
                         "give positive widths (Stable Diffusion: 320 channels, 1280)");
    if (o.text_time && (o.text.pooled_dim < 1 || o.text.time_ids < 1 || o.text.time_embed_dim < 2))
      throw config_error("nn::TimestepInput: text_time conditioning of pooled width " +
                             std::to_string(o.text.pooled_dim) + ", " + std::to_string(o.text.time_ids) +
                             " time ids of " + std::to_string(o.text.time_embed_dim),
                         "give positive widths (SDXL: pooled 1280, 6 time ids of 256)");
    return o;
  }

  TimestepEmbeddingOptions sinusoid(std::int64_t dim) const {
    return {.dim = dim, .flip_sin_to_cos = o_.flip_sin_to_cos, .downscale_freq_shift = o_.freq_shift};
  }

  // linear_2(silu(linear_1(in))) backward from d(out), the MLP's first
  // parameter at `first`; no input gradient (nothing upstream trains).
  template <class Dev, class T>
  void mlp_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, std::size_t first, MatView<T> in, MatView<T> a,
                    MatView<T> sa, MatView<T> dout, const Parts<T>& s) {
    const bool train1 = !grad[first].empty() || !grad[first + 1].empty();
    Linear& l1 = first == lin1 ? l1_ : *a1_;
    Linear& l2 = first == lin1 ? l2_ : *a2_;
    l2.template backward<Dev, T>(dev, p.subspan(first + 2, 2), grad.subspan(first + 2, 2), sa, {}, dout,
                                 train1 ? s.d1 : MatView<T>{});
    if (!train1) return;
    silu_.template backward<Dev, T>(dev, {}, {}, a, sa, s.d1, s.d2);
    l1.template backward<Dev, T>(dev, p.subspan(first, 2), grad.subspan(first, 2), in, {}, s.d2, MatView<T>{});
  }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::TimestepInput", "parameters", p.size(), o_.text_time ? add2 + 2 : add1);
    out_features(x.cols);
    detail::check_saved("nn::TimestepInput", ctx.saved.size(), saved_size(SeqShape{x.rows, 1}, x.cols),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    detail::Carve<T> c(ctx.saved.data);
    auto mat = [&](std::int64_t cols) { return MatView<T>{c.take(x.rows * cols), x.rows, cols}; };
    Parts<T> s;
    s.sin = mat(channels_);
    s.a = mat(o_.temb_dim);
    s.sa = mat(o_.temb_dim);
    s.d1 = mat(o_.temb_dim);
    s.d2 = mat(o_.temb_dim);
    if (o_.text_time) {
      s.cat = mat(o_.text.input_dim());
      s.cat_grad = mat(o_.text.input_dim());
      s.b = mat(o_.temb_dim);
      s.sb = mat(o_.temb_dim);
      s.aug = mat(o_.temb_dim);
    }
    return s;
  }

  std::int64_t channels_;
  TimestepInputOptions o_;
  Conv2d conv_in_;
  Linear l1_, l2_;                 // the time embedding's
  std::optional<Linear> a1_, a2_;  // add_embedding's (text_time only)
  SiLU silu_;
};

}  // namespace dtrain::nn
