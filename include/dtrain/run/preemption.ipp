// The definitions preemption.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

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
}
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL PreemptionWatch::PreemptionWatch(const std::vector<int>& signals) {
  auto& h = detail::preemption_handlers();
  std::lock_guard lock(h.mu);
  if (h.watches++ != 0) return;
  detail::preemption_signal = 0;
  h.signals = signals;
  h.previous.assign(signals.size(), {});
  for (std::size_t i = 0; i < signals.size(); ++i) {
    struct sigaction sa {};
    sa.sa_handler = detail::note_preemption;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(signals[i], &sa, &h.previous[i]);
  }
}
}  // namespace dtrain
DTRAIN_IMPL_END
