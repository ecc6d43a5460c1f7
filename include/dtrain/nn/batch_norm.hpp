#pragma once
// Per-channel normalisation of NCHW images, as torchvision and PyTorch:
//
//  - nn::FrozenBatchNorm2d (torchvision.ops.FrozenBatchNorm2d, the backbone
//    norm of LeRobot's ACT): y = (x - running_mean) / sqrt(running_var + eps)
//    * weight + bias, all four frozen; backward gives the input gradient.
//  - nn::BatchNorm2d (nn.BatchNorm2d): in a training forward (ctx.training)
//    it normalises with the statistics of this call's images, the mean and
//    the biased variance over batch * height * width per channel; otherwise
//    with running_mean and running_var, as the frozen form. weight and bias
//    are trainable (tagged "norm"), running_mean and running_var frozen.
//
// The statistics are per rank: each rank normalises its micro-batch alone,
// as nn.BatchNorm2d under DDP without SyncBatchNorm. A synchronised form is
// not needed for parity with LeRobot, whose ACT backbone uses the frozen
// form; it would need a collective inside a unit's forward, which units do
// not have.
//
// BatchNorm2d does NOT update running_mean and running_var in training:
// PyTorch's momentum update writes buffers from forward, and a unit sees its
// parameters read-only, as copies the library owns (in the compute dtype
// under mixed precision, gathered shards under FSDP), and may run forward
// twice for one step (activation checkpointing). The running statistics stay
// what was loaded or initialised (zeros and ones).
//
// Like nn::Conv2d both are built for one image size and read one image per
// row: x and y [batch, channels * height * width], NCHW flattened. Parameters
// in torchvision's order and names: weight [channels] (ones), bias (zeros),
// running_mean (zeros), running_var (ones); PyTorch's num_batches_tracked
// counter is not one of them. Nothing is kept from forward.
//
// One index of for_each per channel reduces over its batch * height * width
// values, in double (a ResNet stem's channel holds batch * 112 * 112 values,
// too many for one fp32 sum), into per-channel coefficients in the device
// workspace; then one index per element applies them.
//
// On a GPU the units run only with DTRAIN_GPU_VISION=on (nn/convolution.hpp).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
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

// Per channel: mean, rstd = 1 / sqrt(var + eps), and for backward
// mean_g = mean(dy * weight) and mean_gx = mean(dy * weight * xhat) over the
// channel's values when the statistics are the batch's (their gradient
// flows through them), zero otherwise.
struct channel_coeffs {
  float mean, rstd, mean_g, mean_gx;
};

// The coefficients of channel c from the batch (running_mean null) or the
// running statistics; with dy, also dweight[c] = sum(dy * xhat) and
// dbias[c] = sum(dy), each unless null. Run over channels.
template <Dtype T>
struct ChannelCoeffs {
  const T* x;
  const T* weight;
  const T* running_mean;  // null: the batch's statistics
  const T* running_var;
  const T* dy;  // null in forward
  T* dweight;
  T* dbias;
  channel_coeffs* out;
  std::int64_t batch, channels, plane;
  float eps;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(batch * plane); }

  template <class F>
  DTRAIN_HOST_DEVICE double sum(std::int64_t c, F f) const {
    double acc = 0.0;
    for (std::int64_t n = 0; n < batch; ++n) {
      const std::int64_t base = (n * channels + c) * plane;
      for (std::int64_t p = 0; p < plane; ++p) acc += f(base + p);
    }
    return acc;
  }

  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto c = static_cast<std::int64_t>(i);
    const double count = static_cast<double>(batch * plane);
    double mean, var;
    if (running_mean == nullptr) {
      mean = count > 0 ? sum(c, [&](std::int64_t j) { return static_cast<double>(x[j]); }) / count : 0.0;
      var = count > 0 ? sum(c,
                            [&](std::int64_t j) {
                              const double d = static_cast<double>(x[j]) - mean;
                              return d * d;
                            }) /
                            count
                      : 0.0;
    } else {
      mean = static_cast<double>(running_mean[c]);
      var = static_cast<double>(running_var[c]);
    }
    const float rstd_f = 1.f / math::sqrt(static_cast<float>(var) + eps);
    const auto rstd = static_cast<double>(rstd_f);
    channel_coeffs k{static_cast<float>(mean), rstd_f, 0.f, 0.f};
    if (dy != nullptr) {
      const double sum_dy = sum(c, [&](std::int64_t j) { return static_cast<double>(dy[j]); });
      const double sum_dy_xhat = sum(
          c, [&](std::int64_t j) { return static_cast<double>(dy[j]) * (static_cast<double>(x[j]) - mean) * rstd; });
      if (dweight != nullptr) dweight[c] = dtype_cast<T>(static_cast<float>(sum_dy_xhat));
      if (dbias != nullptr) dbias[c] = dtype_cast<T>(static_cast<float>(sum_dy));
      if (running_mean == nullptr && count > 0) {
        const double w = static_cast<double>(weight[c]);
        k.mean_g = static_cast<float>(w * sum_dy / count);
        k.mean_gx = static_cast<float>(w * sum_dy_xhat / count);
      }
    }
    out[c] = k;
  }
};

