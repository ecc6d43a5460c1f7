#pragma once
// What train_mlp, train_gpt, train_policy and train_lm share: the keys every
// example takes (strategy, precision, accumulation, optimizer, checkpoints,
// ...: dtrain::models::RunConfig), the TrainerOptions they make, and joining
// the job. Each example adds its own keys on top (examples/<name>/...:
// struct Config : dtrain::models::MlpConfig, ...).
//
// This header is free of yaml-cpp: nvcc compiles the CUDA training code that
// includes it (examples/common/cli.hpp parses, in g++-only files).

#include <signal.h>

#include <cstdio>

#include <dtrain/models/run_config.hpp>
#include <dtrain/run/preemption.hpp>
#include <dtrain/trainer.hpp>

namespace examples {

// The library's, whose defaults dtrain-estimate --config reads too.
using Common = dtrain::models::RunConfig;
using dtrain::models::trainer_options;

// Joins the job (dtrain::init) with the config's collective timeout, which
// wins over DTRAIN_COMM_TIMEOUT_S.
inline dtrain::World init_world(const Common& c) {
  // [snippet:preemption_start_up]
  // Preemption notices from here on are kept for dtrain::fit (which stops
  // after its first step, saves and returns preempted) instead of ending
  // the rank while it starts up: loading data, building the model. Never
  // destroyed, so a notice that comes as the program exits, its work done,
  // does not end it by the signal either. The signals are the ones fit watches.
  [[maybe_unused]] static const auto* start_up =
      new dtrain::PreemptionWatch(dtrain::preemption_signal_numbers(c.preempt_signals));
  // [/snippet:preemption_start_up]
  // Log lines reach the launcher (a pipe) and any file the job is redirected
  // to as they are printed, not when a 4 KiB buffer fills or the rank exits.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  dtrain::LaunchEnv env = dtrain::discover_env();
  if (c.timeout_s > 0) env.comm_timeout_s = c.timeout_s;
  return dtrain::init(env);
}

}  // namespace examples
