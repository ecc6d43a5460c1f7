// The definitions fit_finish.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <sys/resource.h>

#include <cstdio>
#include <string>

#include "dtrain/run/fit_finish.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL void finish_fit(const FitOptions& o, const FitResult& r, FitReporter& report, bool rank0,
                              const std::function<void()>& evaluate, const std::function<void()>& save,
                              const std::function<void(const std::filesystem::path&)>& save_params) {
    if (r.preempted) {
      std::fflush(stdout);
      return;
    }
    if (r.steps > r.first_step || !r.last_eval) evaluate();
    if ((o.save_final || o.save_every > 0) && r.steps > r.first_step) save();
    if (r.steps == r.first_step)
      report.line("already at step " + std::to_string(r.steps) + " of " + std::to_string(o.steps) +
                  ": nothing to train");
    if (!o.save_params.empty()) save_params(o.save_params);
    if (rank0 && o.progress) {
      // The process's peak resident set: what the operating system saw,
      // beside the Trainer's own accounting.
      rusage usage{};
      ::getrusage(RUSAGE_SELF, &usage);
      std::printf("peak resident memory (rank 0): %.1f MiB\n", static_cast<double>(usage.ru_maxrss) / 1024.0);
      std::fflush(stdout);
    }
  }
  }  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
