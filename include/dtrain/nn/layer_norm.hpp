#pragma once
// nn::LayerNorm over the last dimension (the features of each row), as
// PyTorch's nn.LayerNorm(features, eps=1e-5): biased variance, weight
// initialised to ones, bias to zeros. Statistics are computed in fp32 with two
// passes over the row (mean, then the centred sum of squares), which stays
// accurate when the mean is large against the spread.
//
// Rows run one per index of for_each (the row sums in math::lanes partial
// sums, which the host vectorises; on the GPU one thread per row, or with
// DTRAIN_ROW_KERNELS=lanes math::lanes threads per row, the same bits), the
// parameter gradients a group of columns per index (math::column_sums).

#include <cstddef>
#include <cstdint>
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

struct row_moments {
  float mean;
  float rstd;  // 1 / sqrt(var + eps)
};

template <class T, class Row>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE row_moments moments(const T* row, std::int64_t n, float eps, const Row& lanes) {
  const float mean = lanes.sum(n, [&](std::int64_t c) { return static_cast<float>(row[c]); }) / static_cast<float>(n);
  const float sq = lanes.sum(n, [&](std::int64_t c) {
    const float d = static_cast<float>(row[c]) - mean;
    return d * d;
  });
  return {mean, 1.f / math::sqrt(sq / static_cast<float>(n) + eps)};
}

// The row functors below run a row in one thread (operator()) or, on the
// GPU, on a group of threads (row with a LaneGroup): math::SerialRow.
template <class T>
struct LayerNormForward {
  static constexpr unsigned row_lanes = math::lanes;
  MatView<const T> x;
  const T* weight;
  const T* bias;
  MatView<T> y;
  float eps;
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i);
    const row_moments mo = moments(&x(r, 0), x.cols, eps, lanes);
    lanes.each(x.cols, [&](std::int64_t c) {
      const float xhat = (static_cast<float>(x(r, c)) - mo.mean) * mo.rstd;
      y(r, c) = dtype_cast<T>(xhat * static_cast<float>(weight[c]) + static_cast<float>(bias[c]));
    });
  }
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(x.cols); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }
};

// Per row: recomputes the moments (kept in `moments_out` for the parameter
// gradients) and, when dx is wanted,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * weight.
template <class T>
struct LayerNormBackwardInput {
  static constexpr unsigned row_lanes = math::lanes;
  MatView<const T> x;
  const T* weight;
  MatView<const T> dy;
  MatView<T> dx;  // empty: only the moments are wanted
  row_moments* moments_out;
  float eps;
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i);
    const row_moments mo = moments(&x(r, 0), x.cols, eps, lanes);
    if (lanes.leader()) moments_out[r] = mo;
    if (dx.data == nullptr) return;
    const auto g = [&](std::int64_t c) { return static_cast<float>(dy(r, c)) * static_cast<float>(weight[c]); };
    const float mean_g = lanes.sum(x.cols, g) / static_cast<float>(x.cols);
    const float mean_g_xhat = lanes.sum(x.cols, [&](std::int64_t c) {
      return g(c) * (static_cast<float>(x(r, c)) - mo.mean) * mo.rstd;
    }) / static_cast<float>(x.cols);
    lanes.each(x.cols, [&](std::int64_t c) {
      const float g = static_cast<float>(dy(r, c)) * static_cast<float>(weight[c]);
      const float xhat = (static_cast<float>(x(r, c)) - mo.mean) * mo.rstd;
      dx(r, c) = dtype_cast<T>(mo.rstd * (g - mean_g - xhat * mean_g_xhat));
    });
  }
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(x.cols); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }
};

