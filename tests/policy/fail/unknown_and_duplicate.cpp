// expect: dtrain: unknown policy type: expected Strategy<...>, Precision<...>, Accumulate<N>, Device<...> or
// Offload<...>
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Strategy<DDP>>;
#else
using P = policies<Strategy<DDP>, int, Strategy<DDP>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::param_type* param = nullptr;
