// The one translation unit that compiles dtrain's cuDNN fused attention
// (include/dtrain/device/cudnn_attention.ipp): the dtrain_cudnn library in
// dtrain's build, the dtrain::cudnn target's source in an installed package.
// Everything here builds and looks up cuDNN graphs, once per shape and then
// from a cache, and the cudnn-frontend headers it includes are large: in an
// optimised GCC build it compiles at -O1 (87 -> 47 s and 2.5 -> 2.1 GB of the
// compiler's memory on a 2-core machine), the same as header-only dtrain's
// set-up code (DTRAIN_IMPL_O1). Define DTRAIN_CUDNN_O1=0 for the build's level.
#if !defined(DTRAIN_CUDNN_O1)
#define DTRAIN_CUDNN_O1 1
#endif
#if DTRAIN_CUDNN_O1 && defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#pragma GCC optimize("O1")
#endif
#include <dtrain/device/cudnn_attention.ipp>
