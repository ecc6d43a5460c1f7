// dtrain::runtime's host loops (docs/building.md): the loops Host::for_each
// and Host::sum run for dtrain's built-in functors (units, losses, sequence
// and matrix kernels), each compiled once for every instruction-set level.
// The functors' headers list them, the host backend's instance list applies
// the lists (DTRAIN_INSTANTIATE_HOST_FOR_EACH,
// backend/host/train_instances.hpp); this source instantiates them, and every
// other translation unit built with separate compilation that includes the
// list (<dtrain/trainer.hpp> does) takes them as extern templates. A source
// of its own beside dtrain_runtime.cpp, so that a parallel build compiles
// the two at once.
#define DTRAIN_RUNTIME_KERNELS_SOURCE
#if !defined(DTRAIN_SEPARATE_COMPILATION)
#define DTRAIN_SEPARATE_COMPILATION 1
#endif
#if !DTRAIN_SEPARATE_COMPILATION
#error "dtrain_runtime_kernels.cpp is compiled only with DTRAIN_SEPARATE_COMPILATION=1 (link dtrain::runtime)"
#endif
#include <dtrain/backend/host/train_instances.hpp>
