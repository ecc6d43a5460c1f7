// expect: dtrain: unknown device: Device<...> takes Host or Cuda
#include <dtrain/policy/policies.hpp>

using namespace dtrain;
#ifdef DTRAIN_CONTROL
using P = policies<Device<Cuda>>;
#else
using P = policies<Device<DDP>>;
#endif
[[maybe_unused]] constexpr int micro_batches = P::accumulate;
[[maybe_unused]] P::param_type* param = nullptr;
