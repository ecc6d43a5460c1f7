#pragma once
// nn::SoftmaxCrossEntropy: loss = logsumexp(z) - z[target] per row, computed
// from the row maximum so large logits do not overflow; a dtrain::Loss.
// One integer target per row of the logits: class ids [B] of a classifier,
// or token ids [B, T] of a language model (rows = B * T). Rows whose target
// is `ignore_index` (padding, prompt tokens) add nothing to the loss, its
// gradient or the normaliser: the loss is the mean over the targets that
// count, over every micro-batch and rank of a step, however unevenly they
// are spread (what accumulating per-micro-batch means gets wrong).
//   count:    the targets that are not ignore_index (host)
//   forward:  the SUM of the per-row losses (double)
//   backward: dlogits = (softmax(z) - onehot(target)) * scale, 0 for ignored rows
//
// Targets are int32 or int64 (batch tensor `target`, "y" by default). A
// target outside [0, classes) that is not ignore_index is a config_error
// naming the row, checked on the host copy before any kernel runs.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
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

template <class T, class Row>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE softmax_row softmax_stats(const T* z, std::int64_t n, const Row& lanes) {
  const float mx = lanes.max(n, static_cast<float>(z[0]), [&](std::int64_t c) { return static_cast<float>(z[c]); });
  const float s = lanes.sum(n, [&](std::int64_t c) { return math::exp(static_cast<float>(z[c]) - mx); });
  return {mx, s};
}

// Row functors (math::SerialRow): a row in one thread, or on the GPU on a
// group of threads.
template <class T, class Label>
struct CrossEntropyRowLoss {
  static constexpr unsigned row_lanes = math::lanes;
  MatView<const T> logits;
  const Label* labels;
  Label ignore;
  // for Host's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(logits.cols); }
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE double row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i);
    const Label label = labels[r];
    if (label == ignore) return 0.0;
    const softmax_row s = softmax_stats(&logits(r, 0), logits.cols, lanes);
    return static_cast<double>(s.max + math::log(s.sum_exp) - static_cast<float>(logits(r, label)));
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE double operator()(std::size_t i) const { return row(i, math::SerialRow{}); }
};

// dlogits row r = (softmax(z_r) - onehot(label)) * w, or 0 when the label
// is `ignore`.
template <class T, class Label, class Row>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void cross_entropy_grad_row(MatView<const T> logits, std::int64_t r,
                                                                    Label label, Label ignore, float w,
                                                                    MatView<T> dlogits, const Row& lanes) {
  if (label == ignore) {
    lanes.each(logits.cols, [&](std::int64_t c) { dlogits(r, c) = dtype_cast<T>(0.f); });
    return;
  }
  const softmax_row s = softmax_stats(&logits(r, 0), logits.cols, lanes);
  lanes.each(logits.cols, [&](std::int64_t c) {
    const float p = math::exp(static_cast<float>(logits(r, c)) - s.max) / s.sum_exp;
    dlogits(r, c) = dtype_cast<T>((p - (c == label ? 1.f : 0.f)) * w);
  });
}

template <class T, class Label>
struct CrossEntropyRowGrad {
  static constexpr unsigned row_lanes = math::lanes;
  MatView<const T> logits;
  const Label* labels;
  Label ignore;
  MatView<T> dlogits;
  float scale;
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i);
    cross_entropy_grad_row(logits, r, labels[r], ignore, scale, dlogits, lanes);
  }
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(logits.cols); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }
};

}  // namespace detail

class SoftmaxCrossEntropy {
 public:
  static constexpr std::int64_t default_ignore_index = -100;  // PyTorch's

  SoftmaxCrossEntropy() = default;
  explicit SoftmaxCrossEntropy(std::int64_t ignore_index, std::string target = "y")
      : ignore_(ignore_index), target_(std::move(target)) {}

  std::int64_t ignore_index() const { return ignore_; }