// y = (x - mean) * rstd * weight + bias. Run over batch * channels * plane.
template <Dtype T>
struct ChannelNormalize {
  const T* x;
  const T* weight;
  const T* bias;
  const channel_coeffs* k;
  T* y;
  std::int64_t channels, plane;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t c = (static_cast<std::int64_t>(i) / plane) % channels;
    const float xhat = (static_cast<float>(x[i]) - k[c].mean) * k[c].rstd;
    y[i] = dtype_cast<T>(xhat * static_cast<float>(weight[c]) + static_cast<float>(bias[c]));
  }
};

// ChannelNormalize a plane at a time (the host's form): index i is
// (n, c). Run over batch * channels.
template <Dtype T>
struct ChannelNormalizePlanes {
  ChannelNormalize<T> f;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t c = idx % f.channels;
    const float mean = f.k[c].mean, rstd = f.k[c].rstd, weight = static_cast<float>(f.weight[c]);
    const float shift = static_cast<float>(f.bias[c]);
    const T* x = f.x + idx * f.plane;
    T* y = f.y + idx * f.plane;
    for (std::int64_t p = 0; p < f.plane; ++p)
      y[p] = dtype_cast<T>((static_cast<float>(x[p]) - mean) * rstd * weight + shift);
  }
  std::size_t work_per_index() const { return static_cast<std::size_t>(f.plane); }
};

// dx = rstd * (dy * weight - mean_g - xhat * mean_gx). Run over
// batch * channels * plane.
template <Dtype T>
struct ChannelNormalizeBackward {
  const T* x;
  const T* weight;
  const T* dy;
  const channel_coeffs* k;
  T* dx;
  std::int64_t channels, plane;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t c = (static_cast<std::int64_t>(i) / plane) % channels;
    const float xhat = (static_cast<float>(x[i]) - k[c].mean) * k[c].rstd;
    const float g = static_cast<float>(dy[i]) * static_cast<float>(weight[c]);
    dx[i] = dtype_cast<T>(k[c].rstd * (g - k[c].mean_g - xhat * k[c].mean_gx));
  }
};

// The part both units share: shapes, checks and the passes above, with the
// batch's statistics or the running ones.
class ChannelNorm {
 public:
  ChannelNorm(std::string_view unit, std::int64_t channels, Extent2 image, float eps)
      : unit_(unit), channels_(channels), image_(image), eps_(eps) {
    if (channels < 1 || image.h < 1 || image.w < 1)
      throw config_error(std::string(unit) + "(" + std::to_string(channels) + ") for " + extent_text(image) +
                             " images: channels and image extents must be >= 1",
                         "give a positive channel count and image size");
    if (!(eps > 0.f))
      throw config_error(std::string(unit) + ": eps " + std::to_string(eps) + " must be > 0",
                         "give a positive eps (PyTorch's default is 1e-5)");
  }

  std::int64_t channels() const noexcept { return channels_; }
  float eps() const noexcept { return eps_; }

  std::vector<ParamSpec> params(bool trainable) const {
    return {{"weight", {channels_}, Init::ones(), trainable, {}, {"norm"}},
            {"bias", {channels_}, Init::zeros(), trainable, {}, {"norm", "bias"}},
            {"running_mean", {channels_}, Init::zeros(), false},
            {"running_var", {channels_}, Init::ones(), false}};
  }

