// The definitions fit_options.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <string>
#include <system_error>

#include "dtrain/core/error.hpp"
#include "dtrain/run/fit_options.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL void FitOptions::validate() const {
    const auto require = [](bool ok, const std::string& what, const std::string& fix) {
      if (!ok) throw config_error("FitOptions: " + what, fix);
    };
    require(steps >= 1, "steps = " + std::to_string(steps) + " is not at least 1", "set .steps to the steps to train");
    require(batch_size >= 1, "batch_size = " + std::to_string(batch_size) + " is not at least 1",
            "set .batch_size, the rows per rank per micro-batch");
    require(num_workers >= 0, "num_workers is negative", "set .num_workers >= 0 (0: gather on the training thread)");
    require(save_every >= 0 && keep_last >= 0, "save_every and keep_last must be >= 0",
            "set .save_every = N to checkpoint every N steps, .keep_last = K to keep the newest K");
    require(eval_every >= 0 && eval_batches >= 0, "eval_every and eval_batches must be >= 0",
            "set .eval_every = N to evaluate every N steps, .eval_batches = B per rank (0: the whole source)");
    require(patience >= 0 && min_delta >= 0, "patience and min_delta must be >= 0",
            "set .patience = K evaluations without improvement before stopping (0: never)");
    require(log_every >= 1, "log_every must be at least 1", "set .log_every = 20");
    require(straggler_factor == 0 || straggler_factor >= 1,
            "straggler_factor = " + std::to_string(straggler_factor) + " is neither 0 nor at least 1",
            "set .straggler_factor = 1.5 (name a rank computing 1.5x as long as the median) or 0 (off)");
    require(on_nonfinite != nonfinite_policy::skip, "FitOptions::on_nonfinite = skip",
            "skipping is the Trainer's: set TrainerOptions::on_nonfinite = skip; fit's choices are stop and rollback");
    require(max_rollbacks >= 0, "max_rollbacks is negative", "set .max_rollbacks = 3");
    require(peak_tflops >= 0, "peak_tflops is negative", "set .peak_tflops to one rank's peak TFLOP/s, or 0");
    std::error_code looked;
    require(resume.empty() || resume == "latest" || std::filesystem::exists(resume, looked),
            "resume = '" + resume + "' is neither latest nor an existing directory" +
                (looked ? " (" + looked.message() + ")" : ""),
            "use resume = \"latest\" (the newest checkpoint in checkpoint_dir) or a checkpoint's path");
  }
}  // namespace dtrain
DTRAIN_IMPL_END
