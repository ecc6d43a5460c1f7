// expect: dtrain: Accumulate<N> needs N >= 1: N is the number of micro-batches per optimizer step
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Accumulate<1>>;
#else
using P = policies<Accumulate<0>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::param_type* param = nullptr;
