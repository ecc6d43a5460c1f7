#pragma once
// Preemption: schedulers give notice before they take a node away (Slurm's
// `--signal=USR1@90` and then SIGTERM, Kubernetes' SIGTERM and grace period,
// spot instances' two-minute warning). PreemptionWatch turns those signals
// into a flag; dtrain::fit passes it into the next step's scalar all-reduce
// (TrainerCore::request_stop), so every rank learns in the same step that
// some rank was told to go, finishes that step, saves a checkpoint and
// returns with FitResult::preempted. A program then exits with
// preempted_exit_code, which dtrain-run passes on and the docs' sbatch and
// Kubernetes recipes treat as "requeue"; resumed with resume=latest, the run
// continues bit-identically.
//
//   dtrain::PreemptionWatch watch({SIGTERM, SIGUSR1});
//   ... watch.signalled() ...   // the first signal seen, 0 if none
//
// The handler only stores the signal number (async-signal-safe); the
// previous handlers come back when the last watch is destroyed.

#include <signal.h>

#include <mutex>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/stop_signal.hpp"

namespace dtrain {

// sysexits' EX_TEMPFAIL: "try again later". What a preempted rank exits
// with, and dtrain-run with it.
inline constexpr int preempted_exit_code = 75;

namespace detail {
// Stores the signal in preemption_signal (core/stop_signal.hpp).
extern "C" inline void note_preemption(int sig) {
  if (preemption_signal == 0) preemption_signal = sig;
}

// The handlers are process-wide: the first watch installs them, the last one
// gone restores what was there (ranks run as threads of one process share them).
struct PreemptionHandlers {
  std::mutex mu;
  int watches = 0;
  std::vector<int> signals;
  std::vector<struct sigaction> previous;
};
DTRAIN_DECL PreemptionHandlers& preemption_handlers();
}  // namespace detail

class PreemptionWatch {
 public:
  DTRAIN_DECL explicit PreemptionWatch(const std::vector<int>& signals);
  PreemptionWatch(const PreemptionWatch&) = delete;
  PreemptionWatch& operator=(const PreemptionWatch&) = delete;
  DTRAIN_DECL ~PreemptionWatch();

  // The first watched signal received since the first watch began, 0 if none.
  int signalled() const { return detail::preemption_signal; }
};

// The signals a watch can take, by name (TERM, USR1, USR2, INT, HUP, with or
// without SIG, any case): what the config key `preempt_signals` reads.
// Throws config_error naming an unknown one.
DTRAIN_DECL std::vector<int> preemption_signal_numbers(const std::vector<std::string>& names);
// The names of `signals` as preemption_signal_numbers reads them.
DTRAIN_DECL std::vector<std::string> preemption_signal_names(const std::vector<int>& signals);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/preemption.ipp"
#endif
