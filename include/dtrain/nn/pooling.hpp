#pragma once
// nn::MaxPool2d: 2-D max pooling over NCHW images, as PyTorch's
// nn.MaxPool2d without dilation or ceil_mode: the stride defaults to the
// kernel, the padding counts as -inf (a window never takes it), and
// out = (size + 2 * padding - kernel) / stride + 1. ResNet's stem pools with
// kernel 3, stride 2, padding 1.
//
// Like nn::Conv2d it is built for one image size and reads one image per
// row: x [batch, channels * height * width], y [batch, channels * out_h *
// out_w], both NCHW flattened. It has no parameters.
//
// Backward routes each output's gradient to its window's maximum, the first
// one in row-major window order on ties (PyTorch's choice; a NaN counts as
// the maximum, as there). Nothing is kept from forward: backward finds the
// maxima again from x, one index per output in the device workspace, then
// gathers per input element the gradients of the windows whose maximum it
// is (no atomics: deterministic on every device), summed in fp32.
//
// On a GPU the unit runs only with DTRAIN_GPU_VISION=on (nn/convolution.hpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/convolution.hpp"

namespace dtrain::nn {

namespace detail {

// The shape of one pooling over a batch of images.
struct PoolShape {
  std::int64_t batch, channels, height, width;
  std::int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;

  DTRAIN_HOST_DEVICE std::int64_t out_h() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  DTRAIN_HOST_DEVICE std::int64_t out_w() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  DTRAIN_HOST_DEVICE std::int64_t output_size() const { return batch * channels * out_h() * out_w(); }
  DTRAIN_HOST_DEVICE std::int64_t input_size() const { return batch * channels * height * width; }

  // The index within its image plane (ih * width + iw) of the first maximum
  // of output element `o`'s window; every window holds at least one input
  // element (padding <= kernel / 2, checked at construction).
  template <class T>
  DTRAIN_HOST_DEVICE std::int32_t argmax(const T* x, std::int64_t o) const {
    const std::int64_t ow = o % out_w(), oh = (o / out_w()) % out_h(), plane = o / (out_w() * out_h());
    const T* img = x + plane * height * width;
    const std::int64_t h0 = oh * stride_h - pad_h, w0 = ow * stride_w - pad_w;
    std::int64_t best = -1;
    float best_v = 0.f;
    for (std::int64_t ih = h0 < 0 ? 0 : h0; ih < h0 + kernel_h && ih < height; ++ih)
      for (std::int64_t iw = w0 < 0 ? 0 : w0; iw < w0 + kernel_w && iw < width; ++iw) {
        const float v = static_cast<float>(img[ih * width + iw]);
        if (best < 0 || v > best_v || v != v) {
          best = ih * width + iw;
          best_v = v;
          if (v != v) return static_cast<std::int32_t>(best);  // NaN wins, as in PyTorch
        }
      }
    return static_cast<std::int32_t>(best);
  }
};

// y[o] = the maximum of o's window. Run over s.output_size().
template <Dtype T>
struct MaxPoolForward {
  PoolShape s;
  const T* x;
  T* y;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto o = static_cast<std::int64_t>(i);
    const std::int64_t plane = o / (s.out_h() * s.out_w());
    y[o] = x[plane * s.height * s.width + s.argmax(x, o)];
  }
};

// arg[o] = the plane index of o's maximum. Run over s.output_size().
template <Dtype T>
struct MaxPoolArgmax {
  PoolShape s;
  const T* x;
  std::int32_t* arg;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { arg[i] = s.argmax(x, static_cast<std::int64_t>(i)); }
};

// dx[n, c, ih, iw] = the sum of dy over the windows whose maximum is this
// element, in fp32, rounded once. Run over s.input_size().
template <Dtype T>
struct MaxPoolBackward {
  PoolShape s;
  const std::int32_t* arg;
  const T* dy;
  T* dx;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto idx = static_cast<std::int64_t>(i);
    const std::int64_t in_plane = idx % (s.height * s.width), plane = idx / (s.height * s.width);
    const std::int64_t ih = in_plane / s.width, iw = in_plane % s.width;
    const std::int64_t oh_n = s.out_h(), ow_n = s.out_w();
    // the windows holding (ih, iw): oh * stride_h - pad_h <= ih < that + kernel_h
    const std::int64_t hh = ih + s.pad_h, ww = iw + s.pad_w;
    const std::int64_t oh_lo = hh < s.kernel_h ? 0 : (hh - s.kernel_h) / s.stride_h + 1;
    const std::int64_t ow_lo = ww < s.kernel_w ? 0 : (ww - s.kernel_w) / s.stride_w + 1;
    const std::int64_t oh_hi = hh / s.stride_h < oh_n - 1 ? hh / s.stride_h : oh_n - 1;
    const std::int64_t ow_hi = ww / s.stride_w < ow_n - 1 ? ww / s.stride_w : ow_n - 1;
    float acc = 0.f;
    for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const std::int64_t o = (plane * oh_n + oh) * ow_n + ow;
        if (arg[o] == in_plane) acc += static_cast<float>(dy[o]);
      }
    dx[idx] = dtype_cast<T>(acc);
  }
};

}  // namespace detail

