// expect: dtrain: Precision<fp16, bf16> is not supported: bf16 keeps fewer mantissa bits than fp16 and loss-scaled fp16
// gradients fit fp16; reduce in fp16 or fp32
#include <dtrain/policy/precision.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = Precision<fp16>;
#else
using P = Precision<fp16, bf16>;
#endif
[[maybe_unused]] P::reduce_type* reduce = nullptr;
