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

inline State& state() {
  static State s;
  return s;
}

}  // namespace detail

// Parses DTRAIN_FAULT_INJECT's value; returns the plan if it names this rank.
inline std::optional<detail::Plan> parse(std::string_view text, int rank, int world_size) {
  const auto bad = [&](const std::string& why) -> env_error {
    std::string what = "DTRAIN_FAULT_INJECT='";
    what.append(text);
    what += "' ";
    what += why;
    return env_error(what, "write <point>:<rank>:<n>[:<signal>] with point forward|backward|collective|save and "
                           "signal KILL (the default), TERM, USR1, USR2 or INT, e.g. DTRAIN_FAULT_INJECT=backward:1:3, "
                           "or unset it");
  };
  const auto c1 = text.find(':');
  const auto c2 = c1 == std::string_view::npos ? c1 : text.find(':', c1 + 1);
  if (c2 == std::string_view::npos) throw bad("is not <point>:<rank>:<n>");
  const auto c3 = text.find(':', c2 + 1);
  detail::Plan plan;
  if (c3 != std::string_view::npos) {
    const std::string_view sig = text.substr(c3 + 1);
    if (sig == "KILL") plan.signal = SIGKILL;
    else if (sig == "TERM") plan.signal = SIGTERM;
    else if (sig == "USR1") plan.signal = SIGUSR1;
    else if (sig == "USR2") plan.signal = SIGUSR2;
    else if (sig == "INT") plan.signal = SIGINT;
    else throw bad("names an unknown signal");
    text = text.substr(0, c3);
  }
  const std::string_view name = text.substr(0, c1);
  bool known = false;
  for (point p : {point::forward, point::backward, point::collective, point::save})
    if (name == point_name(p)) plan.where = p, known = true;
  if (!known) throw bad("names an unknown point");
  const auto who = dtrain::detail::parse_integer(text.substr(c1 + 1, c2 - c1 - 1));
  const auto nth = dtrain::detail::parse_integer(text.substr(c2 + 1));
  if (!who || *who < 0 || *who >= world_size) throw bad("names no rank of this job (world size " + std::to_string(world_size) + ")");
  if (!nth || *nth < 1) throw bad("needs a count n >= 1");
  plan.nth = *nth;
  if (*who != rank) return std::nullopt;
  return plan;
}

// Reads DTRAIN_FAULT_DELAY's value; the delay in ms if it names this rank.
inline long long parse_delay(std::string_view text, int rank, int world_size) {
  const auto colon = text.find(':');
  const auto who = colon == std::string_view::npos ? std::nullopt : dtrain::detail::parse_integer(text.substr(0, colon));
  const auto ms = colon == std::string_view::npos ? std::nullopt : dtrain::detail::parse_integer(text.substr(colon + 1));
  if (!who || !ms || *who < 0 || *who >= world_size || *ms < 0)
    throw env_error("DTRAIN_FAULT_DELAY='" + std::string(text) + "' is not <rank>:<ms> for a rank of this job (world size " +
                        std::to_string(world_size) + ")",
                    "write DTRAIN_FAULT_DELAY=1:20 (rank 1 sleeps 20 ms in every forward), or unset it");
  return *who == rank ? *ms : 0;
}

// Reads DTRAIN_FAULT_INJECT (and DTRAIN_RESTART_COUNT) and DTRAIN_FAULT_DELAY for this rank.
inline void arm(int rank, int world_size) {
  auto& s = detail::state();
  if (const char* delay = std::getenv("DTRAIN_FAULT_DELAY"); delay != nullptr && *delay != '\0') {
    s.delay_ms = parse_delay(delay, rank, world_size);
    s.rank = rank;
    if (s.delay_ms > 0) s.armed.store(true, std::memory_order_release);
  }
  const char* text = std::getenv("DTRAIN_FAULT_INJECT");
  if (text == nullptr || *text == '\0') return;
  const auto plan = parse(text, rank, world_size);
  const char* restart = std::getenv("DTRAIN_RESTART_COUNT");
  if (!plan || (restart != nullptr && std::string_view(restart) != "0")) return;
  s.plan = *plan;
  s.has_plan = true;
  s.rank = rank;
  s.hits.store(0);
  s.armed.store(true, std::memory_order_release);
}

// A point of the run; kills this process if the armed plan says so.
inline void hit(point p) {
  auto& s = detail::state();
  if (!s.armed.load(std::memory_order_relaxed)) [[likely]]
    return;
  if (p == point::forward && s.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(s.delay_ms));
  if (!s.has_plan || s.plan.where != p || s.hits.fetch_add(1) + 1 != s.plan.nth) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "dtrain: fault injection: %s on rank %d at %s #%lld (t=%.3f)\n",
               signal_name(s.plan.signal).c_str(), s.rank, point_name(p).data(), s.plan.nth, now);
  std::fflush(stderr);
  ::kill(::getpid(), s.plan.signal);
  if (s.plan.signal == SIGKILL) ::pause();
}

}  // namespace dtrain::fault
