// expect: dtrain: Precision<P, fp16> is not supported unless P is fp16: only fp16 params use loss scaling, without it
// gradients over- or underflow fp16; reduce in bf16 or fp32
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Device<Host>, Precision<bf16, bf16>>;
#else
using P = policies<Device<Host>, Precision<bf16, fp16>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::param_type* param = nullptr;
