// The definitions evaluator.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/train/evaluator.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::detail {
  DTRAIN_DECL std::vector<Batch> eval_padding(World & world, std::span<const Batch> batches) {
    EvalPlan mine{batches.size(), {}};
    if (!batches.empty())
      for (const auto& [name, t] : batches[0].tensors) mine.tensors.push_back({name, t.type, t.shape});
    const std::vector<EvalPlan> all = world.all_gather("eval-batches", mine);
    std::uint64_t most = 0;
    const EvalPlan* model = nullptr;
    for (const EvalPlan& p : all) {
      most = std::max(most, p.batches);
      if (model == nullptr && p.batches > 0) model = &p;
    }
    if (most == batches.size()) return {};
    Batch empty;
    for (const TensorShape& t : (batches.empty() ? *model : mine).tensors) {
      std::vector<std::int64_t> dims = t.shape;
      if (!dims.empty()) dims[0] = 0;
      empty.set(t.name, HostTensor{t.type, std::move(dims), {}});
    }
    return std::vector<Batch>(static_cast<std::size_t>(most - batches.size()), empty);
  }

  DTRAIN_DECL std::vector<std::string> all_metric_names(World & world, const MetricSums& sums) {
    std::vector<std::string> names;
    for (const std::vector<std::string>& theirs : world.all_gather("eval-metric-names", sums.names()))
      for (const std::string& n : theirs)
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    std::sort(names.begin(), names.end());
    return names;
  }

  DTRAIN_DECL std::vector<double> eval_values(double sum, double count, const MetricSums& sums,
                                              const std::vector<std::string>& names) {
    std::vector<double> values{sum, count};
    for (const std::string& n : names) {
      const auto [s, c] = sums.get(n);
      values.push_back(s);
      values.push_back(c);
    }
    return values;
  }

  DTRAIN_DECL EvalResult eval_result(const std::vector<double>& values, const std::vector<std::string>& names) {
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

}  // namespace dtrain::detail

DTRAIN_IMPL_END
