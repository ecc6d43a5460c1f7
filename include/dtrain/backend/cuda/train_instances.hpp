#pragma once
// The CUDA backend's instance list: dtrain's built-in templates on
// dtrain::Cuda (train/builtin_templates.hpp's lists), which dtrain::runtime's
// CUDA part compiles once (DTRAIN_INSTANTIATE_CUDA, core/macros.hpp;
// cmake/dtrain_runtime_cuda.cu). A translation unit that nvcc compiles
// against dtrain::runtime takes them as `extern template`s, so neither their
// host code nor their kernels are compiled again; header-only, and in every
// g++ translation unit, the list declares nothing. Including it also
// includes the rest of the backend: the device, its communicators and
// binding, its offload copies (only in builds with CUDA: DTRAIN_HAS_CUDA).

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA

#include "dtrain/backend/cuda/comm_binding.hpp"
#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/backend/cuda/offload.hpp"
#include "dtrain/train/builtin_templates.hpp"

namespace dtrain {
DTRAIN_BUILTIN_TEMPLATES(DTRAIN_INSTANTIATE_CUDA, Cuda)
}  // namespace dtrain

#endif  // DTRAIN_HAS_CUDA
