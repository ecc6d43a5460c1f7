#pragma once
// The first leaf units of diffusion models (diffusers' UNet2DConditionModel):
//
//  - nn::GroupNorm (torch.nn.GroupNorm(num_groups, num_channels, eps,
//    affine=True)): each image's channels split into `groups` groups of
//    channels / groups consecutive channels; every group of every image is
//    normalised with its own mean and biased variance over its
//    channels / groups * height * width values, then scaled and shifted per
//    channel: y = (x - mean) / sqrt(var + eps) * weight[c] + bias[c].
//    Parameters weight [channels] (ones) and bias [channels] (zeros), tagged
//    as nn::BatchNorm2d's. The statistics are per image, so unlike a batch
//    norm the unit is the same in training and evaluation, and on every rank.
//  - nn::Upsample2d (F.interpolate(x, scale_factor=factor, mode="nearest"),
//    diffusers' Upsample2D before its convolution): every pixel copied into a
//    factor x factor block, so y[n, c, oh, ow] = x[n, c, oh / factor,
//    ow / factor]. PyTorch's nearest index floor(o * (1 / factor)) is that
//    integer division for every integer factor. No parameters; backward sums
//    the gradients of a pixel's copies.
//  - nn::get_timestep_embedding (diffusers' get_timestep_embedding and its
//    Timesteps module): the sinusoidal embedding [batch, dim] of float
//    timesteps. Not a unit: it has no parameters and no backward (nothing
//    upstream of the timesteps trains); a model writes it into the batch or
//    calls it before its time MLP.
//
// Like nn::Conv2d the two units are built for one image size and read one
// image per row: x [batch, channels * height * width], NCHW flattened; the
// upsampling's rows are factor * factor times wider (out_features). Nothing
// is kept from forward: GroupNorm's backward computes the statistics again.
//
// GroupNorm's statistics: one index of for_each per (image, group) sums the
// group's values in double (a UNet's first group holds 10 * 64 * 64 values)
// into coefficients in the device workspace; one index per element (per
// image plane on the host) applies them. The group of image n and group g is
// contiguous in the row: channels g * cpg .. (g + 1) * cpg - 1 of image n,
// cpg = channels / groups.
//
// On a GPU the units and the embedding run only with DTRAIN_GPU_VISION=on
// (nn/convolution.hpp): their kernels are compiled but have not run on a GPU.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/convolution.hpp"

namespace dtrain::nn {

namespace detail {

// Per (image, group): mean, rstd = 1 / sqrt(var + eps), and for backward
// mean_g = mean(dy * weight) and mean_gx = mean(dy * weight * xhat) over the
// group's values (zero in forward).
struct group_coeffs {
  float mean, rstd, mean_g, mean_gx;
};

// The shape of one group norm over a batch of images.
struct GroupShape {
  std::int64_t batch, channels, groups, plane;  // plane = height * width
  DTRAIN_HOST_DEVICE std::int64_t group_channels() const { return channels / groups; }
  DTRAIN_HOST_DEVICE std::int64_t group_size() const { return channels / groups * plane; }
  // The coefficients' index of image n's channel c.
  DTRAIN_HOST_DEVICE std::int64_t coeff(std::int64_t n, std::int64_t c) const {
    return n * groups + c / group_channels();
  }
};

// The coefficients of index i = n * groups + g; with dy, also mean_g and
// mean_gx. Run over batch * groups.
template <Dtype T>
struct GroupCoeffs {
  const T* x;
  const T* weight;
  const T* dy;  // null: forward, or no input gradient wanted
  group_coeffs* out;
  GroupShape s;
  float eps;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(s.group_size()); }

