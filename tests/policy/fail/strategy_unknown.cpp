// expect: dtrain: Strategy<Kind> takes a strategy kind: DDP, FSDP<Mode>, ZeRO1, or your own tag type
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Strategy<DDP>>;
#else
using P = policies<Strategy<Host>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::param_type* param = nullptr;
