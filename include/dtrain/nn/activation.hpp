#pragma once
// Elementwise activations: nn::ReLU and nn::GELU (the exact, erf-based form,
// PyTorch's default), and nn::Activation<Op> for your own. An Op provides
//   static float forward(float x);
//   static float backward(float x, float y, float dy);   // dL/dx
// as DTRAIN_HOST_DEVICE functions; math is in fp32 whatever the dtype.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

namespace detail {

template <class Op, class T>
struct ActivationForward {
  const T* x;
  T* y;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    y[i] = dtype_cast<T>(Op::forward(static_cast<float>(x[i])));
  }
};

template <class Op, class T>
struct ActivationBackward {
  const T* x;
  const T* y;
  const T* dy;
  T* dx;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    dx[i] = dtype_cast<T>(Op::backward(static_cast<float>(x[i]), static_cast<float>(y[i]), static_cast<float>(dy[i])));
  }
};

struct relu_op {
  // `x < 0` rather than `x > 0` so a NaN passes through: a NaN must reach the
  // loss and the non-finite check, not be silently turned into 0.
  DTRAIN_HOST_DEVICE static float forward(float x) { return x < 0.f ? 0.f : x; }
  DTRAIN_HOST_DEVICE static float backward(float, float y, float dy) { return y > 0.f ? dy : 0.f; }
};

struct gelu_op {
  static constexpr float inv_sqrt2 = 0.70710678118654752f;
  static constexpr float inv_sqrt_2pi = 0.39894228040143268f;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float forward(float x) { return 0.5f * x * (1.f + math::erf(x * inv_sqrt2)); }
  // d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float backward(float x, float, float dy) {
    const float cdf = 0.5f * (1.f + math::erf(x * inv_sqrt2));
    const float pdf = inv_sqrt_2pi * math::exp(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};

}  // namespace detail

template <class Op>
struct Activation {
  std::vector<ParamSpec> params() const { return {}; }
  std::int64_t out_features(std::int64_t in) const { return in; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    nn::detail::check_count("nn::Activation", "parameters", p.size(), 0);
    nn::detail::check_shape("nn::Activation", "output", y, x.rows, x.cols);
    dev.for_each(static_cast<std::size_t>(x.size()), detail::ActivationForward<Op, T>{x.data, y.data});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T>, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx) {
    if (dx.empty()) return;  // nothing to compute without an input gradient
    nn::detail::check_shape("nn::Activation", "output", y, x.rows, x.cols);
    nn::detail::check_shape("nn::Activation", "output gradient", dy, x.rows, x.cols);
    nn::detail::check_shape("nn::Activation", "input gradient", dx, x.rows, x.cols);
    dev.for_each(static_cast<std::size_t>(x.size()),
                 detail::ActivationBackward<Op, T>{x.data, y.data, dy.data, dx.data});
  }
};

using ReLU = Activation<detail::relu_op>;
using GELU = Activation<detail::gelu_op>;

}  // namespace dtrain::nn
