// expect: dtrain: a strategy kind is not a policy by itself: wrap it, as in Strategy<FSDP<FullShard>>
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Precision<bf16>, Strategy<ZeRO1>>;
#else
using P = policies<Precision<bf16>, ZeRO1>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::strategy* strategy = nullptr;
