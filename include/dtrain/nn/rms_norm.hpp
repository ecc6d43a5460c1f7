#pragma once
// nn::RMSNorm over the last dimension, as Llama-family models use it
// (transformers' LlamaRMSNorm): y = x / sqrt(mean(x^2) + eps) * weight, no
// centring and no bias, the weight initialised to ones. Statistics in fp32
// whatever the dtype. Rows and columns run through for_each as in LayerNorm.
// With RmsNormOptions::offset (Gemma's GemmaRMSNorm: offset 1) the scale is
// weight + offset, computed in fp32, and the weight, stored as the offset
// from it, starts at zeros: y = x / sqrt(mean(x^2) + eps) * (offset + weight).

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

namespace dtrain::nn {

namespace detail {

template <class T, class Row>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float inverse_rms(const T* row, std::int64_t n, float eps, const Row& lanes) {
  const float sq =
      lanes.sum(n, [&](std::int64_t c) { return static_cast<float>(row[c]) * static_cast<float>(row[c]); });
  return 1.f / math::sqrt(sq / static_cast<float>(n) + eps);
}

// Row functors as LayerNorm's (math::SerialRow).
template <class T>
struct RmsNormForward {
  static constexpr unsigned row_lanes = math::lanes;
  MatView<const T> x;
  const T* weight;
  MatView<T> y;
  float eps;
  float offset = 0.f;  // the scale is weight + offset (Gemma: 1)
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i);
    const float rstd = inverse_rms(&x(r, 0), x.cols, eps, lanes);
    lanes.each(x.cols, [&](std::int64_t c) {
      y(r, c) = dtype_cast<T>(static_cast<float>(x(r, c)) * rstd * (static_cast<float>(weight[c]) + offset));
    });
  }
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(x.cols); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }
};

// Per row, with xhat = x * rstd and g = dy * weight:
//   dx = rstd * (g - xhat * mean(g * xhat)).
// The row's rstd is kept for the weight gradient.
template <class T>
struct RmsNormBackwardInput {
  static constexpr unsigned row_lanes = math::lanes;
  MatView<const T> x;
  const T* weight;
  MatView<const T> dy;
  MatView<T> dx;  // empty: only rstd is wanted
  float* rstd_out;
  float eps;
  float offset = 0.f;  // as RmsNormForward's
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i);
    const float rstd = inverse_rms(&x(r, 0), x.cols, eps, lanes);
    if (lanes.leader()) rstd_out[r] = rstd;
    if (dx.data == nullptr) return;
    const float mean_g_xhat = lanes.sum(x.cols, [&](std::int64_t c) {
      return static_cast<float>(dy(r, c)) * (static_cast<float>(weight[c]) + offset) * static_cast<float>(x(r, c)) *
             rstd;
    }) / static_cast<float>(x.cols);
    lanes.each(x.cols, [&](std::int64_t c) {
      const float g = static_cast<float>(dy(r, c)) * (static_cast<float>(weight[c]) + offset);
      dx(r, c) = dtype_cast<T>(rstd * (g - static_cast<float>(x(r, c)) * rstd * mean_g_xhat));
    });
  }
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(x.cols); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }
};

// Per group of columns (math::column_sums): dweight = sum over rows of dy * xhat.
template <class T>
struct RmsNormBackwardWeight {
  MatView<const T> x;
  MatView<const T> dy;
  const float* rstd;
  T* dweight;
  std::int64_t group = 1;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(x.rows * group); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    const std::int64_t c0 = static_cast<std::int64_t>(i) * group, width = math::min_i64(group, x.cols - c0);
    const auto dw = [this](std::int64_t r, std::int64_t c) {
      return static_cast<float>(dy(r, c)) * static_cast<float>(x(r, c)) * rstd[r];
    };
    const auto put = [this](std::int64_t c, float v) DTRAIN_LAMBDA_INLINE { dweight[c] = dtype_cast<T>(v); };
    if (group == math::lanes)
      math::column_sums<math::lanes>(x.rows, c0, width, dw, put);
    else
      math::column_sums<1>(x.rows, c0, width, dw, put);
  }
};

}  // namespace detail

struct RmsNormOptions {
  float eps = 1e-6f;      // transformers' rms_norm_eps default for Llama
  bool trainable = true;  // false freezes the weight
  float offset = 0.f;     // the scale is weight + offset; Gemma's 1 (its weight starts at zeros)
};

class RMSNorm {
 public:
  DTRAIN_DECL explicit RMSNorm(std::int64_t features, RmsNormOptions options = {});

  std::int64_t features() const noexcept { return features_; }
  float eps() const noexcept { return options_.eps; }
  float offset() const noexcept { return options_.offset; }

  std::vector<ParamSpec> params() const {
    return {{"weight",
             {features_},
             options_.offset == 0.f ? Init::ones() : Init::zeros(),
             options_.trainable,
             {},
             {"norm"}}};
  }

  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::RMSNorm", in, features_); }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    check_params(p);
    detail::check_shape("nn::RMSNorm", "input", x, x.rows, features_);
    detail::check_shape("nn::RMSNorm", "output", y, x.rows, features_);
    dev.for_each(static_cast<std::size_t>(x.rows),
                 detail::RmsNormForward<T>{x, p[0].data, y, options_.eps, options_.offset});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    check_params(p);
    detail::check_count("nn::RMSNorm", "gradients", grad.size(), p.size());
    detail::check_shape("nn::RMSNorm", "input", x, x.rows, features_);
    detail::check_shape("nn::RMSNorm", "output gradient", dy, x.rows, features_);
    if (!dx.empty()) detail::check_shape("nn::RMSNorm", "input gradient", dx, x.rows, features_);
    if (!grad[0].empty()) detail::check_shape("nn::RMSNorm", "weight gradient", grad[0], features_, 1);
    if (dx.empty() && grad[0].empty()) return;

    auto* rstd = dev.template workspace<float>(static_cast<std::size_t>(x.rows));
    dev.for_each(static_cast<std::size_t>(x.rows),
                 detail::RmsNormBackwardInput<T>{x, p[0].data, dy, dx, rstd, options_.eps, options_.offset});
    if (!grad[0].empty())
      dev.for_each(column_groups(features_, column_group<Dev>()),
                   detail::RmsNormBackwardWeight<T>{x, dy, rstd, grad[0].data, column_group<Dev>()});
  }

 private:
  template <class T>
  void check_params(UnitParams<T> p) const {
    detail::check_count("nn::RMSNorm", "parameters", p.size(), 1);
    detail::check_shape("nn::RMSNorm", "weight", p[0], features_, 1);
  }

  std::int64_t features_;
  RmsNormOptions options_;
};

}  // namespace dtrain::nn

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_RMS_NORM_FUNCTORS(EACH, SUM, T)        \
  EACH(::dtrain::nn::detail::RmsNormForward<T>)       \
  EACH(::dtrain::nn::detail::RmsNormBackwardInput<T>) \
  EACH(::dtrain::nn::detail::RmsNormBackwardWeight<T>)

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/rms_norm.ipp"
#endif
