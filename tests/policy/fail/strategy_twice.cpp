// expect: dtrain: policy given twice: each of Strategy, Precision, Accumulate, Device, Offload may appear at most once
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Strategy<FSDP<FullShard>>>;
#else
using P = policies<Strategy<FSDP<FullShard>>, Strategy<ZeRO1>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::strategy* strategy = nullptr;