struct MaxPool2dOptions {
  std::optional<Extent2> stride{};  // the kernel unless given (PyTorch's default)
  Extent2 padding{0, 0};            // -inf on each side, at most half the kernel
};

class MaxPool2d {
 public:
  // `image`: the height and width of the input images.
  MaxPool2d(std::int64_t channels, Extent2 kernel, Extent2 image, MaxPool2dOptions options = {})
      : channels_(channels),
        kernel_(kernel),
        image_(image),
        stride_(options.stride.value_or(kernel)),
        padding_(options.padding) {
    const std::string name = "nn::MaxPool2d(kernel " + detail::extent_text(kernel) + ", stride " +
                             detail::extent_text(stride_) + ", padding " + detail::extent_text(padding_) + ") over " +
                             std::to_string(channels) + " channels of " + detail::extent_text(image) + " images";
    if (channels < 1 || kernel.h < 1 || kernel.w < 1 || image.h < 1 || image.w < 1 || stride_.h < 1 || stride_.w < 1 ||
        padding_.h < 0 || padding_.w < 0)
      throw config_error(name + ": channels, kernel, image and stride must be >= 1, padding >= 0",
                         "give positive sizes and strides and a non-negative padding");
    if (2 * padding_.h > kernel.h || 2 * padding_.w > kernel.w)
      throw config_error(name + ": the padding is more than half the kernel, so a window could hold only padding",
                         "use a padding of at most kernel / 2 (PyTorch's limit)");
    if (kernel.h > image.h + 2 * padding_.h || kernel.w > image.w + 2 * padding_.w)
      throw config_error(name + ": the kernel is larger than the padded input",
                         "use a smaller kernel, more padding or larger images");
  }

  std::int64_t channels() const noexcept { return channels_; }
  std::int64_t out_h() const noexcept { return shape(1).out_h(); }
  std::int64_t out_w() const noexcept { return shape(1).out_w(); }

  // The pooling over `batch` images.
  detail::PoolShape shape(std::int64_t batch) const noexcept {
    return {batch, channels_, image_.h, image_.w, kernel_.h, kernel_.w, stride_.h, stride_.w, padding_.h, padding_.w};
  }

  std::vector<ParamSpec> params() const { return {}; }

  // in: the values per image, channels * height * width.
  std::int64_t out_features(std::int64_t in) const {
    if (in != channels_ * image_.h * image_.w) input_mismatch(in);
    return channels_ * out_h() * out_w();
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    detail::check_vision_device<Dev>("nn::MaxPool2d");
    detail::check_count("nn::MaxPool2d", "parameters", p.size(), 0);
    out_features(x.cols);
    detail::check_shape("nn::MaxPool2d", "output", y, x.rows, channels_ * out_h() * out_w());
    const detail::PoolShape s = shape(x.rows);
    dev.for_each(static_cast<std::size_t>(s.output_size()), detail::MaxPoolForward<T>{s, x.data, y.data});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T>, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    detail::check_vision_device<Dev>("nn::MaxPool2d");
    detail::check_count("nn::MaxPool2d", "parameters", p.size(), 0);
    out_features(x.cols);
    detail::check_shape("nn::MaxPool2d", "output gradient", dy, x.rows, channels_ * out_h() * out_w());
    if (dx.empty()) return;
    detail::check_shape("nn::MaxPool2d", "input gradient", dx, x.rows, x.cols);
    const detail::PoolShape s = shape(x.rows);
    if (s.output_size() == 0) return;
    auto* arg = dev.template workspace<std::int32_t>(static_cast<std::size_t>(s.output_size()));
    dev.for_each(static_cast<std::size_t>(s.output_size()), detail::MaxPoolArgmax<T>{s, x.data, arg});
    dev.for_each(static_cast<std::size_t>(s.input_size()), detail::MaxPoolBackward<T>{s, arg, dy.data, dx.data});
  }

 private:
  [[noreturn]] void input_mismatch(std::int64_t in) const {
    throw config_error("nn::MaxPool2d expects " + std::to_string(channels_) + " channels of " +
                           detail::extent_text(image_) + " images, " + std::to_string(channels_ * image_.h * image_.w) +
                           " values per row (NCHW), got rows of " + std::to_string(in),
                       "give one flattened [channels, height, width] image per row, or build the MaxPool2d for the "
                       "images' size");
  }

  std::int64_t channels_;
  Extent2 kernel_;
  Extent2 image_;
  Extent2 stride_;
  Extent2 padding_;
};

}  // namespace dtrain::nn
