// The definitions fit_rollback.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <algorithm>
#include <iterator>
#include <string>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/run/fit_rollback.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL RollbackGuard::RollbackGuard(const FitOptions& o, FitReporter& report, FitResult& result)
      : o_(o), report_(report), result_(result) {}

  DTRAIN_DECL bool RollbackGuard::skips(std::int64_t next) {
    const auto it = std::ranges::find(skips_, next, &Skip::step);
    if (it == skips_.end() || it->done) return false;
    it->done = true;
    report_.line("skipping the batches of step " + std::to_string(next) + " (a non-finite step before the rollback)");
    return true;
  }

  DTRAIN_DECL bool RollbackGuard::roll_back(std::int64_t failed, const nonfinite_error& e, const Rewind& rewind) {
    if (o_.on_nonfinite != nonfinite_policy::rollback || std::ssize(skips_) >= o_.max_rollbacks) return false;
    const auto saved = list_checkpoints(o_.checkpoint_dir);
    if (saved.empty()) return false;
    // A new replay: it skips the batches of every step that failed so far.
    for (Skip& s : skips_) s.done = false;
    skips_.push_back({.step = failed});
    result_.skipped_steps.push_back(failed);
    const std::int64_t resumed = rewind(saved.back());
    report_.rollback(failed, resumed, saved.back(), e.what());
    return true;
  }
  }  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
