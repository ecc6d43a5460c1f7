#pragma once
// dtrain::fit: the training loop most programs need, around any Trainer.
// It keeps the data order, checkpoints every save_every steps (keeping the
// newest keep_last), resumes from the newest complete checkpoint, evaluates
// every eval_every steps with the user's metrics, stops early when the
// monitored value stops improving, writes metrics as JSON lines and
// TensorBoard scalars, and prints a progress line with samples or tokens
// per second and memory. Callbacks see every step, evaluation and save.
//
//   dtrain::FitOptions fit{.steps = 1000, .batch_size = 32, .save_every = 200, .resume = "latest",
//                          .eval_every = 200, .metrics = {dtrain::metrics::accuracy()}};
//   dtrain::fit(trainer, train_set, &held_out, fit);
//
// Every rank calls fit with the same options. A program run again with
// resume = "latest" continues where the last run stopped; one that already
// reached `steps` trains nothing and returns.
//
// Preemption (run/preemption.hpp): on SIGTERM or SIGUSR1 (preempt_signals)
// to any rank, every rank finishes the step in flight and the next, agreed
// through that step's all-reduce, saves a checkpoint and returns with
// FitResult::preempted; return result.exit_code() from main (75, "requeue").

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/data/loader.hpp"
#include "dtrain/data/sampler.hpp"
#include "dtrain/metrics/tensorboard.hpp"
#include "dtrain/run/preemption.hpp"
#include "dtrain/metrics/metric.hpp"
#include "dtrain/train/options.hpp"

namespace dtrain {

struct FitOptions {
  std::int64_t steps = 0;        // optimizer steps in all (a resumed run continues to it); required
  std::int64_t batch_size = 32;  // rows per rank per micro-batch
  int num_workers = 2;           // data loader threads per rank
  bool shuffle = true;
  std::uint64_t seed = 0;        // the sampler's shuffle

  // Checkpoints: <checkpoint_dir>/step-<n>, resumable at any world size and strategy.
  std::filesystem::path checkpoint_dir = "checkpoints";
  std::int64_t save_every = 0;   // every N steps and at the end (0: only at the end, if save_final)
  bool save_final = true;        // a checkpoint after the last step
  int keep_last = 0;             // keep the newest K checkpoints (0: all)
  bool consolidated = false;     // checkpoints also hold model.safetensors (fp32, readable by Python)
  std::string resume{};          // "latest" (the newest complete checkpoint, if any) | a checkpoint | "": none
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
  std::int64_t eval_every = 0;   // 0: at the end only
  std::int64_t eval_batches = 0; // batches per rank per evaluation (0: the whole source, split over ranks)
  std::vector<Metric> metrics{}; // see metrics/metric.hpp: metrics::accuracy(), your own

  // Early stop: after `patience` evaluations in a row without the monitored
  // value improving by more than min_delta, training stops (0: never).
  std::string monitor = "loss";  // "loss" (the evaluation loss) or a metric's name
  bool maximize = false;         // true for metrics where larger is better (accuracy)
  int patience = 0;
  double min_delta = 0;

  // Reporting (rank 0).
  std::int64_t log_every = 20;   // a progress line every N steps (and the first and last)
  bool progress = true;          // print progress lines
  std::filesystem::path metrics_file{};     // JSON lines: one object per step and per evaluation
  std::filesystem::path tensorboard_dir{};  // TensorBoard scalars (a new events file per run)
  double peak_tflops = 0;        // one rank's peak: the progress line adds TFLOP/s and MFU (0: not shown)
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
  // The micro-batches of the step about to run (e.g. to record what a rank
  // trained on), before on_step.
  std::function<void(std::int64_t step, std::span<const Batch> micro_batches)> on_batches{};
  std::function<void(const StepStats&, FitControl&)> on_step{};
  std::function<void(std::int64_t step, const EvalResult&, FitControl&)> on_eval{};
  std::function<void(const std::filesystem::path& checkpoint)> on_save{};
};

struct FitResult {
  std::int64_t first_step = 0;     // the step the run started from (0, or the resumed checkpoint's)
  std::int64_t steps = 0;          // optimizer steps taken, in all
  bool stopped_early = false;
  std::optional<std::filesystem::path> resumed_from;
  std::optional<std::filesystem::path> last_checkpoint;
  std::optional<EvalResult> last_eval;
  std::optional<double> best;      // the best monitored value (early stop)
  int failed_saves = 0;            // saves that failed under on_save_error = keep_going
  std::vector<std::int64_t> skipped_steps;  // on_nonfinite = rollback: steps whose batches were skipped
  bool preempted = false;          // a preemption signal stopped the run after a checkpoint
  int preempt_signal = 0;          // the signal this rank saw first (0: another rank's)

