// expect: dtrain: FullShard, ShardGradOp, NoShard and HybridShard are FSDP modes: write Strategy<FSDP<Mode>>
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Strategy<FSDP<FullShard>>, Accumulate<2>>;
#else
using P = policies<Strategy<FullShard>, Accumulate<2>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::strategy* strategy = nullptr;
