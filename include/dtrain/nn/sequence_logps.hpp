#pragma once
// nn::sequence_logps: each sequence's log-probability of its targets under
// a language model's logits, summed over the sequence's target tokens:
//   logp_s = sum over rows r of s with y_r != ignore_index of log softmax(z_r)[y_r]
// What a preference loss compares (nn::PreferenceLoss) and what
// Trainer::sequence_logps returns for a reference model. The per-row values
// come from the device (CrossEntropyRowLoss's arithmetic); the sums are
// taken in double on the host, 2 numbers per sequence.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/nn/cross_entropy.hpp"

namespace dtrain::nn {

struct SequenceLogps {
  std::vector<double> logp;      // per sequence: its targets' summed log-probability
  std::vector<double> tokens;    // per sequence: its targets (rows not ignore_index)
  std::vector<double> row_logp;  // per row: its target's log-probability (0 where ignored)
};

namespace detail {

// out[r] = -log softmax(z_r)[y_r], 0 where y_r is ignored: the per-row
// cross-entropy (CrossEntropyRowLoss's), for the host to sum per sequence.
template <class T, class Label>
struct CrossEntropyRowValues {
  static constexpr unsigned row_lanes = math::lanes;
  CrossEntropyRowLoss<T, Label> loss;
  float* out;
  std::size_t work_per_index() const { return loss.work_per_index(); }
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto v = static_cast<float>(loss.row(i, lanes));
    if (lanes.leader()) out[i] = v;
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }
};

// f.template operator()<Label>() for targets of int32 or int64 ids.
template <class F>
decltype(auto) with_label_type(const DeviceTensor& y, const std::string& what, F&& f) {
  if (y.type == element_type::i32) return f.template operator()<std::int32_t>();
  if (y.type == element_type::i64) return f.template operator()<std::int64_t>();
  throw config_error(what + ": targets hold " + std::string(element_name(y.type)), "give token ids as int32 or int64");
}

}  // namespace detail

// Targets y [S, T] (int32 or int64, ignore_index off the scored tokens)
// over logits [S * T, V]; `what` names the caller in errors. A target
// outside [0, V) is a config_error naming its row, checked on the host.
template <class Dev, class T>
SequenceLogps sequence_logps(Dev& dev, MatView<const T> logits, const DeviceTensor& y, std::int64_t ignore_index,
                             const std::string& what) {
  if (y.shape.size() != 2 || y.numel() != logits.rows || logits.cols < 1)
    throw config_error(
        what + ": targets " + shape_text(y.shape) + " for " + std::to_string(logits.rows) + " rows of logits",
        "give one token id per row of the logits: [S, T] for S sequences of T tokens");
  const std::int64_t seqs = y.shape[0], time = y.shape[1];
  SequenceLogps out{std::vector<double>(static_cast<std::size_t>(seqs), 0.0),
                    std::vector<double>(static_cast<std::size_t>(seqs), 0.0),
                    std::vector<double>(static_cast<std::size_t>(logits.rows), 0.0)};
  if (logits.rows == 0) return out;
  std::vector<float> ce(static_cast<std::size_t>(logits.rows));
  float* ce_dev = dev.template workspace<float>(ce.size());
  detail::with_label_type(y, what, [&]<class Label>() {
    const Label* host = y.host_data<Label>();
    for (std::int64_t r = 0; r < logits.rows; ++r) {
      const auto l = static_cast<std::int64_t>(host[r]);
      if (l == ignore_index) continue;
      if (l < 0 || l >= logits.cols)
        throw config_error(what + ": token " + std::to_string(l) + " at row " + std::to_string(r) + " is outside [0, " +
                               std::to_string(logits.cols) + ")",
                           "targets are token ids below the vocabulary size, or " + std::to_string(ignore_index) +
                               " off the scored tokens");
      out.tokens[static_cast<std::size_t>(r / time)] += 1;
    }
    dev.for_each(
        static_cast<std::size_t>(logits.rows),
        detail::CrossEntropyRowValues<T, Label>{{logits, y.data<Label>(), static_cast<Label>(ignore_index)}, ce_dev});
  });
  dev.copy_to_host(ce.data(), ce_dev, ce.size());
  for (std::int64_t r = 0; r < logits.rows; ++r) {
    out.row_logp[static_cast<std::size_t>(r)] = -static_cast<double>(ce[static_cast<std::size_t>(r)]);
    out.logp[static_cast<std::size_t>(r / time)] += out.row_logp[static_cast<std::size_t>(r)];
  }
  return out;
}

}  // namespace dtrain::nn
