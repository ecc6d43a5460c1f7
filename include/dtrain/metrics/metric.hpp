#pragma once
// What Trainer::evaluate gives metrics and returns. A metric is any
// callable (const EvalBatch&, MetricSums&): it sees each batch with the
// model's output and adds named sums and counts; evaluate sums those over
// every rank, so a metric written for one process is right at any world
// size.
//
//   auto r = trainer.evaluate(batches, std::vector<dtrain::Metric>{dtrain::metrics::accuracy()});
//   r.loss, r.perplexity(), r.metrics.at("accuracy")

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/tensor.hpp"

namespace dtrain {

// One evaluated batch: the host batch (its targets), the model's output for
// it ([rows, width] row-major fp32: logits, or predictions for a regression
// loss), and its summed loss with what the loss counts.
struct EvalBatch {
  const Batch& batch;
  std::span<const float> outputs;
  std::int64_t rows = 0;
  std::int64_t width = 0;
  double loss = 0;   // summed over the batch's counted targets
  double count = 0;  // the loss's count (samples, or targets not ignored)

  std::span<const float> row(std::int64_t r) const {
    return outputs.subspan(static_cast<std::size_t>(r * width), static_cast<std::size_t>(width));
  }
};

// Named (sum, count) pairs; a metric's value is sum / count over all ranks.
class MetricSums {
 public:
  void add(std::string_view name, double sum, double count = 1) {
    if (name.empty())
      throw config_error("a metric added a sum with an empty name", "name every metric sum");
    auto& e = sums_[std::string(name)];
    e.first += sum;
    e.second += count;
  }
  std::pair<double, double> get(const std::string& name) const {
    const auto it = sums_.find(name);
    return it == sums_.end() ? std::pair{0.0, 0.0} : it->second;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, v] : sums_) out.push_back(n);
    return out;
  }

 private:
  std::map<std::string, std::pair<double, double>> sums_;
};

using Metric = std::function<void(const EvalBatch&, MetricSums&)>;

struct EvalResult {
  double loss = 0;   // mean over every counted target on every rank
  double count = 0;  // what the loss counted, all ranks
  std::map<std::string, double> metrics;  // each metric's sum / count over all ranks
  // exp(loss): the perplexity of a language model's mean token loss.
  double perplexity() const { return std::exp(loss); }
};

namespace metrics {

namespace detail {
// Integer class ids of `target` as int64, or an error naming the fix.
inline std::vector<std::int64_t> class_ids(const Batch& b, const std::string& target) {
  const HostTensor& y = b.at(target);
  std::vector<std::int64_t> out;
  if (y.type == element_type::i32)
    for (auto v : y.values<std::int32_t>()) out.push_back(v);
  else if (y.type == element_type::i64)
    for (auto v : y.values<std::int64_t>()) out.push_back(v);
  else
    throw config_error("metrics::accuracy: the batch's '" + target + "' is not integer class ids",
                       "use accuracy with a classification loss (targets int32/int64), mean_squared_error otherwise");
  return out;
}
}  // namespace detail

// The share of rows whose largest output is the target class; targets equal
// to ignore_index (padding) are not counted. For a language model, per token.
inline Metric accuracy(std::string target = "y", std::int64_t ignore_index = -100) {
  return [target = std::move(target), ignore_index](const EvalBatch& e, MetricSums& s) {
    const std::vector<std::int64_t> y = detail::class_ids(e.batch, target);
    if (static_cast<std::int64_t>(y.size()) != e.rows)
      throw config_error("metrics::accuracy: " + std::to_string(y.size()) + " targets for " + std::to_string(e.rows) +
                             " output rows",
                         "give one class id per output row");
    double correct = 0, counted = 0;
    for (std::int64_t r = 0; r < e.rows; ++r) {
      if (y[static_cast<std::size_t>(r)] == ignore_index) continue;
      const auto row = e.row(r);
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < e.width; ++c)
        if (row[static_cast<std::size_t>(c)] > row[static_cast<std::size_t>(best)]) best = c;
      correct += best == y[static_cast<std::size_t>(r)] ? 1 : 0;
      counted += 1;
    }
    s.add("accuracy", correct, counted);
  };
}

// Mean of (output - target)^2 over every element, for regression outputs.
inline Metric mean_squared_error(std::string target = "y") {
  return [target = std::move(target)](const EvalBatch& e, MetricSums& s) {
    const HostTensor& y = e.batch.at(target);
    if (y.type != element_type::f32 || static_cast<std::size_t>(y.numel()) != e.outputs.size())
      throw config_error("metrics::mean_squared_error: the batch's '" + target + "' is not " +
                             std::to_string(e.outputs.size()) + " float32 values",
                         "give float targets shaped like the model's output");
    const auto v = y.values<float>();
    double sum = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double d = static_cast<double>(e.outputs[i]) - v[i];
      sum += d * d;
    }
    s.add("mse", sum, static_cast<double>(v.size()));
  };
}

}  // namespace metrics
}  // namespace dtrain
