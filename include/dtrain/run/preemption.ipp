// The definitions preemption.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <algorithm>
#include <cctype>

#include "dtrain/run/preemption.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL PreemptionHandlers& preemption_handlers() {
    static PreemptionHandlers h;
    return h;
  }
  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL PreemptionWatch::~PreemptionWatch() {
  auto& h = detail::preemption_handlers();
  std::lock_guard lock(h.mu);
  if (--h.watches != 0) return;
  for (std::size_t i = 0; i < h.signals.size(); ++i) ::sigaction(h.signals[i], &h.previous[i], nullptr);
  h.signals.clear();
  h.previous.clear();
  detail::preemption_signal = 0;  // no notice stands without a watch (TcpStore::connect looks at it)
}
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL PreemptionWatch::PreemptionWatch(const std::vector<int>& signals) {
  auto& h = detail::preemption_handlers();
  std::lock_guard lock(h.mu);
  if (h.watches++ == 0) detail::preemption_signal = 0;
  // While any watch lives, every watch's signals are handled: a later watch
  // adds those the earlier ones did not take (a program's start-up watch,
  // then fit's with the configured signals).
  for (const int sig : signals) {
    if (std::find(h.signals.begin(), h.signals.end(), sig) != h.signals.end()) continue;
    struct sigaction sa {};
    sa.sa_handler = detail::note_preemption;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    h.previous.emplace_back();
    ::sigaction(sig, &sa, &h.previous.back());
    h.signals.push_back(sig);
  }
}

namespace detail {
struct NamedSignal {
  const char* name;
  int number;
};
inline constexpr NamedSignal preemption_signal_table[] = {
    {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"INT", SIGINT}, {"HUP", SIGHUP}};
}  // namespace detail

DTRAIN_DECL std::vector<int> preemption_signal_numbers(const std::vector<std::string>& names) {
  std::vector<int> out;
  for (const std::string& given : names) {
    std::string name;
    for (const char ch : given) name += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (name.rfind("SIG", 0) == 0) name.erase(0, 3);
    int number = 0;
    for (const auto& s : detail::preemption_signal_table)
      if (name == s.name) number = s.number;
    if (number == 0)
      throw config_error("preempt_signals: '" + given + "' is not a signal a preemption watch takes",
                         "use TERM, USR1, USR2, INT or HUP (e.g. preempt_signals=TERM,USR2), or nothing for none");
    if (std::find(out.begin(), out.end(), number) == out.end()) out.push_back(number);
  }
  return out;
}

DTRAIN_DECL std::vector<std::string> preemption_signal_names(const std::vector<int>& signals) {
  std::vector<std::string> out;
  for (const int sig : signals) {
    std::string name = signal_name(sig);
    if (name.rfind("SIG", 0) == 0) name.erase(0, 3);
    out.push_back(name);
  }
  return out;
}
}  // namespace dtrain
DTRAIN_IMPL_END
