// expect: dtrain: unknown policy type: expected Strategy<...>, Precision<...>, Accumulate<N>, Device<...> or
// Offload<...>
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Accumulate<2>, Precision<bf16>>;
#else
using P = policies<Accumulate<2>, bf16>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::param_type* param = nullptr;
