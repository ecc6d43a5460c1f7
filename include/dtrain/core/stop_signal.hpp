#pragma once
// The process's stop notice: the first signal a PreemptionWatch
// (run/preemption.hpp) caught, 0 if none or once the last watch is gone.
// It lives here, below comm/, so that a rank still trying to reach an
// unreachable rendezvous master (comm/store.hpp) gives up when it is told
// to stop, instead of retrying until its timeout while the launcher waits
// out its grace period.

#include <signal.h>

namespace dtrain::detail {
inline volatile sig_atomic_t preemption_signal = 0;
}  // namespace dtrain::detail
