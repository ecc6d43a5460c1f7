#pragma once
// dtrain::fit's public types (run/fit.hpp): the options a run takes, what
// callbacks see and can do, and what it returns.

#include <signal.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/metrics/metric.hpp"
#include "dtrain/run/preemption.hpp"
#include "dtrain/train/options.hpp"

namespace dtrain {

struct FitOptions {
  std::int64_t steps = 0;        // optimizer steps in all (a resumed run continues to it); required
  std::int64_t batch_size = 32;  // rows per rank per micro-batch
  int num_workers = 2;           // data loader threads per rank
  bool shuffle = true;
  std::uint64_t seed = 0;  // the sampler's shuffle

  // Checkpoints: <checkpoint_dir>/step-<n>, resumable at any world size and strategy.
  std::filesystem::path checkpoint_dir = "checkpoints";
  std::int64_t save_every = 0;  // every N steps and at the end (0: only at the end, if save_final)
  bool save_final = true;       // a checkpoint after the last step
  int keep_last = 0;            // keep the newest K checkpoints (0: all)
  bool consolidated = false;    // checkpoints also hold model.safetensors (fp32, readable by Python)
  std::string resume{};         // "latest" (the newest complete checkpoint, if any) | a checkpoint | "": none
  // A save that fails (a full disk, a file-size limit, an I/O error) fails
  // on every rank, removes its partial files and leaves the previous
  // checkpoint as it was; stop rethrows it, keep_going reports it and trains on.
  save_error_policy on_save_error = save_error_policy::stop;
  // A step with a non-finite loss or gradient (the Trainer's on_nonfinite =
  // stop throws nonfinite_error): stop lets the error end the run; rollback
  // loads the newest checkpoint in checkpoint_dir, replays the steps since it
  // on the same batches and skips the batches of the failed step (at most
  // max_rollbacks times in a run). (skip is the Trainer's own choice.)
  nonfinite_policy on_nonfinite = nonfinite_policy::stop;
  int max_rollbacks = 3;

  // Evaluation over the eval source: every eval_every steps and at the end.
  std::int64_t eval_every = 0;    // 0: at the end only
  std::int64_t eval_batches = 0;  // batches per rank per evaluation (0: the whole source, split over ranks)
  std::vector<Metric> metrics{};  // see metrics/metric.hpp: metrics::accuracy(), your own

  // Early stop: after `patience` evaluations in a row without the monitored
  // value improving by more than min_delta, training stops (0: never).
  std::string monitor = "loss";  // "loss" (the evaluation loss) or a metric's name
  bool maximize = false;         // true for metrics where larger is better (accuracy)
  int patience = 0;
  double min_delta = 0;

  // Reporting (rank 0).
  std::int64_t log_every = 20;              // a progress line every N steps (and the first and last)
  bool progress = true;                     // print progress lines
  std::filesystem::path metrics_file{};     // JSON lines: one object per step and per evaluation
  std::filesystem::path tensorboard_dir{};  // TensorBoard scalars (a new events file per run)
  double peak_tflops = 0;                   // one rank's peak: the progress line adds TFLOP/s and MFU (0: not shown)
  std::filesystem::path save_params{};      // every parameter as fp32 safetensors at the end

  // Preemption notice: on any of these signals (to any rank) every rank
  // finishes its step, saves a checkpoint and fit returns preempted (empty:
  // the signals keep their own handling).
  std::vector<int> preempt_signals{SIGTERM, SIGUSR1};

  // Stragglers: at every progress point after step 1 the ranks' step times
  // and the time each waited in collectives are compared; the rank that
  // computed longest (step minus wait) is reported, and named in the
  // progress line when it took this many times the median rank's, a tenth of
  // the step and a millisecond or more (0: no comparison).
  double straggler_factor = 1.5;

  void validate() const;
};

// What callbacks can do to the run. A stop request takes effect after the
// next evaluation or progress point (every log_every steps), where the
// ranks compare requests: all stop if any asked.
class FitControl {
 public:
  void request_stop() { stop_ = true; }
  bool stop_requested() const { return stop_; }

 private:
  bool stop_ = false;
};

struct FitCallbacks {
  // Completes the micro-batches of the step about to run, before on_batches
  // and the step: what only the model can add (a reference model's
  // log-probabilities for a preference loss, Trainer::sequence_logps).
  // Collective: every rank's runs with its own micro-batches, so it may
  // call the trainer's forwards.
  std::function<void(std::int64_t step, std::span<Batch> micro_batches)> prepare_batches{};
  // The micro-batches of the step about to run (e.g. to record what a rank
  // trained on), before on_step.
  std::function<void(std::int64_t step, std::span<const Batch> micro_batches)> on_batches{};
  std::function<void(const StepStats&, FitControl&)> on_step{};
  std::function<void(std::int64_t step, const EvalResult&, FitControl&)> on_eval{};
  std::function<void(const std::filesystem::path& checkpoint)> on_save{};
};

struct FitResult {
  std::int64_t first_step = 0;  // the step the run started from (0, or the resumed checkpoint's)
  std::int64_t steps = 0;       // optimizer steps taken, in all
  bool stopped_early = false;
  std::optional<std::filesystem::path> resumed_from;
  std::optional<std::filesystem::path> last_checkpoint;
  std::optional<EvalResult> last_eval;
  std::optional<double> best;               // the best monitored value (early stop)
  int failed_saves = 0;                     // saves that failed under on_save_error = keep_going
  std::vector<std::int64_t> skipped_steps;  // on_nonfinite = rollback: steps whose batches were skipped
  bool preempted = false;                   // a preemption signal stopped the run after a checkpoint
  int preempt_signal = 0;                   // the signal this rank saw first (0: another rank's)

  // What main returns: preempted_exit_code (75) after a preemption, else 0.
  int exit_code() const { return preempted ? preempted_exit_code : 0; }
};

// An eval source for fit when there is none.
struct NoEvalSource {
  std::int64_t size() const { return 0; }
  Batch gather(std::span<const std::int64_t>) const { return {}; }
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit_options.ipp"
#endif
