#pragma once
// The training loop every example runs: dtrain::fit over a Trainer of the
// example's model with the config's policies. Here only what fit does not
// do: pretrained weights (init_from), recording the batches (dump_batches),
// and the example's own report at the end (`finish(trainer)`).

#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/report.hpp"
#include "common/strategies.hpp"

#include <dtrain/run/fit.hpp>
#include <dtrain/trainer.hpp>

namespace examples {

// The config's keys as fit's options.
inline dtrain::FitOptions fit_options(const Common& c) {
  return {.steps = c.steps,
          .batch_size = c.batch_size,
          .num_workers = c.num_workers,
          .seed = c.seed,
          .checkpoint_dir = c.checkpoint_dir,
          .save_every = c.save_every,
          .save_final = c.save_every > 0,
          .keep_last = c.keep_last,
          .consolidated = c.consolidated,
          .resume = c.resume,
          .on_save_error = c.on_save_error,
          .on_nonfinite = c.on_nonfinite == dtrain::nonfinite_policy::rollback ? dtrain::nonfinite_policy::rollback
                                                                               : dtrain::nonfinite_policy::stop,
          .log_every = c.log_every,
          .metrics_file = c.metrics,
          .tensorboard_dir = c.tensorboard,
          .peak_tflops = c.peak_tflops,
          .save_params = c.save_params,
          .preempt_signals = dtrain::preemption_signal_numbers(c.preempt_signals),
          .straggler_factor = c.straggler_factor};
}

// init_from=FILE: initial weights from a safetensors file (strict unless
// init_strict=false, which loads what matches and lists the rest).
template <class Trainer>
void init_from(const Common& c, dtrain::World& world, Trainer& trainer) {
  const auto r = trainer.load_params(c.init_from, {.strict = c.init_strict});
  if (world.rank() != 0) return;
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  std::printf("init_from %s: loaded %zu tensor(s)", c.init_from.c_str(), r.loaded.size());
  if (!r.missing.empty()) std::printf("; left as initialised: %s", list(r.missing).c_str());
  if (!r.unexpected.empty()) std::printf("; ignored: %s", list(r.unexpected).c_str());
  if (!r.mismatched.empty()) std::printf("; mis-shaped: %s", list(r.mismatched).c_str());
  std::printf("\n");
}

// dump_batches=DIR: the micro-batches this rank trained on, as
// DIR/rank-<r>.safetensors with tensors "<step>.<micro>.<name>" (steps from
// 1), so a run can be replayed by another implementation (tests/examples/
// parity.py replays it in PyTorch).
inline void dump_batches(const Common& c, dtrain::World& world, const std::vector<std::vector<dtrain::Batch>>& steps,
                         std::int64_t first_step) {
  namespace fs = std::filesystem;
  fs::create_directories(c.dump_batches);
  dtrain::SafetensorsWriter writer;
  for (std::size_t s = 0; s < steps.size(); ++s)
    for (std::size_t k = 0; k < steps[s].size(); ++k)
      for (const auto& [name, t] : steps[s][k].tensors) {
        const auto type = t.type == dtrain::element_type::f32    ? dtrain::element_type::f32
                          : t.type == dtrain::element_type::f64  ? dtrain::element_type::f64
                          : t.type == dtrain::element_type::bf16 ? dtrain::element_type::bf16
                          : t.type == dtrain::element_type::f16  ? dtrain::element_type::f16
                          : t.type == dtrain::element_type::i32  ? dtrain::element_type::i32
                          : t.type == dtrain::element_type::i64  ? dtrain::element_type::i64
                                                                 : dtrain::element_type::u8;
        writer.add(std::to_string(first_step + static_cast<std::int64_t>(s)) + "." + std::to_string(k) + "." + name,
                   type, t.shape, t.bytes);
      }
  writer.write(fs::path(c.dump_batches) / ("rank-" + std::to_string(world.rank()) + ".safetensors"));
}

// Everything after the Trainer's construction. start(trainer) runs first
// (train_lm's pretrained weights), before init_from and fit; finish(trainer)
// after the last step. `extra`: the example's own fit callbacks (a step's,
// a save's), run beside the loop's.
// Returns main's exit code: 75 after a preemption (the checkpoint is saved;
// dtrain-run and the requeue recipes pass it on), else 0.
template <class Trainer, class Source, class Start, class Finish>
int train_loop(const Common& c, dtrain::World& world, Trainer& trainer, const Source& data, Start& start,
               Finish& finish, const dtrain::FitCallbacks& extra = {}) {
  start(trainer);
  if (!c.init_from.empty()) init_from(c, world, trainer);
  dtrain::FitOptions options = fit_options(c);
  const std::string save_params = options.save_params.string();
  options.save_params.clear();  // after finish, below
  dtrain::FitCallbacks callbacks = extra;
  std::vector<std::vector<dtrain::Batch>> trained;  // dump_batches only
  std::int64_t first_step = 0;
  if (!c.dump_batches.empty())
    callbacks.on_batches = [&, theirs = extra.on_batches](std::int64_t step, std::span<const dtrain::Batch> micro) {
      if (theirs) theirs(step, micro);
      if (trained.empty()) first_step = step;
      trained.emplace_back(micro.begin(), micro.end());
    };
  const dtrain::FitResult result = dtrain::fit(trainer, data, options, callbacks);
  if (result.preempted) return result.exit_code();  // the rest after the requeued run's last step
  finish(trainer);
  if (!c.dump_batches.empty()) dump_batches(c, world, trained, first_step);
  if (!save_params.empty()) trainer.save_params(save_params);
  std::fflush(stdout);
  return 0;
}

// The config's strategy and micro-batch count are run-time choices: one
// TrainerCore per (model, device, precision) serves them all.
template <class Dev, class Prec, class Model, class Source, class Start, class Finish>
int run_training(const Common& c, dtrain::World& world, Model& model, const Source& data, Start&& start,
                 Finish&& finish, const dtrain::FitCallbacks& extra = {}) {
  const dtrain::TrainerOptions opts = trainer_options(c);
  auto run = [&](auto optimizer) {
    dtrain::TrainerCore<Model, Dev, Prec> trainer(world, model, optimizer, opts, c.accumulate,
                                                  strategy_for<Dev, Prec>(c));
    try {
      return train_loop(c, world, trainer, data, start, finish, extra);
    } catch (const std::exception& e) {
      report_failure(e);  // while the communicator stands: see common/report.hpp
      throw;
    }
  };
  if (c.optimizer == "sgd") return run(dtrain::SGD{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
  if (c.optimizer == "lion") return run(dtrain::Lion{.lr = c.lr, .weight_decay = c.weight_decay});
  return run(dtrain::AdamW{.lr = c.lr, .weight_decay = c.weight_decay});
}

template <class Dev, class Prec, class Model, class Source, class Finish>
int run_training(const Common& c, dtrain::World& world, Model& model, const Source& data, Finish&& finish) {
  return run_training<Dev, Prec>(
      c, world, model, data, [](auto&) {}, finish);
}

}  // namespace examples
