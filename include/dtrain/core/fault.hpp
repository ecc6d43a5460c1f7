#pragma once
// Fault injection: the reliability harness (tests/reliability/) kills a rank
// with SIGKILL at a chosen point of its run, so that the others' and the
// launcher's handling of a dead rank can be tested at every stage of a step.
//
//   DTRAIN_FAULT_INJECT=<point>:<rank>:<n>[:<signal>]
//
// makes rank <rank> kill itself with SIGKILL the <n>-th time (from 1) it
// reaches <point>, or, with a signal named (TERM, USR1, USR2, INT), send
// itself that signal instead (the preemption notice a scheduler gives):
//   forward     after the first unit's forward of a micro-batch
//   backward    after the last unit's backward of a micro-batch (the first
//               one backward reaches)
//   collective  as a host collective starts executing on the progress thread
//               (the peers are in it, waiting for this rank)
//   save        during Trainer::save, after this rank's shard file is written
//               and before the checkpoint's index (its commit) is
// It fires only in the first attempt of a job (DTRAIN_RESTART_COUNT unset or
// 0), so a run restarted by `dtrain-run --max-restarts` continues cleanly.
// Before dying it prints one line to stderr with the wall-clock time, which
// the harness uses to time how fast the job ends.
//
// DTRAIN_FAULT_DELAY=<rank>:<ms> makes rank <rank> sleep <ms> milliseconds
// each time it reaches `forward` (every micro-batch, every attempt): a slow
// rank, for the straggler report to find.
//
// dtrain::init() arms it (a malformed value is a launch_error there); an
// unarmed point costs one relaxed atomic load.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/parse.hpp"

namespace dtrain::fault {

enum class point { forward, backward, collective, save };

inline constexpr std::string_view point_name(point p) {
  switch (p) {
    case point::forward: return "forward";
    case point::backward: return "backward";
    case point::collective: return "collective";
    case point::save: return "save";
  }
  return "?";
}

namespace detail {

struct Plan {
  point where = point::forward;
  long long nth = 0;
  int signal = SIGKILL;
};

struct State {
  std::atomic<bool> armed{false};
  bool has_plan = false;
  Plan plan;
  int rank = 0;
  std::atomic<long long> hits{0};
  long long delay_ms = 0;  // DTRAIN_FAULT_DELAY for this rank
};

DTRAIN_DECL State& state();

}  // namespace detail

// Parses DTRAIN_FAULT_INJECT's value; returns the plan if it names this rank.
DTRAIN_DECL std::optional<detail::Plan> parse(std::string_view text, int rank, int world_size);

// Reads DTRAIN_FAULT_DELAY's value; the delay in ms if it names this rank.
DTRAIN_DECL long long parse_delay(std::string_view text, int rank, int world_size);

// Reads DTRAIN_FAULT_INJECT (and DTRAIN_RESTART_COUNT) and DTRAIN_FAULT_DELAY for this rank.
DTRAIN_DECL void arm(int rank, int world_size);

// A point of the run; kills this process if the armed plan says so.
DTRAIN_DECL void hit(point p);

}  // namespace dtrain::fault

#if DTRAIN_DEFINE_IMPL
#include "dtrain/core/fault.ipp"
#endif