  std::int64_t out_features(std::int64_t in) const {
    const std::int64_t want = channels_ * image_.h * image_.w;
    if (in != want)
      throw config_error(unit_ + " expects " + std::to_string(channels_) + " channels of " + extent_text(image_) +
                             " images, " + std::to_string(want) + " values per row (NCHW), got rows of " +
                             std::to_string(in),
                         "give one flattened [channels, height, width] image per row, or build the unit for the "
                         "images' size");
    return want;
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, bool batch_stats) const {
    check_vision_device<Dev>(unit_);
    check_params(p);
    out_features(x.cols);
    check_shape(unit_, "output", y, x.rows, x.cols);
    if (x.rows == 0) return;
    const std::int64_t plane = image_.h * image_.w;
    auto* k = dev.template workspace<channel_coeffs>(static_cast<std::size_t>(channels_));
    dev.for_each(static_cast<std::size_t>(channels_),
                 ChannelCoeffs<T>{x.data, p[0].data, batch_stats ? nullptr : p[2].data, p[3].data, nullptr, nullptr,
                                  nullptr, k, x.rows, channels_, plane, eps_});
    const ChannelNormalize<T> f{x.data, p[0].data, p[1].data, k, y.data, channels_, plane};
    if constexpr (Dev::host_accessible)
      dev.for_each(static_cast<std::size_t>(x.rows * channels_), ChannelNormalizePlanes<T>{f});
    else
      dev.for_each(static_cast<std::size_t>(x.rows * x.cols), f);
  }

  // Overwrites the weight's and the bias's gradients unless empty (frozen).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> dy,
                MatView<T> dx, bool batch_stats) const {
    check_vision_device<Dev>(unit_);
    check_params(p);
    check_count(unit_, "gradients", grad.size(), p.size());
    out_features(x.cols);
    check_shape(unit_, "output gradient", dy, x.rows, x.cols);
    if (!dx.empty()) check_shape(unit_, "input gradient", dx, x.rows, x.cols);
    T* dweight = grad[0].empty() ? nullptr : grad[0].data;
    T* dbias = grad[1].empty() ? nullptr : grad[1].data;
    if (dweight != nullptr) check_shape(unit_, "weight gradient", grad[0], channels_, 1);
    if (dbias != nullptr) check_shape(unit_, "bias gradient", grad[1], channels_, 1);
    if (dx.empty() && dweight == nullptr && dbias == nullptr) return;
    const std::int64_t plane = image_.h * image_.w;
    auto* k = dev.template workspace<channel_coeffs>(static_cast<std::size_t>(channels_));
    // the sums over dy run when a parameter gradient or the batch statistics' need them
    const bool sums = dweight != nullptr || dbias != nullptr || batch_stats;
    dev.for_each(static_cast<std::size_t>(channels_),
                 ChannelCoeffs<T>{x.data, p[0].data, batch_stats ? nullptr : p[2].data, p[3].data,
                                  sums ? dy.data : nullptr, dweight, dbias, k, x.rows, channels_, plane, eps_});
    if (!dx.empty() && x.rows > 0)
      dev.for_each(static_cast<std::size_t>(x.rows * x.cols),
                   ChannelNormalizeBackward<T>{x.data, p[0].data, dy.data, k, dx.data, channels_, plane});
  }

 private:
  template <class T>
  void check_params(UnitParams<T> p) const {
    check_count(unit_, "parameters", p.size(), 4);
    for (const auto& v : p) check_shape(unit_, "parameter", v, channels_, 1);
  }

  std::string unit_;
  std::int64_t channels_;
  Extent2 image_;
  float eps_;
};

}  // namespace detail

class FrozenBatchNorm2d {
 public:
  // `image`: the height and width of the input images.
  FrozenBatchNorm2d(std::int64_t channels, Extent2 image, float eps = 1e-5f)
      : norm_("nn::FrozenBatchNorm2d", channels, image, eps) {}

  std::int64_t channels() const noexcept { return norm_.channels(); }
  std::vector<ParamSpec> params() const { return norm_.params(false); }
  std::int64_t out_features(std::int64_t in) const { return norm_.out_features(in); }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    norm_.forward(dev, p, x, y, false);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    norm_.backward(dev, p, grad, x, dy, dx, false);
  }

 private:
  detail::ChannelNorm norm_;
};

struct BatchNorm2dOptions {
  float eps = 1e-5f;
  bool trainable = true;  // false freezes weight and bias (the running statistics always are)
};

class BatchNorm2d {
 public:
  // `image`: the height and width of the input images.
  BatchNorm2d(std::int64_t channels, Extent2 image, BatchNorm2dOptions options = {})
      : norm_("nn::BatchNorm2d", channels, image, options.eps), trainable_(options.trainable) {}

  std::int64_t channels() const noexcept { return norm_.channels(); }
  std::vector<ParamSpec> params() const { return norm_.params(trainable_); }
  std::int64_t out_features(std::int64_t in) const { return norm_.out_features(in); }

  // The batch's statistics in a training call, the running ones otherwise.
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    norm_.forward(dev, p, x, y, ctx.training);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    norm_.backward(dev, p, grad, x, dy, dx, ctx.training);
  }

 private:
  detail::ChannelNorm norm_;
  bool trainable_;
};

}  // namespace dtrain::nn
