#pragma once
// dtrain::fit's checkpoints: which steps save, a step saved already (by a
// run before a restart) left as it is, a failed save under on_save_error,
// pruning to the newest keep_last, and on_save.

#include <cstdint>
#include <filesystem>
#include <functional>

#include "dtrain/core/macros.hpp"
#include "dtrain/run/fit_options.hpp"
#include "dtrain/run/fit_reporter.hpp"

namespace dtrain {

namespace detail {

class Checkpointer {
 public:
  // Writes a checkpoint into a directory (collective): Trainer::save with
  // the sampler's position in fit.
  using Write = std::function<void(const std::filesystem::path&)>;

  // Records its saves in `result` (last_checkpoint, failed_saves).
  DTRAIN_DECL Checkpointer(const FitOptions& o, const FitCallbacks& cb, FitReporter& report, FitResult& result,
                           bool rank0, Write write);

  // Whether step `step` saves on the way (the last one saves at the end).
  bool due(std::int64_t step, bool last) const { return o_.save_every > 0 && step % o_.save_every == 0 && !last; }

  // Saves the checkpoint of step `step` into checkpoint_dir, unless there
  // is one already. A checkpoint_error is rethrown, or with on_save_error =
  // keep_going counted and reported.
  DTRAIN_DECL void save(std::int64_t step);

 private:
  const FitOptions& o_;
  const FitCallbacks& cb_;
  FitReporter& report_;
  FitResult& result_;
  bool rank0_;
  Write write_;
};

}  // namespace detail
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit_checkpointer.ipp"
#endif
