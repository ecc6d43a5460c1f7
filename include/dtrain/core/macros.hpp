#pragma once
// The one place dtrain spells compiler-specific annotations. Everything else
// uses these, so every header also compiles as plain C++ with g++.

#if defined(__CUDACC__)
#define DTRAIN_HOST_DEVICE __host__ __device__
#define DTRAIN_DEVICE __device__
#else
#define DTRAIN_HOST_DEVICE
#define DTRAIN_DEVICE
#endif

// Element functions called inside functor loops must be inlined for the loop
// to vectorise; GCC's size heuristics decline that for larger bodies in big
// translation units, so those functions insist.
#if defined(__GNUC__)
#define DTRAIN_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define DTRAIN_ALWAYS_INLINE inline
#endif

// A loop driver whose callees must all be inlined into it (Host's functor
// loops, compiled once per instruction level: device/host_isa.hpp).
#if defined(__GNUC__)
#define DTRAIN_FLATTEN __attribute__((flatten))
#else
#define DTRAIN_FLATTEN
#endif

// DTRAIN_HAS_CUDA is set by the dtrain::dtrain CMake target when the CUDA
// toolkit and NCCL were found; code that needs the CUDA runtime (host API only)
// is guarded by it. Kernels additionally need __CUDACC__ (nvcc).
#if !defined(DTRAIN_HAS_CUDA)
#define DTRAIN_HAS_CUDA 0
#endif