  // What main returns: preempted_exit_code (75) after a preemption, else 0.
  int exit_code() const { return preempted ? preempted_exit_code : 0; }
};

// An eval source for fit when there is none.
struct NoEvalSource {
  std::int64_t size() const { return 0; }
  Batch gather(std::span<const std::int64_t>) const { return {}; }
};


namespace detail {

DTRAIN_DECL std::string mib_text(std::size_t bytes);

// Every rank's step time and time waiting in collectives at one step, and
// the rank that computed longest (step minus wait) against the median rank.
struct Stragglers {
  std::vector<double> step_ms, wait_ms;
  int slowest = 0;
  double lag = 1;        // the slowest rank's compute time over the median rank's
  double excess_ms = 0;  // the slowest rank's compute time minus the median rank's
};

// Collective (through the store): every rank calls it at the same steps.
struct RankTimes {
  double step_ms = 0, wait_ms = 0;
  static constexpr auto wire_fields() {
    return std::tuple{field("step_ms", &RankTimes::step_ms), field("wait_ms", &RankTimes::wait_ms)};
  }
};

DTRAIN_DECL Stragglers compare_ranks(World& world, const StepStats& st);

// "params 1.2 | grads ... MiB" for the first progress line.
DTRAIN_DECL std::string memory_text(const MemoryUsage& m);

DTRAIN_DECL std::string memory_json(const MemoryUsage& m);

DTRAIN_DECL std::string json_number(double v);

// Where fit writes what it measures, on rank 0: progress lines, the metrics
// file, TensorBoard.
class FitReporter {
 public:
  DTRAIN_DECL FitReporter(const FitOptions& o, bool rank0, bool resumed, std::int64_t first_step);

  DTRAIN_DECL void step(const StepStats& st, int world_size, std::string_view strategy, std::size_t params, bool last, const Stragglers* lag = nullptr);

  // A rollback: the failed step, where training resumes, and why.
  DTRAIN_DECL void rollback(std::int64_t failed, std::int64_t resumed, const std::filesystem::path& from, const std::string& why);

  DTRAIN_DECL void eval(std::int64_t step, const EvalResult& r);

  DTRAIN_DECL void line(const std::string& text);

 private:
  const FitOptions& o_;
  bool rank0_;
  bool shown_memory_ = false;
  std::ofstream metrics_;
  std::optional<TensorBoardWriter> tensorboard_;
};

// True when any rank's flag is set (a store round trip: used at progress
// points, not every step).
DTRAIN_DECL bool any_rank(World& world, std::string_view what, bool mine);

}  // namespace detail

// Trains `trainer` on `train` until options.steps, evaluating on *eval (may
// be null). Collective: every rank calls it with the same options.
template <class Trainer, BatchSource Train, BatchSource Eval = NoEvalSource>
FitResult fit(Trainer& trainer, const Train& train, const Eval* eval, const FitOptions& options,
              const FitCallbacks& callbacks = {}) {
  options.validate();
  // From the start (a notice while the checkpoint loads stops after the
  // first step) to the return (one after the last step is noted, not fatal).
  std::optional<PreemptionWatch> watch;
  if (!options.preempt_signals.empty()) watch.emplace(options.preempt_signals);
  World& world = trainer.world();
  const bool rank0 = world.rank() == 0;
  FitResult result;
  DistributedSampler sampler(static_cast<std::int64_t>(train.size()), world,
                             {.shuffle = options.shuffle, .seed = options.seed});

  // Resume. With "latest", a checkpoint that fails verification is reported
  // and the one before it tried: a damaged newest checkpoint costs the steps
  // since the previous one, not the run.
  std::vector<std::filesystem::path> candidates;
  if (options.resume == "latest") {
    candidates = list_checkpoints(options.checkpoint_dir);
    std::ranges::reverse(candidates);
  } else if (!options.resume.empty()) {
    candidates.emplace_back(options.resume);
  }
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    try {
      const CheckpointInfo info = trainer.load(candidates[i]);
      if (info.sampler) sampler.load_state(info.sampler->state_for(sampler));
      result.resumed_from = candidates[i];
      if (rank0 && options.progress)
        std::printf("resumed from %s at step %lld (saved by %d rank(s), strategy %s)\n", candidates[i].c_str(),
                    static_cast<long long>(info.step), info.world_size, info.strategy.c_str());
      break;
    } catch (const checkpoint_error& e) {
      if (i + 1 == candidates.size()) throw;
      if (rank0) std::printf("resume: skipping %s: %s\n", candidates[i].c_str(), e.what());
    }
  }
  if (options.resume == "latest" && candidates.empty() && rank0 && options.progress)
    std::printf("resume=latest: no checkpoint in %s yet: starting from step 0\n", options.checkpoint_dir.c_str());
  result.first_step = trainer.steps_taken();

