// The definitions metric.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/metrics/metric.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL void MetricSums::add(std::string_view name, double sum, double count) {
    if (name.empty()) throw config_error("a metric added a sum with an empty name", "name every metric sum");
    auto& e = sums_[std::string(name)];
    e.first += sum;
    e.second += count;
  }

  DTRAIN_DECL std::vector<std::string> MetricSums::names() const {
    std::vector<std::string> out;
    for (const auto& [n, v] : sums_) out.push_back(n);
    return out;
  }

}  // namespace dtrain

namespace dtrain::metrics {

namespace detail {
DTRAIN_DECL std::vector<std::int64_t> class_ids(const Batch& b, const std::string& target) {
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

DTRAIN_DECL Metric accuracy(std::string target, std::int64_t ignore_index) {
  return [target = std::move(target), ignore_index](const EvalBatch& e, MetricSums& s) {
    const std::vector<std::int64_t> y = detail::class_ids(e.batch, target);
    if (static_cast<std::int64_t>(y.size()) != e.rows)
      throw config_error(
          "metrics::accuracy: " + std::to_string(y.size()) + " targets for " + std::to_string(e.rows) + " output rows",
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

DTRAIN_DECL Metric mean_squared_error(std::string target) {
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

}  // namespace dtrain::metrics

DTRAIN_IMPL_END
