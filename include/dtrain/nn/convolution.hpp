#pragma once
// nn::Conv2d: a 2-D convolution over NCHW images, as PyTorch's nn.Conv2d
// (cross-correlation, zero padding, groups, no dilation): weight
// [out_channels, in_channels / groups, kernel_h, kernel_w], bias
// [out_channels], both initialised U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
// fan_in = in_channels / groups * kernel_h * kernel_w.
//
// A unit sees activations as rows, so a Conv2d is built for one image size
// and reads one image per row: x [batch, in_channels * height * width],
// y [batch, out_channels * out_h * out_w], both NCHW flattened.
//
// It runs as im2col and the device's GEMM (kernels/convolution.hpp): the
// columns of every image of the batch, then one strided batched GEMM over
// the groups; backward multiplies the output gradient by the columns (the
// weight gradient) and by the weight (the columns' gradient, which col2im
// gathers into the input gradient). Nothing is kept from forward: backward
// rebuilds the columns from x. The columns and the GEMM's result live in the
// device workspace: (in_channels * kernel_h * kernel_w + out_channels) *
// batch * out_h * out_w elements.
//
// On a GPU the unit runs only with DTRAIN_GPU_VISION=on: its kernels are
// compiled but have not run on a GPU yet (docs/gpu.md, "Kernel paths").

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/convolution.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

// A height and a width: a kernel's, a stride's, a padding's, an image's.
struct Extent2 {
  std::int64_t h = 1;
  std::int64_t w = 1;
};

struct Conv2dOptions {
  Extent2 stride{1, 1};
  Extent2 padding{0, 0};  // zeros on each side
  std::int64_t groups = 1;
  bool bias = true;
  bool trainable = true;  // false freezes weight and bias
};

namespace detail {

// Throws unless DTRAIN_GPU_VISION=on: the vision units' GPU path (a device
// whose buffers the host cannot read) is not proven on a GPU yet.
DTRAIN_DECL void require_gpu_vision(std::string_view unit);

// "h x w", for messages.
DTRAIN_DECL std::string extent_text(Extent2 e);

template <class Dev>
void check_vision_device(std::string_view unit) {
  if constexpr (!Dev::host_accessible) require_gpu_vision(unit);
}

// The device workspace of a convolution: the column matrix, then the GEMM's
// result [out_channels][batch * P] (or its gradient), which starts on a
// 16-byte boundary as the first does, so both GEMM operands keep the
// alignment BLAS and cuBLAS vectorise on.
template <class T>
struct ConvScratch {
  T* col;
  T* proj;
};

template <class Dev, class T>
ConvScratch<T> conv_scratch(Dev& dev, const ConvShape& s) {
  constexpr std::int64_t align = 16 / static_cast<std::int64_t>(sizeof(T));
  const std::int64_t col = (s.col_size() + align - 1) / align * align;
  T* base = dev.template workspace<T>(static_cast<std::size_t>(col + s.out_channels * s.col_cols()));
  return {base, base + col};
}

// proj [out_channels][batch * P] = weight * the columns of x (+ bias, which
// the GEMM adds, so the result is rounded once), then epilogue(proj) moves it
// into the unit's output. Nothing to do without images.
template <class Dev, class T, class Epilogue>
void conv_forward(Dev& dev, const ConvShape& s, const T* weight, const T* bias, const T* x, Epilogue&& epilogue) {
  const std::int64_t k = s.col_rows(), cols = s.col_cols(), og = s.group_out();
  if (cols == 0) return;
  const ConvScratch<T> w = conv_scratch<Dev, T>(dev, s);
  im2col(dev, s, x, w.col);
  float beta = 0.f;
  if (bias != nullptr) {
    dev.for_each(static_cast<std::size_t>(s.out_channels * cols), FillRows<T>{bias, w.proj, cols});
    beta = 1.f;
  }
  dev.gemm_batched(false, false, og, cols, k, 1.f, weight, k, og * k, w.col, cols, k * cols, beta, w.proj, cols,
                   og * cols, s.groups);
  epilogue(static_cast<const T*>(w.proj));
}

// prologue(dproj) writes the gradient of conv_forward's proj; from it come
// the weight's (dweight), the bias's (dbias) and x's (dx) gradients, each
// skipped when null. Without images the parameter gradients are zero.
template <class Dev, class T, class Prologue>
void conv_backward(Dev& dev, const ConvShape& s, const T* weight, const T* x, Prologue&& prologue, T* dweight, T* dbias,
                   T* dx) {
  const std::int64_t k = s.col_rows(), cols = s.col_cols(), og = s.group_out();
  if (cols == 0) {
    if (dweight != nullptr) dev.zero(dweight, static_cast<std::size_t>(s.out_channels * k));
    if (dbias != nullptr) dev.zero(dbias, static_cast<std::size_t>(s.out_channels));
    return;
  }
  if (dx == nullptr && dweight == nullptr && dbias == nullptr) return;
  const ConvScratch<T> w = conv_scratch<Dev, T>(dev, s);
  prologue(w.proj);
  if (dbias != nullptr) dev.for_each(static_cast<std::size_t>(s.out_channels), RowSum<T>{w.proj, dbias, cols});
  if (dweight != nullptr) {
    im2col(dev, s, x, w.col);
    dev.gemm_batched(false, true, og, k, cols, 1.f, w.proj, cols, og * cols, w.col, cols, k * cols, 0.f, dweight, k,
                     og * k, s.groups);
  }
  if (dx != nullptr) {  // the columns' gradient, over the columns: no longer needed
    dev.gemm_batched(true, false, k, cols, og, 1.f, weight, k, og * k, w.proj, cols, og * cols, 0.f, w.col, cols,
                     k * cols, s.groups);
    col2im(dev, s, w.col, dx);
  }
}

}  // namespace detail