  // The sum of f(value index, channel) over the group starting at `base`,
  // whose first channel is c0.
  template <class F>
  DTRAIN_HOST_DEVICE double sum(std::int64_t base, std::int64_t c0, F f) const {
    double acc = 0.0;
    const std::int64_t cpg = s.group_channels();
    for (std::int64_t cl = 0; cl < cpg; ++cl) {
      const std::int64_t row = base + cl * s.plane;
      for (std::int64_t p = 0; p < s.plane; ++p) acc += f(row + p, c0 + cl);
    }
    return acc;
  }

  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t n = idx / s.groups, g = idx % s.groups;
    const std::int64_t c0 = g * s.group_channels(), base = (n * s.channels + c0) * s.plane;
    const double count = static_cast<double>(s.group_size());
    const double mean = sum(base, c0, [&](std::int64_t j, std::int64_t) { return static_cast<double>(x[j]); }) / count;
    const double var = sum(base, c0,
                           [&](std::int64_t j, std::int64_t) {
                             const double d = static_cast<double>(x[j]) - mean;
                             return d * d;
                           }) /
                       count;
    const float rstd_f = 1.f / math::sqrt(static_cast<float>(var) + eps);
    group_coeffs k{static_cast<float>(mean), rstd_f, 0.f, 0.f};
    if (dy != nullptr) {
      const auto rstd = static_cast<double>(rstd_f);
      const double sum_g = sum(base, c0, [&](std::int64_t j, std::int64_t c) {
        return static_cast<double>(dy[j]) * static_cast<double>(weight[c]);
      });
      const double sum_gx = sum(base, c0, [&](std::int64_t j, std::int64_t c) {
        return static_cast<double>(dy[j]) * static_cast<double>(weight[c]) * (static_cast<double>(x[j]) - mean) * rstd;
      });
      k.mean_g = static_cast<float>(sum_g / count);
      k.mean_gx = static_cast<float>(sum_gx / count);
    }
    out[i] = k;
  }
};

// dweight[c] = sum(dy * xhat) and dbias[c] = sum(dy) over the batch's
// planes of channel c, in double, each unless null. Run over channels.
template <Dtype T>
struct GroupParamGrads {
  const T* x;
  const T* dy;
  const group_coeffs* k;
  T* dweight;
  T* dbias;
  GroupShape s;
  std::size_t work_per_index() const { return static_cast<std::size_t>(s.batch * s.plane); }

  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto c = static_cast<std::int64_t>(i);
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (std::int64_t n = 0; n < s.batch; ++n) {
      const group_coeffs kc = k[s.coeff(n, c)];
      const auto mean = static_cast<double>(kc.mean), rstd = static_cast<double>(kc.rstd);
      const std::int64_t base = (n * s.channels + c) * s.plane;
      for (std::int64_t p = 0; p < s.plane; ++p) {
        const auto d = static_cast<double>(dy[base + p]);
        sum_dy += d;
        sum_dy_xhat += d * (static_cast<double>(x[base + p]) - mean) * rstd;
      }
    }
    if (dweight != nullptr) dweight[c] = dtype_cast<T>(static_cast<float>(sum_dy_xhat));
    if (dbias != nullptr) dbias[c] = dtype_cast<T>(static_cast<float>(sum_dy));
  }
};

// y = (x - mean) * rstd * weight + bias. Run over batch * channels * plane.
template <Dtype T>
struct GroupNormalize {
  const T* x;
  const T* weight;
  const T* bias;
  const group_coeffs* k;
  T* y;
  GroupShape s;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t c = (idx / s.plane) % s.channels, n = idx / (s.plane * s.channels);
    const group_coeffs kc = k[s.coeff(n, c)];
    const float xhat = (static_cast<float>(x[i]) - kc.mean) * kc.rstd;
    y[i] = dtype_cast<T>(xhat * static_cast<float>(weight[c]) + static_cast<float>(bias[c]));
  }
};

// GroupNormalize a plane at a time (the host's form): index i is (n, c).
// Run over batch * channels.
template <Dtype T>
struct GroupNormalizePlanes {
  GroupNormalize<T> f;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t c = idx % f.s.channels, n = idx / f.s.channels;
    const group_coeffs kc = f.k[f.s.coeff(n, c)];
    const float mean = kc.mean, rstd = kc.rstd, weight = static_cast<float>(f.weight[c]);
    const float shift = static_cast<float>(f.bias[c]);
    const T* x = f.x + idx * f.s.plane;
    T* y = f.y + idx * f.s.plane;
    for (std::int64_t p = 0; p < f.s.plane; ++p)
      y[p] = dtype_cast<T>((static_cast<float>(x[p]) - mean) * rstd * weight + shift);
  }
  std::size_t work_per_index() const { return static_cast<std::size_t>(f.s.plane); }
};

