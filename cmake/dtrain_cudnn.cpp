// The one translation unit that compiles dtrain's cuDNN fused attention
// (include/dtrain/device/cudnn_attention.ipp): the dtrain_cudnn library in
// dtrain's build, the dtrain::cudnn target's source in an installed package.
#include <dtrain/device/cudnn_attention.ipp>