class Conv2d {
 public:
  // `image`: the height and width of the input images.
  DTRAIN_DECL Conv2d(std::int64_t in_channels, std::int64_t out_channels, Extent2 kernel, Extent2 image,
                     Conv2dOptions options = {});

  std::int64_t in_channels() const noexcept { return in_; }
  std::int64_t out_channels() const noexcept { return out_; }
  std::int64_t out_h() const noexcept { return shape(1).out_h(); }
  std::int64_t out_w() const noexcept { return shape(1).out_w(); }
  bool has_bias() const noexcept { return options_.bias; }
  // The convolution over `batch` images.
  DTRAIN_DECL ConvShape shape(std::int64_t batch) const noexcept;

  DTRAIN_DECL std::vector<ParamSpec> params() const;

  // in: the values per image, in_channels * height * width.
  std::int64_t out_features(std::int64_t in) const {
    if (in != in_ * image_.h * image_.w) input_mismatch(in);
    return out_ * out_h() * out_w();
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    detail::check_vision_device<Dev>("nn::Conv2d");
    check_params(p);
    check_rows(x);
    detail::check_shape("nn::Conv2d", "output", y, x.rows, out_ * out_h() * out_w());
    const ConvShape s = shape(x.rows);
    detail::conv_forward(dev, s, p[0].data, options_.bias ? p[1].data : nullptr, x.data,
                         [&](const T* proj) { to_samples(dev, s, proj, y.data, true); });
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    detail::check_vision_device<Dev>("nn::Conv2d");
    check_params(p);
    detail::check_count("nn::Conv2d", "gradients", grad.size(), p.size());
    check_rows(x);
    detail::check_shape("nn::Conv2d", "output gradient", dy, x.rows, out_ * out_h() * out_w());
    if (!dx.empty()) detail::check_shape("nn::Conv2d", "input gradient", dx, x.rows, x.cols);
    T* dweight = grad[0].empty() ? nullptr : grad[0].data;  // empty when frozen
    T* dbias = options_.bias && !grad[1].empty() ? grad[1].data : nullptr;
    if (dweight != nullptr) detail::check_shape("nn::Conv2d", "weight gradient", grad[0], out_, p[0].cols);
    if (dbias != nullptr) detail::check_shape("nn::Conv2d", "bias gradient", grad[1], out_, 1);
    const ConvShape s = shape(x.rows);
    detail::conv_backward(
        dev, s, p[0].data, x.data, [&](T* dproj) { to_samples(dev, s, dy.data, dproj, false); }, dweight, dbias,
        dx.empty() ? nullptr : dx.data);
  }

 private:
  [[noreturn]] DTRAIN_DECL void input_mismatch(std::int64_t in) const;

  template <class T>
  void check_rows(MatView<const T> x) const {
    if (x.cols != in_ * image_.h * image_.w) input_mismatch(x.cols);
  }

  template <class T>
  void check_params(UnitParams<T> p) const {
    detail::check_count("nn::Conv2d", "parameters", p.size(), options_.bias ? 2 : 1);
    detail::check_shape("nn::Conv2d", "weight", p[0], out_, in_ / options_.groups * kernel_.h * kernel_.w);
    if (options_.bias) detail::check_shape("nn::Conv2d", "bias", p[1], out_, 1);
  }

  std::int64_t in_;
  std::int64_t out_;
  Extent2 kernel_;
  Extent2 image_;
  Conv2dOptions options_;
};

}  // namespace dtrain::nn

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/convolution.ipp"
#endif
