// expect: dtrain: Accumulate<N> needs N >= 1: N is the number of micro-batches per optimizer step
#include <dtrain/policy/accumulate.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = Accumulate<1>;
#else
using P = Accumulate<0>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::micro_batches;
