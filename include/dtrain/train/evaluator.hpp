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
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/wire.hpp"
#include "dtrain/metrics/metric.hpp"
#include "dtrain/nn/sequence_logps.hpp"
#include "dtrain/train/pipeline.hpp"
#include "dtrain/train/rank_sums.hpp"

namespace dtrain {

// Trainer::sequence_logps: which targets score the sequences, and whether
// the model runs with its LoRA adapters (false: the base model, the
// reference of a preference loss without a second copy).
struct SequenceLogpsOptions {
  bool adapters = true;
  std::string target = "y";
  std::int64_t ignore_index = -100;
};

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

// The empty batches this rank adds so that every rank runs the same number
// of forwards: 0 rows of its own first batch, or of the first rank with
// batches. Collective.
DTRAIN_DECL std::vector<Batch> eval_padding(World& world, std::span<const Batch> batches);

// The metrics' names over all ranks (a rank without batches has none),
// sorted. Collective.
DTRAIN_DECL std::vector<std::string> all_metric_names(World& world, const MetricSums& sums);

// What evaluate all-reduces: the loss's sum and count, then each named
// metric's sum and count; and the EvalResult the reduced values give.
DTRAIN_DECL std::vector<double> eval_values(double sum, double count, const MetricSums& sums,
                                            const std::vector<std::string>& names);
DTRAIN_DECL EvalResult eval_result(const std::vector<double>& values, const std::vector<std::string>& names);

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
    for (const Batch& b : detail::eval_padding(world_, batches))
      pipeline_.forward(b, step, nullptr, [](double) { return 0.f; });
    double sum = 0, count = 0;
    MetricSums sums;
    for (const Batch& b : batches) {
      const double c = model_.loss.count(b);
      double batch_loss = 0;
      std::vector<float> outputs;
      pipeline_.forward(b, step, metrics.empty() ? nullptr : &outputs,
                        [&](double loss) { return batch_loss = loss, 0.f; });
      sum += batch_loss;
      count += c;
      if (metrics.empty()) continue;
      const std::int64_t width = pipeline_.output_width();
      const EvalBatch eb{b,     outputs,    width > 0 ? static_cast<std::int64_t>(outputs.size()) / width : 0,
                         width, batch_loss, c};
      for (const Metric& m : metrics) m(eb, sums);
    }
    // Every sum and count in one all-reduce.
    const std::vector<std::string> names =
        metrics.empty() ? std::vector<std::string>{} : detail::all_metric_names(world_, sums);
    return detail::eval_result(sums_.sum(detail::eval_values(sum, count, sums, names)), names);
  }

  // Each sequence's summed log-probability of its targets
  // (Trainer::sequence_logps). Collective.
  nn::SequenceLogps sequence_logps(const Batch& batch, std::int64_t step, const SequenceLogpsOptions& o) {
    nn::SequenceLogps out;
    pipeline_.forward_output(
        batch, step, {.adapters = o.adapters}, [&](Dev& dev, MatView<const T> logits, const DeviceBatch& on_device) {
          out = nn::sequence_logps(dev, logits, on_device.at(o.target), o.ignore_index, "Trainer::sequence_logps");
        });
    return out;
  }

  // The output rows `rows` of one batch, [rows.size(), width] as fp32
  // (Trainer::decode). Collective.
  std::vector<float> decode(const Batch& batch, std::int64_t step, std::span<const std::int64_t> rows,
                            DecodeOptions mode) {
    std::vector<float> out;
    pipeline_.forward_output(batch, step, mode, [&](Dev& dev, MatView<const T> logits, const DeviceBatch&) {
      const auto width = static_cast<std::size_t>(logits.cols);
      std::vector<T> row(width);
      out.resize(rows.size() * width);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] < 0 || rows[i] >= logits.rows)
          throw config_error("Trainer::decode: row " + std::to_string(rows[i]) + " of a batch of " +
                                 std::to_string(logits.rows) + " rows",
                             "give rows of the batch (sequence b's position t: b * T + t)");
        dev.copy_to_host(row.data(), logits.data + rows[i] * logits.cols, width);
        for (std::size_t c = 0; c < width; ++c) out[i * width + c] = static_cast<float>(row[c]);
      }
    });
    return out;
  }

  void release_kv_cache() { pipeline_.release_kv_cache(); }

  // The model's output for one batch (Trainer::predict). Collective.
  std::vector<float> predict(const Batch& batch, std::int64_t step) {
    std::vector<float> out;
    pipeline_.forward(batch, step, &out, nullptr);
    return out;
  }

 private:
  World& world_;
  UnitPipeline<M, Dev, T>& pipeline_;
  RankSums<Dev>& sums_;
  M& model_;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/train/evaluator.ipp"
#endif
