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

// The same for a lambda's call operator: [&](int i) DTRAIN_LAMBDA_INLINE { ... }.
#if defined(__GNUC__)
#define DTRAIN_LAMBDA_INLINE __attribute__((always_inline))
#else
#define DTRAIN_LAMBDA_INLINE
#endif

// A loop driver whose callees must all be inlined into it (Host's functor
// loops, compiled once per instruction level: backend/host/device_isa.hpp).
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

// Separate compilation (CMake option DTRAIN_SEPARATE_COMPILATION, target
// dtrain::runtime), the Asio way: dtrain's non-template code lives in .ipp
// files beside the headers. Header-only (the default) includes them with
// every definition inline. With DTRAIN_SEPARATE_COMPILATION=1 the headers
// only declare that code, and the runtime library compiles it once (its one
// source defines DTRAIN_RUNTIME_SOURCE), along with the built-in strategies,
// checkpoint I/O and optimizers for the built-in devices and dtypes, which
// user translation units then take as `extern template`s instead of
// instantiating and optimising them again.
#if !defined(DTRAIN_SEPARATE_COMPILATION)
#define DTRAIN_SEPARATE_COMPILATION 0
#endif
// Header-only, that code (sockets, the store, shared-memory set-up, files,
// JSON, checkpoint indexes, TensorBoard: set-up and I/O, none of it in the
// step's loops) is compiled again in every user translation unit, and
// optimising it at -O3 was most of a program's compile time. So in an
// optimised GCC build it is compiled at -O1 instead (DTRAIN_IMPL_O1):
// DTRAIN_IMPL_BEGIN/END around each .ipp's definitions and around
// nlohmann/json (io/json.hpp), and an optimize attribute on every
// DTRAIN_DECL function, the part nvcc passes on to the host compiler (it
// drops the pragma). The kernels, the communicators' reductions and
// everything the training step runs are templates in the headers and keep
// the build's level; dtrain::runtime compiles the .ipp code at the build's
// level too. Define DTRAIN_IMPL_O1=0 to compile it all at the build's level.
#if !defined(DTRAIN_IMPL_O1)
#if !DTRAIN_SEPARATE_COMPILATION && defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#define DTRAIN_IMPL_O1 1
#else
#define DTRAIN_IMPL_O1 0
#endif
#endif
#if DTRAIN_IMPL_O1 && !defined(__CUDACC__)
#define DTRAIN_IMPL_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"O1\")")
#define DTRAIN_IMPL_END _Pragma("GCC pop_options")
#else
#define DTRAIN_IMPL_BEGIN
#define DTRAIN_IMPL_END
#endif
#if DTRAIN_SEPARATE_COMPILATION
#define DTRAIN_DECL
#elif DTRAIN_IMPL_O1
#define DTRAIN_DECL inline __attribute__((optimize("O1")))
#else
#define DTRAIN_DECL inline
#endif
// Whether this translation unit compiles the .ipp definitions: every one
// header-only, only the runtime library's with separate compilation.
#if !DTRAIN_SEPARATE_COMPILATION || defined(DTRAIN_RUNTIME_SOURCE)
#define DTRAIN_DEFINE_IMPL 1
#else
#define DTRAIN_DEFINE_IMPL 0
#endif
// Whether the built-in instantiations come from the runtime library.
#if DTRAIN_SEPARATE_COMPILATION && !defined(DTRAIN_RUNTIME_SOURCE)
#define DTRAIN_EXTERN_INSTANCES 1
#else
#define DTRAIN_EXTERN_INSTANCES 0
#endif