  detail::FitReporter report(options, rank0, result.resumed_from.has_value(), result.first_step);
  // The loader starts where the (restored) sampler stands.
  std::optional<DataLoader> loader;
  loader.emplace(train, sampler, LoaderOptions{.batch_size = options.batch_size, .num_workers = options.num_workers});
  const std::size_t params = trainer.layout().trainable_numel() + trainer.layout().frozen_numel();
  FitControl control;

  const auto save = [&] {
    const auto dir = checkpoint_path(options.checkpoint_dir, trainer.steps_taken());
    if (is_checkpoint(dir)) return;  // a run before a restart saved this step already
    try {
      trainer.save(dir, {.consolidated = options.consolidated, .sampler = &sampler});
    } catch (const checkpoint_error& e) {
      // The same error on every rank (the save agrees on it), so all decide alike.
      if (options.on_save_error != save_error_policy::keep_going) throw;
      ++result.failed_saves;
      report.line("checkpoint at step " + std::to_string(trainer.steps_taken()) + " failed, training on "
                  "(on_save_error=continue): " + e.what());
      return;
    }
    result.last_checkpoint = dir;
    if (rank0 && options.keep_last > 0) prune_checkpoints(options.checkpoint_dir, options.keep_last);
    report.line("saved checkpoint " + dir.string());
    if (callbacks.on_save) callbacks.on_save(dir);
  };

  // The evaluation batches of this rank: rows rank, rank + world, ... of
  // the source, batch_size at a time (every rank its own; ranks may hold
  // unequal numbers, which evaluate allows).
  int bad_evals = 0;
  const auto evaluate = [&] {
    if (eval == nullptr || eval->size() < 1) return;
    std::vector<Batch> batches;
    std::vector<std::int64_t> idx;
    for (std::int64_t r = world.rank(); r < static_cast<std::int64_t>(eval->size()); r += world.size()) {
      idx.push_back(r);
      if (static_cast<std::int64_t>(idx.size()) == options.batch_size) {
        batches.push_back(eval->gather(idx));
        idx.clear();
        if (options.eval_batches > 0 && static_cast<std::int64_t>(batches.size()) == options.eval_batches) break;
      }
    }
    if (!idx.empty() && (options.eval_batches == 0 || static_cast<std::int64_t>(batches.size()) < options.eval_batches))
      batches.push_back(eval->gather(idx));
    const EvalResult r = trainer.evaluate(batches, options.metrics);
    result.last_eval = r;
    report.eval(trainer.steps_taken(), r);
    if (callbacks.on_eval) callbacks.on_eval(trainer.steps_taken(), r, control);
    if (options.patience == 0) return;
    double value = r.loss;
    if (options.monitor != "loss") {
      const auto it = r.metrics.find(options.monitor);
      if (it == r.metrics.end())
        throw config_error("FitOptions.monitor = '" + options.monitor + "' is not among the evaluation's values",
                           "monitor \"loss\" or the name a metric adds (e.g. \"accuracy\")");
      value = it->second;
    }
    const bool better = !result.best || (options.maximize ? value > *result.best + options.min_delta
                                                          : value < *result.best - options.min_delta);
    if (better) {
      result.best = value;
      bad_evals = 0;
    } else if (++bad_evals >= options.patience) {
      result.stopped_early = true;
      report.line("early stop: " + options.monitor + " has not improved for " + std::to_string(bad_evals) +
                  " evaluation(s)");
      control.request_stop();  // agreed: every rank has the same evaluation
    }
  };

