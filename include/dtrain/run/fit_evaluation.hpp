#pragma once
// dtrain::fit's evaluations: which rows of the eval source each rank
// evaluates, what follows an evaluation (the result, the report, on_eval),
// and early stop on the monitored value.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/data/loader.hpp"
#include "dtrain/metrics/metric.hpp"
#include "dtrain/run/fit_options.hpp"
#include "dtrain/run/fit_reporter.hpp"

namespace dtrain {

namespace detail {

// The evaluation batches of `rank`, as rows of the eval source: rows rank,
// rank + world_size, ..., batch_size at a time (the last batch may be
// short), at most max_batches batches (0: all). Every rank its own; ranks
// may hold unequal numbers, which Trainer::evaluate allows.
DTRAIN_DECL std::vector<std::vector<std::int64_t>> eval_rows(std::int64_t rows, int rank, int world_size,
                                                             std::int64_t batch_size, std::int64_t max_batches);

// Early stop (FitOptions::monitor, maximize, patience, min_delta): one
// evaluation in, a decision out.
class EarlyStop {
 public:
  DTRAIN_DECL explicit EarlyStop(const FitOptions& o);

  // True when this evaluation makes `patience` in a row (or more) whose
  // monitored value did not beat the best by more than min_delta. Never with
  // patience 0 (the monitored value is not even looked up then). Throws
  // config_error when monitor names neither the loss nor one of r's metrics.
  DTRAIN_DECL bool stops_after(const EvalResult& r);

  const std::optional<double>& best() const { return best_; }
  int bad_evals() const { return bad_evals_; }

 private:
  std::string monitor_;
  bool maximize_;
  int patience_;
  double min_delta_;
  std::optional<double> best_;
  int bad_evals_ = 0;
};

// The evaluations of a run: every eval_every steps and at the end.
class EvalDriver {
 public:
  // Records its evaluations in `result` (last_eval, best, stopped_early);
  // an early stop is asked of `control`.
  DTRAIN_DECL EvalDriver(const FitOptions& o, const FitCallbacks& cb, FitReporter& report, FitResult& result,
                         FitControl& control);

  // Whether step `step` evaluates on the way (the last one evaluates at the end).
  bool due(std::int64_t step, bool last) const { return o_.eval_every > 0 && step % o_.eval_every == 0 && !last; }

  // Evaluates the trainer on this rank's rows of *eval and records it; with
  // no eval source, or an empty one, nothing. Collective.
  template <class Trainer, BatchSource Eval>
  void evaluate(Trainer& trainer, const Eval* eval) {
    if (eval == nullptr || eval->size() < 1) return;
    World& world = trainer.world();
    std::vector<Batch> batches;
    for (const auto& rows :
         eval_rows(static_cast<std::int64_t>(eval->size()), world.rank(), world.size(), o_.batch_size, o_.eval_batches))
      batches.push_back(eval->gather(rows));
    record(trainer.steps_taken(), trainer.evaluate(batches, o_.metrics));
  }

  // What follows the evaluation at step `step`: the result kept, reported
  // and passed to on_eval, then early stop's decision (a stop request, agreed
  // by every rank: they all have the same evaluation).
  DTRAIN_DECL void record(std::int64_t step, const EvalResult& r);

 private:
  const FitOptions& o_;
  const FitCallbacks& cb_;
  FitReporter& report_;
  FitResult& result_;
  FitControl& control_;
  EarlyStop early_stop_;
};

}  // namespace detail
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit_evaluation.ipp"
#endif