// DTRAIN_INSTANTIATE(class X<Host, float>): an explicit instantiation of a
// built-in template that dtrain::runtime compiles: `extern template` in a
// user translation unit under separate compilation (so it neither
// instantiates nor optimises it), `template` in the runtime's source, and
// nothing header-only. A template's header lists its built-in instances as
// an X-macro over the device (e.g. DTRAIN_DDP_TEMPLATES(X, Dev, T, R));
// train/builtin_templates.hpp gathers the lists, and each backend's
// train_instances.hpp applies them to its device (the host backend's with
// this macro).
#if DTRAIN_EXTERN_INSTANCES
#define DTRAIN_INSTANTIATE(...) extern template __VA_ARGS__;
#elif DTRAIN_SEPARATE_COMPILATION && defined(DTRAIN_RUNTIME_SOURCE)
#define DTRAIN_INSTANTIATE(...) template __VA_ARGS__;
#else
#define DTRAIN_INSTANTIATE(...)
#endif

// DTRAIN_INSTANTIATE_CUDA(class X<Cuda, float>): the same for the built-in
// templates on dtrain::Cuda, compiled once by nvcc into dtrain::runtime's
// CUDA part (cmake/dtrain_runtime_cuda.cu, built when the project enables
// CUDA, which then defines DTRAIN_RUNTIME_CUDA=1 for its users): `extern
// template` in a user translation unit that nvcc compiles, `template` in
// that source, nothing otherwise (a g++ translation unit never instantiates
// Cuda code). backend/cuda/train_instances.hpp applies the lists with it.
#if DTRAIN_SEPARATE_COMPILATION && defined(DTRAIN_RUNTIME_CUDA_SOURCE)
#define DTRAIN_INSTANTIATE_CUDA(...) template __VA_ARGS__;
#elif DTRAIN_EXTERN_INSTANCES && DTRAIN_HAS_CUDA && defined(__CUDACC__) && defined(DTRAIN_RUNTIME_CUDA) && \
    DTRAIN_RUNTIME_CUDA
#define DTRAIN_INSTANTIATE_CUDA(...) extern template __VA_ARGS__;
#else
#define DTRAIN_INSTANTIATE_CUDA(...)
#endif

// DTRAIN_INSTANTIATE_KERNEL(declaration): the same for the host loops of
// the built-in functors (DTRAIN_INSTANTIATE_HOST_FOR_EACH and _SUM,
// backend/host/train_instances.hpp), compiled once into dtrain::runtime by a
// source of their own, cmake/dtrain_runtime_kernels.cpp
// (DTRAIN_RUNTIME_KERNELS_SOURCE):
// `template` there, `extern template` in every other translation unit
// built with separate compilation (the runtime's other sources included),
// nothing header-only.
#if DTRAIN_SEPARATE_COMPILATION && defined(DTRAIN_RUNTIME_KERNELS_SOURCE)
#define DTRAIN_INSTANTIATE_KERNEL(...) template __VA_ARGS__;
#elif DTRAIN_SEPARATE_COMPILATION
#define DTRAIN_INSTANTIATE_KERNEL(...) extern template __VA_ARGS__;
#else
#define DTRAIN_INSTANTIATE_KERNEL(...)
#endif

// The (parameter, reduce) type pairs of the built-in precisions, for the
// instantiations above: X(args..., param, reduce) once per pair, the
// arguments after X first (a backend applies a template list to its
// device: DTRAIN_FOR_EACH_PRECISION(LIST, DTRAIN_INSTANTIATE, Host)).
// clang-format off: one list entry per line
#define DTRAIN_FOR_EACH_PRECISION(X, ...)    \
  X(__VA_ARGS__ __VA_OPT__(, ) float, float) \
  X(__VA_ARGS__ __VA_OPT__(, ) bf16, float)  \
  X(__VA_ARGS__ __VA_OPT__(, ) bf16, bf16)   \
  X(__VA_ARGS__ __VA_OPT__(, ) fp16, float)  \
  X(__VA_ARGS__ __VA_OPT__(, ) fp16, fp16)
// clang-format on
// The parameter types alone, the same way, qualified so that a list at
// global scope can use them too (the host loops',
// backend/host/train_instances.hpp).
#define DTRAIN_FOR_EACH_DTYPE(X, ...) \
  X(__VA_ARGS__ __VA_OPT__(, ) float) \
  X(__VA_ARGS__ __VA_OPT__(, )::dtrain::bf16) X(__VA_ARGS__ __VA_OPT__(, )::dtrain::fp16)
