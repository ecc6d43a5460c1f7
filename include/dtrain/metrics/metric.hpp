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
#include "dtrain/core/macros.hpp"
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
  DTRAIN_DECL void add(std::string_view name, double sum, double count = 1);
  std::pair<double, double> get(const std::string& name) const {
    const auto it = sums_.find(name);
    return it == sums_.end() ? std::pair{0.0, 0.0} : it->second;
  }
  DTRAIN_DECL std::vector<std::string> names() const;

 private:
  std::map<std::string, std::pair<double, double>> sums_;
};

using Metric = std::function<void(const EvalBatch&, MetricSums&)>;

struct EvalResult {
  double loss = 0;                        // mean over every counted target on every rank
  double count = 0;                       // what the loss counted, all ranks
  std::map<std::string, double> metrics;  // each metric's sum / count over all ranks
  // exp(loss): the perplexity of a language model's mean token loss.
  double perplexity() const { return std::exp(loss); }
};

namespace metrics {

namespace detail {
// Integer class ids of `target` as int64, or an error naming the fix.
DTRAIN_DECL std::vector<std::int64_t> class_ids(const Batch& b, const std::string& target);
}  // namespace detail

// The share of rows whose largest output is the target class; targets equal
// to ignore_index (padding) are not counted. For a language model, per token.
DTRAIN_DECL Metric accuracy(std::string target = "y", std::int64_t ignore_index = -100);

// Mean of (output - target)^2 over every element, for regression outputs.
DTRAIN_DECL Metric mean_squared_error(std::string target = "y");

}  // namespace metrics
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/metrics/metric.ipp"
#endif
