#pragma once
// dtrain::fit's on_nonfinite = rollback: after a step with a non-finite loss
// or gradient (nonfinite_error, thrown by every rank in the same step), go
// back to the newest checkpoint, replay the steps since it on the same
// batches and skip the failed step's, at most max_rollbacks times a run.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/run/fit_options.hpp"
#include "dtrain/run/fit_reporter.hpp"

namespace dtrain {

namespace detail {

class RollbackGuard {
 public:
  // Loads a checkpoint into the run (collective: TrainBatches::rewind in
  // fit) and returns the step training continues from.
  using Rewind = std::function<std::int64_t(const std::filesystem::path&)>;

  // Records the skipped steps in `result` (skipped_steps).
  DTRAIN_DECL RollbackGuard(const FitOptions& o, FitReporter& report, FitResult& result);

  // Whether the batches drawn for step `next` are those a step failed on
  // before a rollback: skipped once in each replay (the next draw trains
  // step `next`), and reported.
  DTRAIN_DECL bool skips(std::int64_t next);

  // After step `failed` threw `e`: rewinds to the newest checkpoint in
  // checkpoint_dir, the replay to skip that step's batches. False, with
  // nothing done, when the error is to end the run: on_nonfinite = stop,
  // max_rollbacks reached, no checkpoint to go back to.
  DTRAIN_DECL bool roll_back(std::int64_t failed, const nonfinite_error& e, const Rewind& rewind);

 private:
  // A step whose batches are skipped (its number as the failed run counted
  // it), and whether this replay has skipped them already.
  struct Skip {
    std::int64_t step = 0;
    bool done = false;
  };

  const FitOptions& o_;
  FitReporter& report_;
  FitResult& result_;
  std::vector<Skip> skips_;  // one per rollback
};

}  // namespace detail
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit_rollback.ipp"
#endif
