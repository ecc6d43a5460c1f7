#pragma once
// The training loop every example runs: a Trainer over the example's model
// with the config's policies, a DistributedSampler and DataLoader over its
// data set, pretrained weights (init_from), resume, checkpoints, metrics and
// the progress line. The example passes `finish(trainer)` to report its own
// evaluation at the end.

#include <dtrain/metrics/tensorboard.hpp>
#include <dtrain/trainer.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.hpp"
#include "common/report.hpp"
#include "common/strategies.hpp"

namespace examples {

// "params 1.2 MiB | grads ..." for the progress line.
inline std::string memory_text(const dtrain::MemoryUsage& m) {
  auto mib = [](std::size_t b) {
    char t[32];
    std::snprintf(t, sizeof t, "%.2f", static_cast<double>(b) / (1 << 20));
    return std::string(t);
  };
  return "params " + mib(m.params) + " | grads " + mib(m.grads) + " | optimizer " + mib(m.optimizer) + " | master " +
         mib(m.master) + " | gathered " + mib(m.gathered) + " | activations " + mib(m.activations) + " | total " +
         mib(m.total()) + " MiB";
}

// The `memory` object of a metrics record: bytes on this rank by category.
inline std::string memory_json(const dtrain::MemoryUsage& m) {
  return "{\"params\": " + std::to_string(m.params) + ", \"grads\": " + std::to_string(m.grads) +
         ", \"optimizer\": " + std::to_string(m.optimizer) + ", \"master\": " + std::to_string(m.master) +
         ", \"gathered\": " + std::to_string(m.gathered) + ", \"activations\": " + std::to_string(m.activations) +
         "}";
}

// tensorboard=DIR: a new events file in DIR. A folder it cannot write is a
// usage error, as for metrics= (the writer's error, still naming where).
inline dtrain::TensorBoardWriter open_tensorboard(const Common& c) {
  try {
    return dtrain::TensorBoardWriter(c.tensorboard);
  } catch (const dtrain::error& e) {
    throw dtrain::config_error(e.problem(), e.fix(), e.where());
  }
}

// The metrics record's values as TensorBoard scalars (float32 there).
inline void write_tensorboard(dtrain::TensorBoardWriter& tb, const dtrain::StepStats& st, double samples_per_s,
                              double tokens_per_s) {
  const auto bytes = [](std::size_t b) { return static_cast<double>(b); };
  const dtrain::MemoryUsage& m = st.memory;
  tb.write_scalars(st.step, {{"train/loss", st.loss},
                             {"train/lr", st.lr},
                             {"train/grad_norm", st.grad_norm},
                             {"train/loss_scale", st.loss_scale},
                             {"perf/samples_per_s", samples_per_s},
                             {"perf/tokens_per_s", tokens_per_s},
                             {"perf/step_ms", st.step_ms},
                             {"memory/params_bytes", bytes(m.params)},
                             {"memory/grads_bytes", bytes(m.grads)},
                             {"memory/optimizer_bytes", bytes(m.optimizer)},
                             {"memory/master_bytes", bytes(m.master)},
                             {"memory/gathered_bytes", bytes(m.gathered)},
                             {"memory/activations_bytes", bytes(m.activations)}});
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

// resume=latest|DIR: restores trainer and sampler. With latest, a checkpoint
// that fails verification is reported and the one before it tried: a
// damaged newest checkpoint costs the steps since the previous one, not the
// run. Returns whether anything was loaded.
template <class Trainer>
bool resume(const Common& c, dtrain::World& world, Trainer& trainer, dtrain::DistributedSampler& sampler) {
  std::vector<std::filesystem::path> candidates;
  if (c.resume == "latest") {
    candidates = dtrain::list_checkpoints(c.checkpoint_dir);
    std::ranges::reverse(candidates);
    if (candidates.empty()) {
      if (world.rank() == 0)
        std::printf("resume=latest: no checkpoint in %s yet: starting from step 0\n", c.checkpoint_dir.c_str());
      return false;
    }
  } else {
    candidates.emplace_back(c.resume);
  }
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    try {
      const auto info = trainer.load(candidates[i]);
      if (info.sampler) sampler.load_state(info.sampler->state_for(sampler));
      if (world.rank() == 0)
        std::printf("resumed from %s at step %lld (saved by %d rank(s), strategy %s)\n", candidates[i].c_str(),
                    static_cast<long long>(info.step), info.world_size, info.strategy.c_str());
      return true;
    } catch (const dtrain::checkpoint_error& e) {
      if (i + 1 == candidates.size()) throw;
      if (world.rank() == 0) std::printf("resume: skipping %s: %s\n", candidates[i].c_str(), e.what());
    }
  }
  return false;
}

// Saves <checkpoint_dir>/step-<n> (unless a run before a restart already
// did), then keeps the newest keep_last.
template <class Trainer>
void save(const Common& c, dtrain::World& world, Trainer& trainer, const dtrain::DistributedSampler& sampler) {
  const auto dir = dtrain::checkpoint_path(c.checkpoint_dir, trainer.steps_taken());
  if (dtrain::is_checkpoint(dir)) return;
  trainer.save(dir, {.consolidated = c.consolidated, .sampler = &sampler});
  if (world.rank() != 0) return;
  if (c.keep_last > 0) dtrain::prune_checkpoints(c.checkpoint_dir, c.keep_last);
  std::printf("saved checkpoint %s\n", dir.c_str());
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
        const auto type = t.type == dtrain::element_type::f32    ? dtrain::safetensors_dtype::f32
                          : t.type == dtrain::element_type::bf16 ? dtrain::safetensors_dtype::bf16
                          : t.type == dtrain::element_type::f16  ? dtrain::safetensors_dtype::f16
                          : t.type == dtrain::element_type::i32  ? dtrain::safetensors_dtype::i32
                          : t.type == dtrain::element_type::i64  ? dtrain::safetensors_dtype::i64
                                                                 : dtrain::safetensors_dtype::u8;
        writer.add(std::to_string(first_step + static_cast<std::int64_t>(s)) + "." + std::to_string(k) + "." + name,
                   type, t.shape, t.bytes);
      }
  writer.write(fs::path(c.dump_batches) / ("rank-" + std::to_string(world.rank()) + ".safetensors"));
}