  double count(const Batch& batch) const {
    const HostTensor& t = batch.at(target_);
    return dispatch(t.type, [&]<class Label>() {
      double n = 0;
      for (const Label l : t.values<Label>()) n += static_cast<std::int64_t>(l) == ignore_ ? 0 : 1;
      return n;
    });
  }

  template <class Dev, class T>
  double forward(Dev& dev, MatView<const T> logits, const DeviceBatch& batch) {
    const DeviceTensor& t = targets(logits, batch);
    return dispatch(t.type, [&]<class Label>() {
      check_range<Label>(t, logits.cols);
      return dev.sum(static_cast<std::size_t>(logits.rows),
                     detail::CrossEntropyRowLoss<T, Label>{logits, t.data<Label>(), static_cast<Label>(ignore_)});
    });
  }

  template <class Dev, class T>
  void backward(Dev& dev, MatView<const T> logits, const DeviceBatch& batch, MatView<T> dlogits, float scale) {
    const DeviceTensor& t = targets(logits, batch);
    dtrain::nn::detail::check_shape("nn::SoftmaxCrossEntropy", "logits gradient", dlogits, logits.rows, logits.cols);
    dispatch(t.type, [&]<class Label>() {
      check_range<Label>(t, logits.cols);
      dev.for_each(
          static_cast<std::size_t>(logits.rows),
          detail::CrossEntropyRowGrad<T, Label>{logits, t.data<Label>(), static_cast<Label>(ignore_), dlogits, scale});
      return 0.0;
    });
  }

 private:
  template <class F>
  double dispatch(element_type type, F&& f) const {
    if (type == element_type::i32) return f.template operator()<std::int32_t>();
    if (type == element_type::i64) return f.template operator()<std::int64_t>();
    throw config_error("nn::SoftmaxCrossEntropy: targets '" + target_ + "' hold " + std::string(element_name(type)),
                       "give class or token ids as int32 or int64");
  }

  template <class T>
  const DeviceTensor& targets(MatView<const T> logits, const DeviceBatch& batch) const {
    if (logits.cols < 1)
      throw config_error("nn::SoftmaxCrossEntropy: logits have no classes (0 columns)",
                         "make the last unit's out_features the number of classes");
    const DeviceTensor& t = batch.at(target_);
    if (t.numel() != logits.rows)
      throw config_error("nn::SoftmaxCrossEntropy: " + std::to_string(t.numel()) + " targets " + shape_text(t.shape) +
                             " for " + std::to_string(logits.rows) + " rows of logits",
                         "give one class or token id per row: [B] for a classifier, [B, T] for a sequence model");
    return t;
  }

  // Host check, so a bad label never reaches a kernel.
  template <class Label>
  void check_range(const DeviceTensor& t, std::int64_t classes) const {
    const Label* labels = t.host_data<Label>();
    for (std::int64_t r = 0; r < t.numel(); ++r) {
      const auto l = static_cast<std::int64_t>(labels[r]);
      if (l != ignore_ && (l < 0 || l >= classes))
        throw config_error("nn::SoftmaxCrossEntropy: label " + std::to_string(l) + " at row " + std::to_string(r) +
                               " is outside [0, " + std::to_string(classes) + ")",
                           "labels are class indices (or ignore_index " + std::to_string(ignore_) +
                               "): check the dataset's labels and that the last unit's out_features equals the "
                               "number of classes");
    }
  }

  std::int64_t ignore_ = default_ignore_index;
  std::string target_ = "y";
};

}  // namespace dtrain::nn

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_CROSS_ENTROPY_FUNCTORS(EACH, SUM, T)                \
  SUM(::dtrain::nn::detail::CrossEntropyRowLoss<T, std::int32_t>)  \
  SUM(::dtrain::nn::detail::CrossEntropyRowLoss<T, std::int64_t>)  \
  EACH(::dtrain::nn::detail::CrossEntropyRowGrad<T, std::int32_t>) \
  EACH(::dtrain::nn::detail::CrossEntropyRowGrad<T, std::int64_t>)