// dx = rstd * (dy * weight - mean_g - xhat * mean_gx). Run over
// batch * channels * plane.
template <Dtype T>
struct GroupNormalizeBackward {
  const T* x;
  const T* weight;
  const T* dy;
  const group_coeffs* k;
  T* dx;
  GroupShape s;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t c = (idx / s.plane) % s.channels, n = idx / (s.plane * s.channels);
    const group_coeffs kc = k[s.coeff(n, c)];
    const float xhat = (static_cast<float>(x[i]) - kc.mean) * kc.rstd;
    const float g = static_cast<float>(dy[i]) * static_cast<float>(weight[c]);
    dx[i] = dtype_cast<T>(kc.rstd * (g - kc.mean_g - xhat * kc.mean_gx));
  }
};

// GroupNormalizeBackward a plane at a time (the host's form): index i is
// (n, c). Run over batch * channels.
template <Dtype T>
struct GroupNormalizeBackwardPlanes {
  GroupNormalizeBackward<T> f;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t c = idx % f.s.channels, n = idx / f.s.channels;
    const group_coeffs kc = f.k[f.s.coeff(n, c)];
    const float mean = kc.mean, rstd = kc.rstd, mean_g = kc.mean_g, mean_gx = kc.mean_gx;
    const float weight = static_cast<float>(f.weight[c]);
    const T* x = f.x + idx * f.s.plane;
    const T* dy = f.dy + idx * f.s.plane;
    T* dx = f.dx + idx * f.s.plane;
    for (std::int64_t p = 0; p < f.s.plane; ++p) {
      const float xhat = (static_cast<float>(x[p]) - mean) * rstd;
      dx[p] = dtype_cast<T>(rstd * (static_cast<float>(dy[p]) * weight - mean_g - xhat * mean_gx));
    }
  }
  std::size_t work_per_index() const { return static_cast<std::size_t>(f.s.plane); }
};

// The shape of one nearest-neighbour upsampling over a batch of images.
struct UpsampleShape {
  std::int64_t batch, channels, height, width, factor;
  DTRAIN_HOST_DEVICE std::int64_t out_h() const { return height * factor; }
  DTRAIN_HOST_DEVICE std::int64_t out_w() const { return width * factor; }
  DTRAIN_HOST_DEVICE std::int64_t output_size() const { return batch * channels * out_h() * out_w(); }
  DTRAIN_HOST_DEVICE std::int64_t input_size() const { return batch * channels * height * width; }
};

// y[plane, oh, ow] = x[plane, oh / factor, ow / factor]. Run over
// s.output_size().
template <Dtype T>
struct UpsampleNearest {
  UpsampleShape s;
  const T* x;
  T* y;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto o = static_cast<std::int64_t>(i);
    const std::int64_t ow = o % s.out_w(), oh = (o / s.out_w()) % s.out_h(), plane = o / (s.out_w() * s.out_h());
    y[o] = x[(plane * s.height + oh / s.factor) * s.width + ow / s.factor];
  }
};

// dx[plane, ih, iw] = the sum of dy over the pixel's factor x factor block,
// in fp32, rounded once. Run over s.input_size().
template <Dtype T>
struct UpsampleNearestBackward {
  UpsampleShape s;
  const T* dy;
  T* dx;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t iw = idx % s.width, ih = (idx / s.width) % s.height, plane = idx / (s.width * s.height);
    const T* block = dy + (plane * s.out_h() + ih * s.factor) * s.out_w() + iw * s.factor;
    float acc = 0.f;
    for (std::int64_t r = 0; r < s.factor; ++r)
      for (std::int64_t q = 0; q < s.factor; ++q) acc += static_cast<float>(block[r * s.out_w() + q]);
    dx[idx] = dtype_cast<T>(acc);
  }
  std::size_t work_per_index() const { return static_cast<std::size_t>(s.factor * s.factor); }
};

}  // namespace detail

struct GroupNormOptions {
  float eps = 1e-5f;
  bool trainable = true;  // false freezes weight and bias
};