  std::vector<Batch> micro(static_cast<std::size_t>(trainer.micro_batches()));
  // on_nonfinite = rollback: the steps whose batches are skipped (their
  // numbers as the failed run counted them), and which of them this replay
  // has skipped already.
  std::vector<std::int64_t> skip;
  std::vector<bool> skipped_now;
  int rollbacks = 0;
  while (trainer.steps_taken() < options.steps) {
    for (auto& b : micro) b = loader->next();
    const std::int64_t next = trainer.steps_taken() + 1;
    if (const auto it = std::ranges::find(skip, next); it != skip.end() && !skipped_now[it - skip.begin()]) {
      skipped_now[it - skip.begin()] = true;
      report.line("skipping the batches of step " + std::to_string(next) + " (a non-finite step before the rollback)");
      continue;  // the next draw trains step `next`
    }
    if (callbacks.on_batches) callbacks.on_batches(next, micro);
    if (watch) trainer.request_stop(watch->signalled() != 0);
    StepStats st;
    try {
      st = trainer.step(micro);
    } catch (const nonfinite_error& e) {
      // Every rank throws in the same step (the loss and norm are agreed).
      if (options.on_nonfinite != nonfinite_policy::rollback || rollbacks >= options.max_rollbacks) throw;
      const auto saved = list_checkpoints(options.checkpoint_dir);
      if (saved.empty()) throw;
      ++rollbacks;
      skip.push_back(next);
      skipped_now.assign(skip.size(), false);
      result.skipped_steps.push_back(next);
      loader.reset();  // no worker reads the sampler while it is rewound
      const CheckpointInfo info = trainer.load(saved.back());
      if (info.sampler) sampler.load_state(info.sampler->state_for(sampler));
      loader.emplace(train, sampler, LoaderOptions{.batch_size = options.batch_size, .num_workers = options.num_workers});
      report.rollback(next, trainer.steps_taken(), saved.back(), e.what());
      continue;
    }
    const bool last = st.step >= options.steps;
    std::optional<detail::Stragglers> lag;
    // Not at step 1: one-time costs (first touches, allocations) differ by
    // rank; and only where a progress line or the metrics file shows it
    // (the options are the same on every rank, so all compare or none).
    const bool shown = options.progress || !options.metrics_file.empty();
    if (shown && options.straggler_factor > 0 && world.size() > 1 && st.step > 1 &&
        (st.step % options.log_every == 0 || last))
      lag = detail::compare_ranks(world, st);
    report.step(st, world.size(), trainer.strategy_name(), params, last, lag ? &*lag : nullptr);
    if (callbacks.on_step) callbacks.on_step(st, control);
    if (st.stop_requested) {
      // Every rank saw the same request in this step's all-reduce.
      result.preempted = true;
      result.preempt_signal = watch ? watch->signalled() : 0;
      report.line("preempted" + (result.preempt_signal ? " (" + signal_name(result.preempt_signal) + ")" : std::string()) +
                  " after step " + std::to_string(st.step) + ": saving a checkpoint and exiting with code " +
                  std::to_string(preempted_exit_code) + " (requeue; resume=latest continues from it)");
      save();
      break;
    }
    if (options.save_every > 0 && st.step % options.save_every == 0 && !last) save();
    // Stop requests (early stop, callbacks: perhaps from one rank only) are
    // compared after an evaluation and at progress points, and all ranks
    // stop if any asked.
    bool check = !last && st.step % options.log_every == 0;
    if (options.eval_every > 0 && st.step % options.eval_every == 0 && !last) {
      evaluate();
      check = true;
    }
    const bool stop = check && detail::any_rank(world, "fit-stop", control.stop_requested());
    if (stop) {
      result.stopped_early = true;
      break;
    }
  }
  result.steps = trainer.steps_taken();
  if (result.preempted) {
    std::fflush(stdout);
    return result;
  }
  if (result.steps > result.first_step || !result.last_eval) evaluate();
  if ((options.save_final || options.save_every > 0) && result.steps > result.first_step) save();
  if (result.steps == result.first_step) report.line("already at step " + std::to_string(result.steps) + " of " +
                                                     std::to_string(options.steps) + ": nothing to train");
  if (!options.save_params.empty()) trainer.save_params(options.save_params);
  if (rank0 && options.progress) {
    // The process's peak resident set: what the operating system saw,
    // beside the Trainer's own accounting.
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    std::printf("peak resident memory (rank 0): %.1f MiB\n", static_cast<double>(usage.ru_maxrss) / 1024.0);
    std::fflush(stdout);
  }
  return result;
}

// The same without evaluation.
template <class Trainer, BatchSource Train>
FitResult fit(Trainer& trainer, const Train& train, const FitOptions& options, const FitCallbacks& callbacks = {}) {
  return fit(trainer, train, static_cast<const NoEvalSource*>(nullptr), options, callbacks);
}

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit.ipp"
#endif
