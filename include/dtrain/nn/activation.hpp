#pragma once
// Elementwise activations: nn::ReLU, nn::GELU (the exact, erf-based form,
// PyTorch's default), nn::GELUTanh (the tanh approximation GPT-2 uses,
// transformers' "gelu_new"), nn::QuickGELU (CLIP's), nn::SiLU, and
// nn::Activation<Op> for your own;
// and nn::SwiGLU, the gate of a Llama-style MLP. An Op provides
//   static float forward(float x);
//   static float backward(float x, float y, float dy);   // dL/dx
// as DTRAIN_HOST_DEVICE functions; math is in fp32 whatever the dtype.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

namespace detail {

// On the GPU both also run four elements per access (Vec4, wide_path: with
// DTRAIN_ELEMENTWISE=wide), the same arithmetic per element.
template <class Op, class T>
struct ActivationForward {
  const T* x;
  T* y;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    y[i] = dtype_cast<T>(Op::forward(static_cast<float>(x[i])));
  }
#if defined(__CUDACC__)
  static constexpr std::size_t vector_width = 4;
  static constexpr bool wide_path = true;
  bool vector_ok() const noexcept { return aligned_for_vec4(x, sizeof(T)) && aligned_for_vec4(y, sizeof(T)); }
  __device__ void apply_vector(std::size_t first) const {
    const Vec4<T> in = *reinterpret_cast<const Vec4<T>*>(x + first);
    Vec4<T> out;
    for (int l = 0; l < 4; ++l) out.v[l] = dtype_cast<T>(Op::forward(static_cast<float>(in.v[l])));
    *reinterpret_cast<Vec4<T>*>(y + first) = out;
  }
#endif
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
#if defined(__CUDACC__)
  static constexpr std::size_t vector_width = 4;
  static constexpr bool wide_path = true;
  bool vector_ok() const noexcept {
    return aligned_for_vec4(x, sizeof(T)) && aligned_for_vec4(y, sizeof(T)) && aligned_for_vec4(dy, sizeof(T)) &&
           aligned_for_vec4(dx, sizeof(T));
  }
  __device__ void apply_vector(std::size_t first) const {
    const Vec4<T> a = *reinterpret_cast<const Vec4<T>*>(x + first), b = *reinterpret_cast<const Vec4<T>*>(y + first),
                  g = *reinterpret_cast<const Vec4<T>*>(dy + first);
    Vec4<T> out;
    for (int l = 0; l < 4; ++l)
      out.v[l] = dtype_cast<T>(
          Op::backward(static_cast<float>(a.v[l]), static_cast<float>(b.v[l]), static_cast<float>(g.v[l])));
    *reinterpret_cast<Vec4<T>*>(dx + first) = out;
  }
#endif
};

// x[r, c] += bias[c] (rounded to T), then y = f(x): a Linear's bias folded
// into the activation's pass after its product (nn::MLP on the host), so
// the bias is not first broadcast into the product's output. A row per index.
template <class Op, class T>
struct BiasActivationForward {
  T* x;
  const T* bias;
  T* y;
  std::int64_t cols;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(cols); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    T* xr = x + static_cast<std::int64_t>(i) * cols;
    T* yr = y + static_cast<std::int64_t>(i) * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const T v = dtype_cast<T>(static_cast<float>(xr[c]) + static_cast<float>(bias[c]));
      xr[c] = v;
      yr[c] = dtype_cast<T>(Op::forward(static_cast<float>(v)));
    }
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
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float forward(float x) {
    return 0.5f * x * (1.f + math::erf(x * inv_sqrt2));
  }
  // d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float backward(float x, float, float dy) {
    const float z = x * inv_sqrt2;
    const float e = math::exp(-(z * z));  // exp(-x^2 / 2): the density's, and erf's tail
    const float cdf = 0.5f * (1.f + math::erf_given_exp(z, e));
    const float pdf = inv_sqrt_2pi * e;
    return dy * (cdf + x * pdf);
  }
};

// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), written as
// x * sigmoid(2u) (the same function): no cancellation near 0 and no tanh
// call, so the loop vectorises like the others.
struct gelu_tanh_op {
  static constexpr float sqrt_2_over_pi = 0.79788456080286536f;
  static constexpr float cubic = 0.044715f;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float gate(float x) {
    const float u = sqrt_2_over_pi * (x + cubic * x * x * x);
    return 1.f / (1.f + math::exp(-2.f * u));
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float forward(float x) { return x * gate(x); }
  // d/dx [x s(2u)] = s + x s (1 - s) 2 du/dx
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float backward(float x, float, float dy) {
    const float s = gate(x);
    const float du = sqrt_2_over_pi * (1.f + 3.f * cubic * x * x);
    return dy * (s + 2.f * x * s * (1.f - s) * du);
  }
};

// x * sigmoid(x) (PyTorch's nn.SiLU, Llama's "silu").
struct silu_op {
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float sigmoid(float x) { return 1.f / (1.f + math::exp(-x)); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float forward(float x) { return x * sigmoid(x); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float backward(float x, float, float dy) {
    const float s = sigmoid(x);
    return dy * (s + x * s * (1.f - s));
  }
};

// x * sigmoid(1.702 x): CLIP's "quick_gelu", a sigmoid fit to GELU that
// the OpenAI CLIP models (and LLaVA's vision tower) were trained with.
struct quick_gelu_op {
  static constexpr float slope = 1.702f;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float sigmoid(float x) { return 1.f / (1.f + math::exp(-slope * x)); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float forward(float x) { return x * sigmoid(x); }
  // d/dx [x s(a x)] = s + a x s (1 - s)
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE static float backward(float x, float, float dy) {
    const float s = sigmoid(x);
    return dy * (s + slope * x * s * (1.f - s));
  }
};

// y[r, j] = act(x[r, j]) * x[r, hidden + j]: the gate half, then the up half
// (Op: silu_op for SwiGLU, gelu_tanh_op for GeGLU).
// (span: the host's row loops, backend/host/device_isa.hpp.)
template <class Op, class T>
struct GatedForward {
  MatView<const T> x;
  MatView<T> y;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void at(std::int64_t r, std::int64_t j) const {
    const float g = static_cast<float>(x(r, j)), u = static_cast<float>(x(r, y.cols + j));
    y(r, j) = dtype_cast<T>(Op::forward(g) * u);
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    at(static_cast<std::int64_t>(i) / y.cols, static_cast<std::int64_t>(i) % y.cols);
  }
  void span(std::size_t begin, std::size_t end) const {
    dtrain::detail::row_pieces(begin, end, y.cols, [this](std::int64_t r, std::int64_t j0, std::int64_t j1) {
      for (std::int64_t j = j0; j < j1; ++j) at(r, j);
    });
  }
};

template <class Op, class T>
struct GatedBackward {
  MatView<const T> x;
  MatView<const T> dy;
  MatView<T> dx;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void at(std::int64_t r, std::int64_t j) const {
    const float g = static_cast<float>(x(r, j)), u = static_cast<float>(x(r, dy.cols + j));
    const float d = static_cast<float>(dy(r, j));
    dx(r, j) = dtype_cast<T>(Op::backward(g, 0.f, d * u));
    dx(r, dy.cols + j) = dtype_cast<T>(d * Op::forward(g));
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

template <class T>
using SwiGluForward = GatedForward<silu_op, T>;
template <class T>
using SwiGluBackward = GatedBackward<silu_op, T>;

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

  // forward of x + bias (bias [x.cols]), x updated in place to x + bias, the
  // input backward reads: a Linear's bias folded into this pass (nn::MLP).
  // On the host; a row per index.
  template <class Dev, class T>
  void forward_with_bias(Dev& dev, const T* bias, MatView<T> x, MatView<T> y) {
    static_assert(Dev::host_accessible, "forward_with_bias runs a row per index: the host's form");
    nn::detail::check_shape("nn::Activation", "output", y, x.rows, x.cols);
    dev.for_each(static_cast<std::size_t>(x.rows), detail::BiasActivationForward<Op, T>{x.data, bias, y.data, x.cols});
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
using GELUTanh = Activation<detail::gelu_tanh_op>;
using SiLU = Activation<detail::silu_op>;
using QuickGELU = Activation<detail::quick_gelu_op>;

// A gated activation: input [rows, 2 hidden] holding the gate projection
// then the up projection (one fused Linear), output [rows, hidden] =
// act(gate) * up. Llama's MLP is
//   Linear(dim, 2 hidden, no bias) -> SwiGLU -> Linear(hidden, dim, no bias),
// Gemma's the same with GeGLU (the tanh GELU as the gate's activation).
template <class Op>
struct GatedActivation {
  static constexpr std::int64_t input_multiple = 2;  // reads gate | up
  std::vector<ParamSpec> params() const { return {}; }
  std::int64_t out_features(std::int64_t in) const {
    if (in < 2 || in % 2 != 0)
      throw config_error(std::string(name()) + ": the input width " + std::to_string(in) + " is not 2 x hidden",
                         "feed it a Linear(dim, 2 * hidden) whose first half is the gate, the second the up "
                         "projection");
    return in / 2;
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    nn::detail::check_count(name(), "parameters", p.size(), 0);
    nn::detail::check_shape(name(), "output", y, x.rows, out_features(x.cols));
    dev.for_each(static_cast<std::size_t>(y.size()), detail::GatedForward<Op, T>{x, y});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T>, MatView<const T> x, MatView<const T>, MatView<const T> dy,
                MatView<T> dx) {
    if (dx.empty()) return;
    nn::detail::check_shape(name(), "output gradient", dy, x.rows, out_features(x.cols));
    nn::detail::check_shape(name(), "input gradient", dx, x.rows, x.cols);
    dev.for_each(static_cast<std::size_t>(dy.size()), detail::GatedBackward<Op, T>{x, dy, dx});
  }

 private:
  static const char* name() { return std::is_same_v<Op, detail::silu_op> ? "nn::SwiGLU" : "nn::GeGLU"; }
};

using SwiGLU = GatedActivation<detail::silu_op>;
using GeGLU = GatedActivation<detail::gelu_tanh_op>;

}  // namespace dtrain::nn

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_ACTIVATION_FUNCTORS(EACH, SUM, T)                                            \
  EACH(::dtrain::nn::detail::ActivationForward<::dtrain::nn::detail::relu_op, T>)           \
  EACH(::dtrain::nn::detail::ActivationBackward<::dtrain::nn::detail::relu_op, T>)          \
  EACH(::dtrain::nn::detail::BiasActivationForward<::dtrain::nn::detail::relu_op, T>)       \
  EACH(::dtrain::nn::detail::ActivationForward<::dtrain::nn::detail::gelu_op, T>)           \
  EACH(::dtrain::nn::detail::ActivationBackward<::dtrain::nn::detail::gelu_op, T>)          \
  EACH(::dtrain::nn::detail::BiasActivationForward<::dtrain::nn::detail::gelu_op, T>)       \
  EACH(::dtrain::nn::detail::ActivationForward<::dtrain::nn::detail::gelu_tanh_op, T>)      \
  EACH(::dtrain::nn::detail::ActivationBackward<::dtrain::nn::detail::gelu_tanh_op, T>)     \
  EACH(::dtrain::nn::detail::BiasActivationForward<::dtrain::nn::detail::gelu_tanh_op, T>)  \
  EACH(::dtrain::nn::detail::ActivationForward<::dtrain::nn::detail::silu_op, T>)           \
  EACH(::dtrain::nn::detail::ActivationBackward<::dtrain::nn::detail::silu_op, T>)          \
  EACH(::dtrain::nn::detail::BiasActivationForward<::dtrain::nn::detail::silu_op, T>)       \
  EACH(::dtrain::nn::detail::ActivationForward<::dtrain::nn::detail::quick_gelu_op, T>)     \
  EACH(::dtrain::nn::detail::ActivationBackward<::dtrain::nn::detail::quick_gelu_op, T>)    \
  EACH(::dtrain::nn::detail::BiasActivationForward<::dtrain::nn::detail::quick_gelu_op, T>) \
  EACH(::dtrain::nn::detail::GatedForward<::dtrain::nn::detail::silu_op, T>)                \
  EACH(::dtrain::nn::detail::GatedBackward<::dtrain::nn::detail::silu_op, T>)               \
  EACH(::dtrain::nn::detail::GatedForward<::dtrain::nn::detail::gelu_tanh_op, T>)           \
  EACH(::dtrain::nn::detail::GatedBackward<::dtrain::nn::detail::gelu_tanh_op, T>)
