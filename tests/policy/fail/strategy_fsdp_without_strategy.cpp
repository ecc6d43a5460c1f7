// expect: dtrain: a strategy kind is not a policy by itself: wrap it, as in Strategy<FSDP<FullShard>>
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Strategy<FSDP<HybridShard>>, Accumulate<4>>;
#else
using P = policies<FSDP<HybridShard>, Accumulate<4>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::strategy* strategy = nullptr;