// Per group of columns (math::column_sums): dweight = sum over rows of
// dy * xhat, dbias = sum of dy.
template <class T>
struct LayerNormBackwardParams {
  MatView<const T> x;
  MatView<const T> dy;
  const row_moments* moments;
  T* dweight;
  T* dbias;
  std::int64_t group = 1;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(x.rows * group); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    const std::int64_t c0 = static_cast<std::int64_t>(i) * group, width = math::min_i64(group, x.cols - c0);
    const auto dw = [this](std::int64_t r, std::int64_t c) {
      return static_cast<float>(dy(r, c)) * (static_cast<float>(x(r, c)) - moments[r].mean) * moments[r].rstd;
    };
    const auto db = [this](std::int64_t r, std::int64_t c) { return static_cast<float>(dy(r, c)); };
    const auto put_dw = [this](std::int64_t c, float v) DTRAIN_LAMBDA_INLINE { dweight[c] = dtype_cast<T>(v); };
    const auto put_db = [this](std::int64_t c, float v) DTRAIN_LAMBDA_INLINE { dbias[c] = dtype_cast<T>(v); };
    if (group == math::lanes) {
      if (dweight != nullptr) math::column_sums<math::lanes>(x.rows, c0, width, dw, put_dw);
      if (dbias != nullptr) math::column_sums<math::lanes>(x.rows, c0, width, db, put_db);
    } else {
      if (dweight != nullptr) math::column_sums<1>(x.rows, c0, width, dw, put_dw);
      if (dbias != nullptr) math::column_sums<1>(x.rows, c0, width, db, put_db);
    }
  }
};

}  // namespace detail

struct LayerNormOptions {
  float eps = 1e-5f;
  bool trainable = true;  // false freezes weight and bias
};

class LayerNorm {
 public:
  DTRAIN_DECL explicit LayerNorm(std::int64_t features, LayerNormOptions options = {});

  std::int64_t features() const noexcept { return features_; }

  std::vector<ParamSpec> params() const {
    return {{"weight", {features_}, Init::ones(), options_.trainable, {}, {"norm"}},
            {"bias", {features_}, Init::zeros(), options_.trainable, {}, {"norm", "bias"}}};
  }

  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::LayerNorm", in, features_); }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    check_params(p);
    detail::check_shape("nn::LayerNorm", "input", x, x.rows, features_);
    detail::check_shape("nn::LayerNorm", "output", y, x.rows, features_);
    dev.for_each(static_cast<std::size_t>(x.rows),
                 detail::LayerNormForward<T>{x, p[0].data, p[1].data, y, options_.eps});
  }

  // The per-row moments live in the device workspace between the row pass
  // (input gradient) and the column pass (parameter gradients).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    check_params(p);
    detail::check_count("nn::LayerNorm", "gradients", grad.size(), p.size());
    detail::check_shape("nn::LayerNorm", "input", x, x.rows, features_);
    detail::check_shape("nn::LayerNorm", "output gradient", dy, x.rows, features_);
    if (!dx.empty()) detail::check_shape("nn::LayerNorm", "input gradient", dx, x.rows, features_);
    for (const auto& g : grad)
      if (!g.empty()) detail::check_shape("nn::LayerNorm", "parameter gradient", g, features_, 1);
    const bool param_grads = !grad[0].empty() || !grad[1].empty();
    if (dx.empty() && !param_grads) return;

    auto* mo = dev.template workspace<detail::row_moments>(static_cast<std::size_t>(x.rows));
    dev.for_each(static_cast<std::size_t>(x.rows),
                 detail::LayerNormBackwardInput<T>{x, p[0].data, dy, dx, mo, options_.eps});
    if (param_grads)
      dev.for_each(column_groups(features_, column_group<Dev>()),
                   detail::LayerNormBackwardParams<T>{x, dy, mo, grad[0].data, grad[1].data, column_group<Dev>()});
  }

 private:
  template <class T>
  void check_params(UnitParams<T> p) const {
    detail::check_count("nn::LayerNorm", "parameters", p.size(), 2);
    detail::check_shape("nn::LayerNorm", "weight", p[0], features_, 1);
    detail::check_shape("nn::LayerNorm", "bias", p[1], features_, 1);
  }

  std::int64_t features_;
  LayerNormOptions options_;
};

}  // namespace dtrain::nn

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_LAYER_NORM_FUNCTORS(EACH, SUM, T)        \
  EACH(::dtrain::nn::detail::LayerNormForward<T>)       \
  EACH(::dtrain::nn::detail::LayerNormBackwardInput<T>) \
  EACH(::dtrain::nn::detail::LayerNormBackwardParams<T>)

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/layer_norm.ipp"
#endif