class GroupNorm {
 public:
  // torch.nn.GroupNorm's argument order; `image`: the height and width of
  // the input images.
  GroupNorm(std::int64_t groups, std::int64_t channels, Extent2 image, GroupNormOptions options = {})
      : groups_(groups), channels_(channels), image_(image), options_(options) {
    const std::string name = "nn::GroupNorm(" + std::to_string(groups) + " groups, " + std::to_string(channels) +
                             " channels) for " + detail::extent_text(image) + " images";
    if (groups < 1 || channels < 1 || image.h < 1 || image.w < 1)
      throw config_error(name + ": groups, channels and image extents must be >= 1",
                         "give a positive group count, channel count and image size");
    if (channels % groups != 0)
      throw config_error(name + ": " + std::to_string(channels) + " channels do not split into " +
                             std::to_string(groups) + " equal groups",
                         "use a group count that divides the channel count (torch.nn.GroupNorm requires "
                         "num_channels % num_groups == 0)");
    if (!(options.eps > 0.f))
      throw config_error(name + ": eps " + std::to_string(options.eps) + " must be > 0",
                         "give a positive eps (PyTorch's default is 1e-5; diffusers' UNet uses 1e-5 or 1e-6)");
  }

  std::int64_t groups() const noexcept { return groups_; }
  std::int64_t channels() const noexcept { return channels_; }
  float eps() const noexcept { return options_.eps; }

  // The norm over `batch` images.
  detail::GroupShape shape(std::int64_t batch) const noexcept {
    return {batch, channels_, groups_, image_.h * image_.w};
  }

  std::vector<ParamSpec> params() const {
    return {{"weight", {channels_}, Init::ones(), options_.trainable, {}, {"norm"}},
            {"bias", {channels_}, Init::zeros(), options_.trainable, {}, {"norm", "bias"}}};
  }

  // in: the values per image, channels * height * width.
  std::int64_t out_features(std::int64_t in) const {
    const std::int64_t want = channels_ * image_.h * image_.w;
    if (in != want)
      throw config_error("nn::GroupNorm expects " + std::to_string(channels_) + " channels of " +
                             detail::extent_text(image_) + " images, " + std::to_string(want) +
                             " values per row (NCHW), got rows of " + std::to_string(in),
                         "give one flattened [channels, height, width] image per row, or build the GroupNorm for "
                         "the images' size");
    return want;
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    detail::check_vision_device<Dev>("nn::GroupNorm");
    check_params(p);
    out_features(x.cols);
    detail::check_shape("nn::GroupNorm", "output", y, x.rows, x.cols);
    if (x.rows == 0) return;
    const detail::GroupShape s = shape(x.rows);
    auto* k = dev.template workspace<detail::group_coeffs>(static_cast<std::size_t>(s.batch * s.groups));
    dev.for_each(static_cast<std::size_t>(s.batch * s.groups),
                 detail::GroupCoeffs<T>{x.data, p[0].data, nullptr, k, s, options_.eps});
    const detail::GroupNormalize<T> f{x.data, p[0].data, p[1].data, k, y.data, s};
    if constexpr (Dev::host_accessible)
      dev.for_each(static_cast<std::size_t>(s.batch * s.channels), detail::GroupNormalizePlanes<T>{f});
    else
      dev.for_each(static_cast<std::size_t>(x.rows * x.cols), f);
  }

