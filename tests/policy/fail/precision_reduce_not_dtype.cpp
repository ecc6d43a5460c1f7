// expect: dtrain: Precision<P, Reduce>: Reduce must be a dtype: fp32, bf16 or fp16
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Precision<bf16, float>>;
#else
using P = policies<Precision<bf16, double>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::param_type* param = nullptr;
