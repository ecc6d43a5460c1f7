// The definitions fit_evaluation.hpp declares with DTRAIN_DECL: included at
// the end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they
// are compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/run/fit_evaluation.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::vector<std::vector<std::int64_t>> eval_rows(std::int64_t rows, int rank, int world_size,
                                                               std::int64_t batch_size, std::int64_t max_batches) {
    std::vector<std::vector<std::int64_t>> batches;
    std::vector<std::int64_t> idx;
    for (std::int64_t r = rank; r < rows; r += world_size) {
      idx.push_back(r);
      if (static_cast<std::int64_t>(idx.size()) == batch_size) {
        batches.push_back(std::move(idx));
        idx.clear();
        if (max_batches > 0 && static_cast<std::int64_t>(batches.size()) == max_batches) return batches;
      }
    }
    if (!idx.empty()) batches.push_back(std::move(idx));
    return batches;
  }

  DTRAIN_DECL EarlyStop::EarlyStop(const FitOptions& o)
      : monitor_(o.monitor), maximize_(o.maximize), patience_(o.patience), min_delta_(o.min_delta) {}

  DTRAIN_DECL bool EarlyStop::stops_after(const EvalResult& r) {
    if (patience_ == 0) return false;
    double value = r.loss;
    if (monitor_ != "loss") {
      const auto it = r.metrics.find(monitor_);
      if (it == r.metrics.end())
        throw config_error("FitOptions.monitor = '" + monitor_ + "' is not among the evaluation's values",
                           "monitor \"loss\" or the name a metric adds (e.g. \"accuracy\")");
      value = it->second;
    }
    const bool better = !best_ || (maximize_ ? value > *best_ + min_delta_ : value < *best_ - min_delta_);
    if (better) {
      best_ = value;
      bad_evals_ = 0;
      return false;
    }
    return ++bad_evals_ >= patience_;
  }

  DTRAIN_DECL EvalDriver::EvalDriver(const FitOptions& o, const FitCallbacks& cb, FitReporter& report,
                                     FitResult& result, FitControl& control)
      : o_(o), cb_(cb), report_(report), result_(result), control_(control), early_stop_(o) {}

  DTRAIN_DECL void EvalDriver::record(std::int64_t step, const EvalResult& r) {
    result_.last_eval = r;
    report_.eval(step, r);
    if (cb_.on_eval) cb_.on_eval(step, r, control_);
    const bool stop = early_stop_.stops_after(r);
    result_.best = early_stop_.best();
    if (!stop) return;
    result_.stopped_early = true;
    report_.line("early stop: " + o_.monitor + " has not improved for " + std::to_string(early_stop_.bad_evals()) +
                 " evaluation(s)");
    control_.request_stop();  // agreed: every rank has the same evaluation
  }
  }  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
