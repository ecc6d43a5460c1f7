// The definitions fault.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/core/fault.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::fault {
  namespace detail {

  DTRAIN_DECL State& state() {
    static State s;
    return s;
  }
  }  // namespace detail
}  // namespace dtrain::fault

namespace dtrain::fault {

DTRAIN_DECL std::optional<detail::Plan> parse(std::string_view text, int rank, int world_size) {
  const auto bad = [&](const std::string& why) -> env_error {
    std::string what = "DTRAIN_FAULT_INJECT='";
    what.append(text);
    what += "' ";
    what += why;
    return env_error(what,
                     "write <point>:<rank>:<n>[:<signal>] with point forward|backward|collective|save and "
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
    if (sig == "KILL")
      plan.signal = SIGKILL;
    else if (sig == "TERM")
      plan.signal = SIGTERM;
    else if (sig == "USR1")
      plan.signal = SIGUSR1;
    else if (sig == "USR2")
      plan.signal = SIGUSR2;
    else if (sig == "INT")
      plan.signal = SIGINT;
    else
      throw bad("names an unknown signal");
    text = text.substr(0, c3);
  }
  const std::string_view name = text.substr(0, c1);
  bool known = false;
  for (point p : {point::forward, point::backward, point::collective, point::save})
    if (name == point_name(p)) plan.where = p, known = true;
  if (!known) throw bad("names an unknown point");
  const auto who = dtrain::detail::parse_integer(text.substr(c1 + 1, c2 - c1 - 1));
  const auto nth = dtrain::detail::parse_integer(text.substr(c2 + 1));
  if (!who || *who < 0 || *who >= world_size)
    throw bad("names no rank of this job (world size " + std::to_string(world_size) + ")");
  if (!nth || *nth < 1) throw bad("needs a count n >= 1");
  plan.nth = *nth;
  if (*who != rank) return std::nullopt;
  return plan;
}

DTRAIN_DECL long long parse_delay(std::string_view text, int rank, int world_size) {
  const auto colon = text.find(':');
  const bool pair = colon != std::string_view::npos;
  const auto who = pair ? dtrain::detail::parse_integer(text.substr(0, colon)) : std::nullopt;
  const auto ms = pair ? dtrain::detail::parse_integer(text.substr(colon + 1)) : std::nullopt;
  if (!who || !ms || *who < 0 || *who >= world_size || *ms < 0)
    throw env_error("DTRAIN_FAULT_DELAY='" + std::string(text) +
                        "' is not <rank>:<ms> for a rank of this job (world size " + std::to_string(world_size) + ")",
                    "write DTRAIN_FAULT_DELAY=1:20 (rank 1 sleeps 20 ms in every forward), or unset it");
  return *who == rank ? *ms : 0;
}

DTRAIN_DECL void arm(int rank, int world_size) {
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

DTRAIN_DECL void hit(point p) {
  auto& s = detail::state();
  if (!s.armed.load(std::memory_order_relaxed)) [[likely]]
    return;
  if (p == point::forward && s.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(s.delay_ms));
  if (!s.has_plan || s.plan.where != p || s.hits.fetch_add(1) + 1 != s.plan.nth) return;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "dtrain: fault injection: %s on rank %d at %s #%lld (t=%.3f)\n",
               signal_name(s.plan.signal).c_str(), s.rank, point_name(p).data(), s.plan.nth, now);
  std::fflush(stderr);
  ::kill(::getpid(), s.plan.signal);
  if (s.plan.signal == SIGKILL) ::pause();
}
}  // namespace dtrain::fault
DTRAIN_IMPL_END
