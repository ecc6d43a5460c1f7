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
//
// fit is the loop; its parts, each tested alone (tests/run/fit_parts_test.cpp):
// fit_options.hpp (the public types), fit_reporter.hpp (progress lines, the
// metrics file, TensorBoard), fit_batches.hpp (sampler and loader),
// fit_resume.hpp, fit_checkpointer.hpp, fit_evaluation.hpp (evaluation
// batches, early stop), fit_rollback.hpp (on_nonfinite = rollback),
// fit_progress.hpp (stragglers, preemption, stop requests agreed by the
// ranks), fit_finish.hpp (the end of a run).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/data/loader.hpp"
#include "dtrain/run/fit_batches.hpp"
#include "dtrain/run/fit_checkpointer.hpp"
#include "dtrain/run/fit_evaluation.hpp"
#include "dtrain/run/fit_finish.hpp"
#include "dtrain/run/fit_options.hpp"
#include "dtrain/run/fit_progress.hpp"
#include "dtrain/run/fit_reporter.hpp"
#include "dtrain/run/fit_resume.hpp"
#include "dtrain/run/fit_rollback.hpp"
#include "dtrain/train/options.hpp"

namespace dtrain {

// Trains `trainer` on `train` until options.steps, evaluating on *eval (may
// be null). Collective: every rank calls it with the same options, and every
// rank makes the same collective calls in the same order.
template <class Trainer, BatchSource Train, BatchSource Eval = NoEvalSource>
FitResult fit(Trainer& trainer, const Train& train, const Eval* eval, const FitOptions& options,
              const FitCallbacks& callbacks = {}) {
  options.validate();
  World& world = trainer.world();
  const bool rank0 = world.rank() == 0;
  FitResult result;
  // Watching from here: a notice while the checkpoint loads stops the run after its first step.
  detail::ProgressPoint progress(world, options, result);
  detail::TrainBatches batches(train, world, options);
  const auto restore = [&](const std::filesystem::path& dir) { return batches.restore(trainer, dir); };
  result.resumed_from = detail::Resumer(options, rank0).resume(restore);
  result.first_step = trainer.steps_taken();
  detail::FitReporter report(options, rank0, result.resumed_from.has_value(), result.first_step);
  batches.start();  // after the resume: the loader draws on from the restored sampler's position
  detail::Checkpointer checkpointer(options, callbacks, report, result, rank0,
                                    [&](const auto& dir) { batches.save(trainer, dir, options.consolidated); });
  const auto save = [&] { checkpointer.save(trainer.steps_taken()); };
  FitControl control;
  detail::EvalDriver evaluator(options, callbacks, report, result, control);
  const auto evaluate = [&] { evaluator.evaluate(trainer, eval); };
  detail::RollbackGuard rollback(options, report, result);
  const std::size_t params = trainer.layout().trainable_numel() + trainer.layout().frozen_numel();
  std::vector<Batch> micro(static_cast<std::size_t>(trainer.micro_batches()));
  while (trainer.steps_taken() < options.steps) {
    for (auto& b : micro) b = batches.next();
    const std::int64_t next = trainer.steps_taken() + 1;
    if (rollback.skips(next)) continue;  // the next draw trains step `next`
    if (callbacks.prepare_batches) callbacks.prepare_batches(next, micro);
    if (callbacks.on_batches) callbacks.on_batches(next, micro);
    // Set before the step: the notice rides in the step's own all-reduce, so
    // every rank learns of it in the same step and stops after it.
    progress.pass_notice(trainer);
    StepStats st;
    try {
      st = trainer.step(micro);
    } catch (const nonfinite_error& e) {
      // Every rank throws in the same step (the loss and norm are agreed): all roll back, or all rethrow.
      if (!rollback.roll_back(next, e, [&](const auto& dir) { return batches.rewind(trainer, dir); })) throw;
      continue;
    }
    const bool last = st.step >= options.steps;
    const auto lag = progress.stragglers(st, last);
    report.step(st, world.size(), trainer.strategy_name(), params, last, lag ? &*lag : nullptr);
    if (callbacks.on_step) callbacks.on_step(st, control);
    if (st.stop_requested) {  // a notice in this step's all-reduce: the same on every rank
      progress.preempted(st, report);
      save();
      break;
    }
    if (checkpointer.due(st.step, last)) save();
    // Evaluated before the ranks compare stop requests: an early stop it asks for is agreed at once.
    const bool eval_due = evaluator.due(st.step, last);
    if (eval_due) evaluate();
    if (progress.stop_agreed(st.step, last, eval_due, control)) break;
  }
  result.steps = trainer.steps_taken();
  detail::finish_fit(options, result, report, rank0, evaluate, save, [&](const auto& p) { trainer.save_params(p); });
  return result;
}

// The same without evaluation.
template <class Trainer, BatchSource Train>
FitResult fit(Trainer& trainer, const Train& train, const FitOptions& options, const FitCallbacks& callbacks = {}) {
  return fit(trainer, train, static_cast<const NoEvalSource*>(nullptr), options, callbacks);
}

}  // namespace dtrain