  // Overwrites the weight's and the bias's gradients unless empty (frozen).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    detail::check_vision_device<Dev>("nn::GroupNorm");
    check_params(p);
    detail::check_count("nn::GroupNorm", "gradients", grad.size(), p.size());
    out_features(x.cols);
    detail::check_shape("nn::GroupNorm", "output gradient", dy, x.rows, x.cols);
    if (!dx.empty()) detail::check_shape("nn::GroupNorm", "input gradient", dx, x.rows, x.cols);
    T* dweight = grad[0].empty() ? nullptr : grad[0].data;
    T* dbias = grad[1].empty() ? nullptr : grad[1].data;
    if (dweight != nullptr) detail::check_shape("nn::GroupNorm", "weight gradient", grad[0], channels_, 1);
    if (dbias != nullptr) detail::check_shape("nn::GroupNorm", "bias gradient", grad[1], channels_, 1);
    if (dx.empty() && dweight == nullptr && dbias == nullptr) return;
    const detail::GroupShape s = shape(x.rows);
    auto* k = dev.template workspace<detail::group_coeffs>(static_cast<std::size_t>(s.batch * s.groups));
    // the sums over dy (mean_g, mean_gx) only when the input gradient needs them
    dev.for_each(static_cast<std::size_t>(s.batch * s.groups),
                 detail::GroupCoeffs<T>{x.data, p[0].data, dx.empty() ? nullptr : dy.data, k, s, options_.eps});
    // without images the parameter gradients are zero sums
    if (dweight != nullptr || dbias != nullptr)
      dev.for_each(static_cast<std::size_t>(channels_),
                   detail::GroupParamGrads<T>{x.data, dy.data, k, dweight, dbias, s});
    if (dx.empty() || x.rows == 0) return;
    const detail::GroupNormalizeBackward<T> f{x.data, p[0].data, dy.data, k, dx.data, s};
    if constexpr (Dev::host_accessible)
      dev.for_each(static_cast<std::size_t>(s.batch * s.channels), detail::GroupNormalizeBackwardPlanes<T>{f});
    else
      dev.for_each(static_cast<std::size_t>(x.rows * x.cols), f);
  }

 private:
  template <class T>
  void check_params(UnitParams<T> p) const {
    detail::check_count("nn::GroupNorm", "parameters", p.size(), 2);
    for (const auto& v : p) detail::check_shape("nn::GroupNorm", "parameter", v, channels_, 1);
  }

  std::int64_t groups_;
  std::int64_t channels_;
  Extent2 image_;
  GroupNormOptions options_;
};

class Upsample2d {
 public:
  // `image`: the height and width of the input images; the output's are
  // factor times larger.
  Upsample2d(std::int64_t channels, Extent2 image, std::int64_t factor = 2)
      : channels_(channels), image_(image), factor_(factor) {
    if (channels < 1 || image.h < 1 || image.w < 1 || factor < 1)
      throw config_error("nn::Upsample2d(factor " + std::to_string(factor) + ") over " + std::to_string(channels) +
                             " channels of " + detail::extent_text(image) +
                             " images: channels, image extents and factor must be >= 1",
                         "give a positive channel count, image size and an integer scale factor");
  }

  std::int64_t channels() const noexcept { return channels_; }
  std::int64_t factor() const noexcept { return factor_; }
  std::int64_t out_h() const noexcept { return image_.h * factor_; }
  std::int64_t out_w() const noexcept { return image_.w * factor_; }

  // The upsampling of `batch` images.
  detail::UpsampleShape shape(std::int64_t batch) const noexcept {
    return {batch, channels_, image_.h, image_.w, factor_};
  }

  std::vector<ParamSpec> params() const { return {}; }

  // in: the values per image, channels * height * width.
  std::int64_t out_features(std::int64_t in) const {
    if (in != channels_ * image_.h * image_.w)
      throw config_error("nn::Upsample2d expects " + std::to_string(channels_) + " channels of " +
                             detail::extent_text(image_) + " images, " +
                             std::to_string(channels_ * image_.h * image_.w) + " values per row (NCHW), got rows of " +
                             std::to_string(in),
                         "give one flattened [channels, height, width] image per row, or build the Upsample2d for "
                         "the images' size");
    return channels_ * out_h() * out_w();
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    detail::check_vision_device<Dev>("nn::Upsample2d");
    detail::check_count("nn::Upsample2d", "parameters", p.size(), 0);
    out_features(x.cols);
    detail::check_shape("nn::Upsample2d", "output", y, x.rows, channels_ * out_h() * out_w());
    const detail::UpsampleShape s = shape(x.rows);
    dev.for_each(static_cast<std::size_t>(s.output_size()), detail::UpsampleNearest<T>{s, x.data, y.data});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T>, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    detail::check_vision_device<Dev>("nn::Upsample2d");
    detail::check_count("nn::Upsample2d", "parameters", p.size(), 0);
    out_features(x.cols);
    detail::check_shape("nn::Upsample2d", "output gradient", dy, x.rows, channels_ * out_h() * out_w());
    if (dx.empty()) return;
    detail::check_shape("nn::Upsample2d", "input gradient", dx, x.rows, x.cols);
    const detail::UpsampleShape s = shape(x.rows);
    dev.for_each(static_cast<std::size_t>(s.input_size()), detail::UpsampleNearestBackward<T>{s, dy.data, dx.data});
  }

