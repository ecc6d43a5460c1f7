// The definitions fit_progress.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/run/fit_progress.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL Stragglers compare_ranks(World& world, const StepStats& st) {
    Stragglers s;
    std::vector<double> busy;
    for (const RankTimes& t : world.all_gather("straggler-times", RankTimes{st.step_ms, st.wait_ms})) {
      s.step_ms.push_back(t.step_ms);
      s.wait_ms.push_back(t.wait_ms);
      busy.push_back(std::max(0.0, t.step_ms - t.wait_ms));
    }
    s.slowest = static_cast<int>(std::max_element(busy.begin(), busy.end()) - busy.begin());
    std::vector<double> sorted = busy;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[(sorted.size() - 1) / 2];
    s.lag = median > 0 ? busy[static_cast<std::size_t>(s.slowest)] / median : 1.0;
    s.excess_ms = busy[static_cast<std::size_t>(s.slowest)] - median;
    return s;
  }

  DTRAIN_DECL bool any_rank(World& world, std::string_view what, bool mine) {
    const std::vector<bool> all = world.all_gather(what, mine);
    return std::find(all.begin(), all.end(), true) != all.end();
  }

  DTRAIN_DECL ProgressPoint::ProgressPoint(World& world, const FitOptions& o, FitResult& result)
      : world_(world), o_(o), result_(result) {
    if (!o.preempt_signals.empty()) watch_.emplace(o.preempt_signals);
  }

  DTRAIN_DECL std::optional<Stragglers> ProgressPoint::stragglers(const StepStats& st, bool last) {
    // Not at step 1: one-time costs (first touches, allocations) differ by
    // rank; and only where a progress line or the metrics file shows it
    // (the options are the same on every rank, so all compare or none).
    const bool shown = o_.progress || !o_.metrics_file.empty();
    if (shown && o_.straggler_factor > 0 && world_.size() > 1 && st.step > 1 && (st.step % o_.log_every == 0 || last))
      return compare_ranks(world_, st);
    return std::nullopt;
  }

  DTRAIN_DECL void ProgressPoint::preempted(const StepStats& st, FitReporter& report) {
    result_.preempted = true;
    result_.preempt_signal = watch_ ? watch_->signalled() : 0;
    const int sig = result_.preempt_signal;
    report.line("preempted" + (sig ? " (" + signal_name(sig) + ")" : std::string()) + " after step " +
                std::to_string(st.step) + ": saving a checkpoint and exiting with code " +
                std::to_string(preempted_exit_code) + " (requeue; resume=latest continues from it)");
  }

  DTRAIN_DECL bool ProgressPoint::stop_agreed(std::int64_t step, bool last, bool eval_due, const FitControl& control) {
    const bool compared = eval_due || (!last && step % o_.log_every == 0);
    if (!compared || !any_rank(world_, "fit-stop", control.stop_requested())) return false;
    result_.stopped_early = true;
    return true;
  }
  }  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