// Everything after the Trainer's construction: resume, the steps, the end.
// start(trainer) runs first (train_lm's pretrained weights), before
// init_from and resume; finish(trainer) after the last step.
template <class Trainer, class Source, class Start, class Finish>
void train_loop(const Common& c, dtrain::World& world, Trainer& trainer, const Source& data, Start& start,
                Finish& finish) {
  dtrain::DistributedSampler sampler(data.size(), world, {.shuffle = true, .seed = c.seed});
  start(trainer);
  if (!c.init_from.empty()) init_from(c, world, trainer);
  const bool resumed = !c.resume.empty() && resume(c, world, trainer, sampler);
  // The loader starts where the (restored) sampler stands.
  dtrain::DataLoader loader(data, sampler, {.batch_size = c.batch_size, .num_workers = c.num_workers});
  // The events file first: it is a new file, while opening the metrics file
  // may truncate one, so a bad tensorboard= leaves that as it was.
  std::optional<dtrain::TensorBoardWriter> tensorboard;
  if (world.rank() == 0 && !c.tensorboard.empty()) tensorboard = open_tensorboard(c);
  std::ofstream metrics;
  if (world.rank() == 0 && !c.metrics.empty()) {
    // A resumed run appends: the records before the restart stay. Its
    // folder is made as checkpoint_dir's is.
    const std::filesystem::path folder = std::filesystem::path(c.metrics).parent_path();
    std::error_code ignored;  // a failure shows as the open's below
    if (!folder.empty()) std::filesystem::create_directories(folder, ignored);
    metrics.open(c.metrics, resumed ? std::ios::app : std::ios::trunc);
    metrics.precision(10);
    if (!metrics)
      throw dtrain::config_error("cannot write the metrics file '" + c.metrics + "'",
                                 "check that its folder exists and is writable");
  }
  // TensorBoard drops what earlier files in the folder hold from the run's
  // first step on: a resumed job's killed attempt, an earlier run into the
  // same folder. Written once both files are open.
  if (tensorboard) tensorboard->write_session_start(trainer.steps_taken() + 1);
  const std::string_view strategy = trainer.strategy_name();
  std::vector<dtrain::Batch> micro(static_cast<std::size_t>(c.accumulate));
  std::vector<std::vector<dtrain::Batch>> trained;  // dump_batches only
  const std::int64_t first_step = trainer.steps_taken() + 1;
  // Stored parameters: a tied weight once (GPT-2's embedding is its head).
  const std::size_t params = trainer.layout().trainable_numel() + trainer.layout().frozen_numel();
  for (std::int64_t s = trainer.steps_taken(); s < c.steps; ++s) {
    for (auto& b : micro) b = loader.next();
    const auto st = trainer.step(micro);
    if (!c.dump_batches.empty()) trained.push_back(micro);
    const double seconds = st.step_ms / 1000.0;
    const double sps = st.samples / seconds, tps = st.positions / seconds;
    if (c.save_every > 0 && (st.step % c.save_every == 0 || s + 1 == c.steps)) save(c, world, trainer, sampler);
    if (world.rank() != 0) continue;
    if (metrics.is_open())
      metrics << "{\"step\": " << st.step << ", \"loss\": " << st.loss << ", \"lr\": " << st.lr
              << ", \"grad_norm\": " << st.grad_norm << ", \"samples_per_s\": " << sps
              << ", \"tokens_per_s\": " << tps << ", \"step_ms\": " << st.step_ms
              << ", \"world_size\": " << world.size() << ", \"loss_scale\": " << st.loss_scale
              << ", \"skipped\": " << (st.skipped ? "true" : "false") << ", \"memory\": " << memory_json(st.memory)
              << "}\n";
    if (tensorboard) write_tensorboard(*tensorboard, st, sps, tps);
    if (st.step == 1)
      std::printf("memory per rank (%.*s, rank 0): %s\n", static_cast<int>(strategy.size()), strategy.data(),
                  memory_text(st.memory).c_str());
    if (st.step == 1 || st.step % c.log_every == 0 || s + 1 == c.steps) {
      std::printf("step %5lld/%lld | loss %.4f | lr %.2e | %8.0f samples/s | step %7.2f ms | scale %g%s",
                  static_cast<long long>(st.step), static_cast<long long>(c.steps), st.loss, st.lr, sps, st.step_ms,
                  st.loss_scale, st.skipped ? " | skipped (inf/nan)" : "");
      if (st.positions != st.samples) std::printf(" | %9.0f tokens/s", tps);
      if (c.peak_tflops > 0) {
        // The usual estimate of training FLOPs: 6 per parameter and token
        // (2 forward, 4 backward), attention's own products left out.
        const double tflops = 6.0 * static_cast<double>(params) * tps / world.size() / 1e12;
        std::printf(" | %.2f TFLOP/s/rank | MFU %.1f%%", tflops, 100.0 * tflops / c.peak_tflops);
      }
      std::printf("\n");
    }
  }
  finish(trainer);
  if (world.rank() == 0) {
    // The process's peak resident set: what the operating system saw,
    // beside the Trainer's own accounting above.
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    std::printf("peak resident memory (rank 0): %.1f MiB\n", static_cast<double>(usage.ru_maxrss) / 1024.0);
  }
  if (!c.dump_batches.empty()) dump_batches(c, world, trained, first_step);
  if (!c.save_params.empty()) trainer.save_params(c.save_params);
  std::fflush(stdout);
}

// The config's strategy and micro-batch count are run-time choices: one
// TrainerCore per (model, device, precision) serves them all.
template <class Dev, class Prec, class Model, class Source, class Start, class Finish>
int run_training(const Common& c, dtrain::World& world, Model& model, const Source& data, Start&& start,
                 Finish&& finish) {
  const dtrain::TrainerOptions opts = trainer_options(c);
  auto run = [&](auto optimizer) {
    dtrain::TrainerCore<Model, Dev, Prec> trainer(world, model, optimizer, opts, c.accumulate,
                                                  strategy_for<Dev, Prec>(c));
    try {
      train_loop(c, world, trainer, data, start, finish);
    } catch (const std::exception& e) {
      report_failure(e);  // while the communicator stands: see common/report.hpp
      throw;
    }
  };
  if (c.optimizer == "sgd")
    run(dtrain::SGD{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
  else
    run(dtrain::AdamW{.lr = c.lr, .weight_decay = c.weight_decay});
  return 0;
}

template <class Dev, class Prec, class Model, class Source, class Finish>
int run_training(const Common& c, dtrain::World& world, Model& model, const Source& data, Finish&& finish) {
  return run_training<Dev, Prec>(c, world, model, data, [](auto&) {}, finish);
}

}  // namespace examples
