#pragma once
// nn::SoftmaxCrossEntropy: loss = logsumexp(z) - z[label] per row, computed
// from the row maximum so large logits do not overflow; a dtrain::Loss.
//   forward:  the SUM of the per-row losses (double; the caller normalises)
//   backward: dlogits = (softmax(z) - onehot(label)) * scale
//
// Labels are int32 class indices on the device. A label outside
// [0, classes) never leads to an out-of-bounds access:
//   Host: forward and backward throw config_error naming the row and label.
//   Cuda: the kernels treat the row as invalid (forward gives NaN for it,
//         backward writes NaN gradients for it); forward then copies the
//         labels back and throws the same config_error. The scan only runs
//         when the loss is not finite, so valid batches pay nothing for it.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

namespace detail {

struct softmax_row {
  float max;
  float sum_exp;  // sum of exp(z - max)
};

template <class T>
DTRAIN_HOST_DEVICE softmax_row softmax_stats(const T* z, std::int64_t n) {
  float mx = static_cast<float>(z[0]);
  for (std::int64_t c = 1; c < n; ++c) mx = math::max(mx, static_cast<float>(z[c]));
  float s = 0.f;
  for (std::int64_t c = 0; c < n; ++c) s += math::exp(static_cast<float>(z[c]) - mx);
  return {mx, s};
}

DTRAIN_HOST_DEVICE inline bool label_ok(std::int32_t label, std::int64_t classes) {
  return label >= 0 && label < classes;
}

template <class T>
struct CrossEntropyRowLoss {
  MatView<const T> logits;
  const std::int32_t* labels;
  DTRAIN_HOST_DEVICE double operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    const std::int32_t label = labels[r];
    if (!label_ok(label, logits.cols)) return math::quiet_nan();
    const softmax_row s = softmax_stats(&logits(r, 0), logits.cols);
    return static_cast<double>(s.max + math::log(s.sum_exp) - static_cast<float>(logits(r, label)));
  }
};

template <class T>
struct CrossEntropyRowGrad {
  MatView<const T> logits;
  const std::int32_t* labels;
  MatView<T> dlogits;
  float scale;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    const std::int32_t label = labels[r];
    const bool ok = label_ok(label, logits.cols);
    const softmax_row s = softmax_stats(&logits(r, 0), logits.cols);
    for (std::int64_t c = 0; c < logits.cols; ++c) {
      const float p = math::exp(static_cast<float>(logits(r, c)) - s.max) / s.sum_exp;
      const float g = ok ? (p - (c == label ? 1.f : 0.f)) * scale : math::quiet_nan();
      dlogits(r, c) = dtype_cast<T>(g);
    }
  }
};

// Host-side label validation; `labels` must be host memory.
inline void check_labels(std::span<const std::int32_t> labels, std::int64_t classes) {
  for (std::size_t r = 0; r < labels.size(); ++r)
    if (!label_ok(labels[r], classes))
      throw config_error("nn::SoftmaxCrossEntropy: label " + std::to_string(labels[r]) + " at row " +
                             std::to_string(r) + " is outside [0, " + std::to_string(classes) + ")",
                         "labels are class indices: check the dataset's labels and that the last unit's "
                         "out_features equals the number of classes");
}

// Throws for the first out-of-range label, copying GPU labels back first.
template <class Dev>
void check_device_labels(Dev& dev, std::span<const std::int32_t> labels, std::int64_t classes) {
  if constexpr (Dev::host_accessible) {
    check_labels(labels, classes);
  } else {
    std::vector<std::int32_t> host(labels.size());
    dev.copy_to_host(host.data(), labels.data(), labels.size());
    check_labels(host, classes);
  }
}

}  // namespace detail

class SoftmaxCrossEntropy {
 public:
  template <class Dev, class T>
  double forward(Dev& dev, MatView<const T> logits, std::span<const std::int32_t> labels) {
    check(logits, labels);
    if constexpr (Dev::host_accessible) detail::check_device_labels(dev, labels, logits.cols);
    const double loss =
        dev.sum(static_cast<std::size_t>(logits.rows), detail::CrossEntropyRowLoss<T>{logits, labels.data()});
    if constexpr (!Dev::host_accessible)
      if (!std::isfinite(loss)) detail::check_device_labels(dev, labels, logits.cols);
    return loss;
  }

  template <class Dev, class T>
  void backward(Dev& dev, MatView<const T> logits, std::span<const std::int32_t> labels, MatView<T> dlogits,
                float scale) {
    check(logits, labels);
    detail::check_shape("nn::SoftmaxCrossEntropy", "logits gradient", dlogits, logits.rows, logits.cols);
    if constexpr (Dev::host_accessible) detail::check_device_labels(dev, labels, logits.cols);
    dev.for_each(static_cast<std::size_t>(logits.rows),
                 detail::CrossEntropyRowGrad<T>{logits, labels.data(), dlogits, scale});
  }

 private:
  template <class T>
  static void check(MatView<const T> logits, std::span<const std::int32_t> labels) {
    if (logits.cols < 1)
      throw config_error("nn::SoftmaxCrossEntropy: logits have no classes (0 columns)",
                         "make the last unit's out_features the number of classes");
    detail::check_count("nn::SoftmaxCrossEntropy", "labels", labels.size(), static_cast<std::size_t>(logits.rows));
  }
};

}  // namespace dtrain::nn
