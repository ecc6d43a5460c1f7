// The definitions fit_checkpointer.hpp declares with DTRAIN_DECL: included at
// the end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they
// are compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <string>
#include <utility>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/run/fit_checkpointer.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL Checkpointer::Checkpointer(const FitOptions& o, const FitCallbacks& cb, FitReporter& report,
                                         FitResult& result, bool rank0, Write write)
      : o_(o), cb_(cb), report_(report), result_(result), rank0_(rank0), write_(std::move(write)) {}

  DTRAIN_DECL void Checkpointer::save(std::int64_t step) {
    const auto dir = checkpoint_path(o_.checkpoint_dir, step);
    if (is_checkpoint(dir)) return;  // a run before a restart saved this step already
    try {
      write_(dir);
    } catch (const checkpoint_error& e) {
      // The same error on every rank (the save agrees on it), so all decide alike.
      if (o_.on_save_error != save_error_policy::keep_going) throw;
      ++result_.failed_saves;
      report_.line("checkpoint at step " + std::to_string(step) +
                   " failed, training on "
                   "(on_save_error=continue): " +
                   e.what());
      return;
    }
    result_.last_checkpoint = dir;
    if (rank0_ && o_.keep_last > 0) prune_checkpoints(o_.checkpoint_dir, o_.keep_last);
    report_.line("saved checkpoint " + dir.string());
    if (cb_.on_save) cb_.on_save(dir);
  }
  }  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
