#pragma once
// The end of dtrain::fit, after the last step: the final evaluation and
// checkpoint, the parameters file and rank 0's peak memory.

#include <filesystem>
#include <functional>

#include "dtrain/core/macros.hpp"
#include "dtrain/run/fit_options.hpp"
#include "dtrain/run/fit_reporter.hpp"

namespace dtrain {

namespace detail {

// After a preemption only the output is flushed: the checkpoint is saved,
// and the requeued run does the rest when it ends. Otherwise, in this order:
// an evaluation (unless the run trained nothing and has one already), a
// checkpoint (if it trained and save_final or save_every asks for one), a
// line saying it had nothing to train (if so), the parameters
// (save_params) and, on rank 0, the peak resident memory.
DTRAIN_DECL void finish_fit(const FitOptions& o, const FitResult& r, FitReporter& report, bool rank0,
                            const std::function<void()>& evaluate, const std::function<void()>& save,
                            const std::function<void(const std::filesystem::path&)>& save_params);

}  // namespace detail
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit_finish.ipp"
#endif