 private:
  std::int64_t channels_;
  Extent2 image_;
  std::int64_t factor_;
};

// diffusers' get_timestep_embedding(timesteps, embedding_dim,
// flip_sin_to_cos, downscale_freq_shift, scale, max_period), the arguments
// of its Timesteps module (UNet2DConditionModel: flip_sin_to_cos=True,
// freq_shift=0 by default).
struct TimestepEmbeddingOptions {
  std::int64_t dim = 0;  // embedding_dim
  bool flip_sin_to_cos = false;
  double downscale_freq_shift = 1.0;
  double scale = 1.0;
  double max_period = 10000.0;
};

// The embedding of timestep t, column j, with half = dim / 2 and
// freq_k = exp(-ln(max_period) * k / (half - downscale_freq_shift)):
//   j < half:             sin(scale * t * freq_j)          (cos when flipped)
//   half <= j < 2 half:   cos(scale * t * freq_(j - half)) (sin when flipped)
//   j = 2 half (odd dim): 0
// diffusers computes it in float32; here every step is double and the
// result is rounded once to T, so the values agree with diffusers' to its
// float32 rounding of the angle (about |scale * t| * 2^-24). Writes
// out[b * dim + j]; run over batch * dim.
template <Dtype T>
struct SinusoidalTimesteps {
  const float* timesteps;  // [batch]
  T* out;                  // [batch, dim]
  std::int64_t dim, half;
  double log_max_period, denominator, scale;  // ln(max_period), half - downscale_freq_shift
  bool flip;

  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t b = idx / dim, j = idx % dim;
    if (j >= 2 * half) {
      out[idx] = dtype_cast<T>(0.f);
      return;
    }
    const bool first = j < half;
    const std::int64_t k = first ? j : j - half;
    const double freq = ::exp(-log_max_period * static_cast<double>(k) / denominator);
    const double angle = scale * (static_cast<double>(timesteps[b]) * freq);
    out[idx] = dtype_cast<T>(static_cast<float>(first != flip ? ::sin(angle) : ::cos(angle)));
  }
};

// The functor for `options`, checked: dim >= 1, max_period > 0, and
// half - downscale_freq_shift != 0 (diffusers divides by it: NaN columns).
template <Dtype T>
SinusoidalTimesteps<T> sinusoidal_timesteps(const float* timesteps, T* out, const TimestepEmbeddingOptions& o) {
  const std::int64_t half = o.dim / 2;
  const std::string name = "nn::get_timestep_embedding(dim " + std::to_string(o.dim) + ", downscale_freq_shift " +
                           std::to_string(o.downscale_freq_shift) + ", max_period " + std::to_string(o.max_period) +
                           ")";
  if (o.dim < 1) throw config_error(name + ": dim must be >= 1", "give the embedding's width");
  if (!(o.max_period > 0.0))
    throw config_error(name + ": max_period must be > 0", "give a positive max_period (diffusers' default 10000)");
  if (half > 0 && static_cast<double>(half) - o.downscale_freq_shift == 0.0)
    throw config_error(name + ": dim / 2 - downscale_freq_shift is 0, which the frequencies divide by",
                       "use downscale_freq_shift 0 or a larger dim (diffusers would return NaN here)");
  const double log_max_period = std::log(o.max_period),
               denominator = static_cast<double>(half) - o.downscale_freq_shift;
  return {timesteps, out, o.dim, half, log_max_period, denominator, o.scale, o.flip_sin_to_cos};
}

// out [batch, options.dim] = the embedding of `timesteps` ([batch] floats on
// the device, batch = out.rows).
template <class Dev, class T>
void get_timestep_embedding(Dev& dev, const float* timesteps, MatView<T> out, const TimestepEmbeddingOptions& options) {
  detail::check_vision_device<Dev>("nn::get_timestep_embedding");
  const SinusoidalTimesteps<T> f = sinusoidal_timesteps<T>(timesteps, out.data, options);
  detail::check_shape("nn::get_timestep_embedding", "output", out, out.rows, options.dim);
  dev.for_each(static_cast<std::size_t>(out.rows * options.dim), f);
}

}  // namespace dtrain::nn
