#pragma once
// Evaluation and prediction: forwards only (no gradient, no update), summed
// over every rank. Sharded strategies gather parameters in every forward, so
// every rank runs as many forwards as the rank with the most batches, the
// others on empty batches (0 rows, shaped like a real one) that count
// nothing; the ranks agree on that number and on the shape through typed
// messages (World::all_gather).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/wire.hpp"
#include "dtrain/metrics/metric.hpp"
#include "dtrain/train/pipeline.hpp"
#include "dtrain/train/rank_sums.hpp"

namespace dtrain {

namespace detail {

// One tensor of a batch without its values: what an empty batch copies.
struct TensorShape {
  std::string name;
  element_type type = element_type::f32;
  std::vector<std::int64_t> shape;
  static constexpr auto wire_fields() {
    return std::tuple{field("name", &TensorShape::name), field("type", &TensorShape::type),
                      field("shape", &TensorShape::shape)};
  }
};

// A rank's evaluation: how many batches, and the tensors of its first.
struct EvalPlan {
  std::uint64_t batches = 0;
  std::vector<TensorShape> tensors;
  static constexpr auto wire_fields() {
    return std::tuple{field("batches", &EvalPlan::batches), field("tensors", &EvalPlan::tensors)};
  }
};

}  // namespace detail

template <Model M, class Dev, class T>
class Evaluator {
 public:
  Evaluator(World& world, UnitPipeline<M, Dev, T>& pipeline, RankSums<Dev>& sums, M& model)
      : world_(world), pipeline_(pipeline), sums_(sums), model_(model) {}

  // The mean loss over every rank's batches and each metric's value
  // (Trainer::evaluate). Collective: every rank calls it, with its own
  // batches (possibly none).
  EvalResult evaluate(std::span<const Batch> batches, std::span<const Metric> metrics, std::int64_t step) {
    for (const Batch& b : padding(batches)) pipeline_.forward(b, step, nullptr, [](double) { return 0.f; });
    double sum = 0, count = 0;
    MetricSums sums;
    for (const Batch& b : batches) {
      const double c = model_.loss.count(b);
      double batch_loss = 0;
      std::vector<float> outputs;
      pipeline_.forward(b, step, metrics.empty() ? nullptr : &outputs, [&](double loss) { return batch_loss = loss, 0.f; });
      sum += batch_loss;
      count += c;
      if (metrics.empty()) continue;
      const std::int64_t width = pipeline_.output_width();
      const EvalBatch eb{b, outputs, width > 0 ? static_cast<std::int64_t>(outputs.size()) / width : 0, width,
                         batch_loss, c};
      for (const Metric& m : metrics) m(eb, sums);
    }
    // The metrics' names over all ranks (a rank without batches has none),
    // then every sum and count in one all-reduce.
    std::vector<std::string> names;
    if (!metrics.empty()) {
      for (const std::vector<std::string>& theirs : world_.all_gather("eval-metric-names", sums.names()))
        for (const std::string& n : theirs)
          if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
      std::sort(names.begin(), names.end());
    }
    std::vector<double> values{sum, count};
    for (const std::string& n : names) {
      const auto [s_, c_] = sums.get(n);
      values.push_back(s_);
      values.push_back(c_);
    }
    values = sums_.sum(std::move(values));
    if (values[1] <= 0)
      throw config_error("Trainer::evaluate: the batches count no targets on any rank",
                         "evaluate on batches with targets");
    EvalResult r;
    r.loss = values[0] / values[1];
    r.count = values[1];
    for (std::size_t i = 0; i < names.size(); ++i) {
      const double c = values[3 + 2 * i];
      r.metrics[names[i]] = c > 0 ? values[2 + 2 * i] / c : std::numeric_limits<double>::quiet_NaN();
    }
    return r;
  }

  // The model's output for one batch (Trainer::predict). Collective.
  std::vector<float> predict(const Batch& batch, std::int64_t step) {
    std::vector<float> out;
    pipeline_.forward(batch, step, &out, nullptr);
    return out;
  }

 private:
  // The empty batches this rank adds so that every rank runs the same
  // number of forwards: 0 rows of its own first batch, or of the first rank
  // with batches.
  std::vector<Batch> padding(std::span<const Batch> batches) {
    detail::EvalPlan mine{batches.size(), {}};
    if (!batches.empty())
      for (const auto& [name, t] : batches[0].tensors) mine.tensors.push_back({name, t.type, t.shape});
    const std::vector<detail::EvalPlan> all = world_.all_gather("eval-batches", mine);
    std::uint64_t most = 0;
    const detail::EvalPlan* model = nullptr;
    for (const detail::EvalPlan& p : all) {
      most = std::max(most, p.batches);
      if (model == nullptr && p.batches > 0) model = &p;
    }
    if (most == batches.size()) return {};
    Batch empty;
    for (const detail::TensorShape& t : (batches.empty() ? *model : mine).tensors) {
      std::vector<std::int64_t> dims = t.shape;
      if (!dims.empty()) dims[0] = 0;
      empty.set(t.name, HostTensor{t.type, std::move(dims), {}});
    }
    return std::vector<Batch>(static_cast<std::size_t>(most - batches.size()), empty);
  }

  World& world_;
  UnitPipeline<M, Dev, T>& pipeline_;
  RankSums<Dev>& sums_;
  M& model_;
};

}  // namespace dtrain
