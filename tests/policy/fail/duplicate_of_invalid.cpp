// expect: dtrain: policy given twice: each of Strategy, Precision, Accumulate, Device, Offload may appear at most once
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Precision<bf16>, Accumulate<2>>;
#else
using P = policies<Precision<fp16, bf16>, Accumulate<2>, Precision<bf16>, Accumulate<0>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::param_type* param = nullptr;
