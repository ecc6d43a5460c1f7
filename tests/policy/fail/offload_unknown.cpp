// expect: dtrain: Offload<...> takes OptimizerState or ParamShards
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Offload<OptimizerState>>;
#else
using P = policies<Offload<DDP>>;
#endif
[[maybe_unused]] constexpr offload_kind kind = P::offload;
[[maybe_unused]] P::param_type* param = nullptr;
