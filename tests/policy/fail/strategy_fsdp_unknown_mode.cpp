// expect: dtrain: unknown FSDP mode: FSDP<...> takes FullShard, ShardGradOp, NoShard or HybridShard
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Strategy<FSDP<ShardGradOp>>>;
#else
using P = policies<Strategy<FSDP<DDP>>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::strategy* strategy = nullptr;
