#pragma once
// dtrain::fit's progress points and stops. The ranks compare what may
// differ between them only at places every rank reaches at the same step:
// step times (stragglers) at progress points, stop requests (callbacks, early
// stop) there and after evaluations. A preemption notice (run/preemption.hpp)
// travels faster: in the next step's own all-reduce (TrainerCore::request_stop).

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/wire.hpp"
#include "dtrain/run/fit_options.hpp"
#include "dtrain/run/fit_reporter.hpp"
#include "dtrain/run/preemption.hpp"
#include "dtrain/train/options.hpp"

namespace dtrain {

namespace detail {

// Collective (through the store): every rank calls it at the same steps.
struct RankTimes {
  double step_ms = 0, wait_ms = 0;
  static constexpr auto wire_fields() {
    return std::tuple{field("step_ms", &RankTimes::step_ms), field("wait_ms", &RankTimes::wait_ms)};
  }
};

DTRAIN_DECL Stragglers compare_ranks(World& world, const StepStats& st);

// True when any rank's flag is set (a store round trip: used at progress
// points, not every step).
DTRAIN_DECL bool any_rank(World& world, std::string_view what, bool mine);

class ProgressPoint {
 public:
  // Watches the preempt_signals from here to its end; records a preemption
  // and an agreed stop in `result` (preempted, preempt_signal, stopped_early).
  DTRAIN_DECL ProgressPoint(World& world, const FitOptions& o, FitResult& result);
  ProgressPoint(const ProgressPoint&) = delete;
  ProgressPoint& operator=(const ProgressPoint&) = delete;

  // Before a step: whether this rank has had a notice goes into the step's
  // all-reduce (without a watch the trainer's own request stands).
  template <class Trainer>
  void pass_notice(Trainer& trainer) const {
    if (watch_) trainer.request_stop(watch_->signalled() != 0);
  }

  // Every rank's step times at a progress point the ranks compare (not step
  // 1, and only where a progress line or the metrics file shows them);
  // nullopt elsewhere. Collective at those steps.
  DTRAIN_DECL std::optional<Stragglers> stragglers(const StepStats& st, bool last);

  // After a step whose all-reduce carried a preemption notice: records it
  // and says so.
  DTRAIN_DECL void preempted(const StepStats& st, FitReporter& report);

  // Whether every rank stops after step `step`: the ranks compare stop
  // requests at progress points and at evaluation steps (eval_due; collective
  // there), and all stop if any asked.
  DTRAIN_DECL bool stop_agreed(std::int64_t step, bool last, bool eval_due, const FitControl& control);

 private:
  World& world_;
  const FitOptions& o_;
  FitResult& result_;
  std::optional<PreemptionWatch> watch_;
};

}  // namespace detail
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit_progress.ipp"
#endif
