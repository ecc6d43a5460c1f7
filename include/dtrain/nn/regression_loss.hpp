#pragma once
// Regression losses over the last unit's output [rows, D] and float targets
// of the same size (batch tensor "y" by default: [B, D], or [B, T, D] for
// rows = B * T): a robot policy's action chunk, any continuous target.
//   nn::MSELoss   (prediction - target)^2 per element
//   nn::L1Loss    |prediction - target| per element
// Both are means over every element of the step, as PyTorch's default
// reduction: the normaliser counts rows x D elements. An optional per-row
// weight tensor (`weight`, float [rows]) scales each row's terms and counts
// weight x D elements, so weighted micro-batches of any size accumulate
// exactly.

#include <cstddef>
#include <cstdint>
#include <string>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

namespace detail {

// d(loss)/d(prediction) of one element, and the element's loss.
struct Squared {
  DTRAIN_HOST_DEVICE static float loss(float d) { return d * d; }
  DTRAIN_HOST_DEVICE static float grad(float d) { return 2.f * d; }
};
struct Absolute {
  DTRAIN_HOST_DEVICE static float loss(float d) { return d < 0.f ? -d : d; }
  DTRAIN_HOST_DEVICE static float grad(float d) { return d > 0.f ? 1.f : (d < 0.f ? -1.f : 0.f); }
};

template <class Kind, class T>
struct RegressionRowLoss {
  MatView<const T> pred;
  const float* target;
  const float* weight;  // null: every row weighs 1
  // for Host's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(pred.cols); }
  DTRAIN_HOST_DEVICE double operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    double s = 0.0;
    for (std::int64_t c = 0; c < pred.cols; ++c)
      s += Kind::loss(static_cast<float>(pred(r, c)) - target[r * pred.cols + c]);
    return weight ? s * weight[r] : s;
  }
};

template <class Kind, class T>
struct RegressionGrad {
  MatView<const T> pred;
  const float* target;
  const float* weight;
  MatView<T> dpred;
  float scale;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i) / pred.cols;
    const float w = weight ? weight[r] * scale : scale;
    dpred.data[i] = dtype_cast<T>(Kind::grad(static_cast<float>(pred.data[i]) - target[i]) * w);
  }
};

}  // namespace detail

template <class Kind>
class RegressionLoss {
 public:
  // `target`: the float tensor of targets; `weight`: an optional float
  // tensor of per-row weights ("" for none).
  RegressionLoss() = default;
  explicit RegressionLoss(std::string target, std::string weight = "")
      : target_(std::move(target)), weight_(std::move(weight)) {}

  double count(const Batch& batch) const {
    const HostTensor& t = batch.at(target_);
    const std::int64_t width = t.dim(t.shape.size() - 1);
    if (weight_.empty()) return static_cast<double>(t.numel());
    double w = 0;
    for (const float v : batch.at(weight_).values<float>()) w += v;
    return w * static_cast<double>(width);
  }

  template <class Dev, class T>
  double forward(Dev& dev, MatView<const T> pred, const DeviceBatch& batch) {
    const auto [target, weight] = inputs(pred, batch);
    return dev.sum(static_cast<std::size_t>(pred.rows), detail::RegressionRowLoss<Kind, T>{pred, target, weight});
  }

  template <class Dev, class T>
  void backward(Dev& dev, MatView<const T> pred, const DeviceBatch& batch, MatView<T> dpred, float scale) {
    dtrain::nn::detail::check_shape(Kind::name, "prediction gradient", dpred, pred.rows, pred.cols);
    const auto [target, weight] = inputs(pred, batch);
    dev.for_each(static_cast<std::size_t>(pred.size()),
                 detail::RegressionGrad<Kind, T>{pred, target, weight, dpred, scale});
  }

 private:
  template <class T>
  std::pair<const float*, const float*> inputs(MatView<const T> pred, const DeviceBatch& batch) const {
    const DeviceTensor& t = batch.at(target_);
    if (t.numel() != pred.size())
      throw config_error(std::string(Kind::name) + ": " + std::to_string(t.numel()) + " targets " +
                             shape_text(t.shape) + " for a prediction of " + std::to_string(pred.rows) + " x " +
                             std::to_string(pred.cols),
                         "give one target per predicted value: the last unit's out_features is the target's last "
                         "dimension");
    const float* weight = nullptr;
    if (!weight_.empty()) {
      const DeviceTensor& w = batch.at(weight_);
      if (w.numel() != pred.rows)
        throw config_error(std::string(Kind::name) + ": " + std::to_string(w.numel()) + " weights for " +
                               std::to_string(pred.rows) + " rows",
                           "give one weight per row");
      weight = w.data<float>();
    }
    return {t.data<float>(), weight};
  }

  std::string target_ = "y", weight_;
};

struct MseKind : detail::Squared {
  static constexpr const char* name = "nn::MSELoss";
};
struct L1Kind : detail::Absolute {
  static constexpr const char* name = "nn::L1Loss";
};

using MSELoss = RegressionLoss<MseKind>;
using L1Loss = RegressionLoss<L1Kind>;

}  // namespace dtrain::nn
