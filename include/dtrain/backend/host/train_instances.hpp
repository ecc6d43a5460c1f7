#pragma once
// The host backend's instance list: dtrain's built-in templates on
// dtrain::Host (train/builtin_templates.hpp's lists) and the host loops of
// the built-in functors, compiled once into dtrain::runtime under separate
// compilation (cmake/dtrain_runtime.cpp and dtrain_runtime_kernels.cpp) and
// `extern template` in every other translation unit that includes this file
// (<dtrain/trainer.hpp> does); header-only, it declares nothing. Including
// it also includes the rest of the backend: the device, its communicators
// and binding, its offload copies.

#include <cstddef>

#include "dtrain/backend/host/comm_binding.hpp"
#include "dtrain/backend/host/device.hpp"
#include "dtrain/backend/host/device_isa.hpp"
#include "dtrain/backend/host/offload.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/train/builtin_templates.hpp"

// DTRAIN_INSTANTIATE_HOST_FOR_EACH(F) and DTRAIN_INSTANTIATE_HOST_SUM(F), at
// global scope with F fully qualified: the loops that Host::for_each or
// Host::sum runs for a built-in functor F (each instruction-set level's,
// the dispatch between them and, for for_each, the threads), compiled once
// by dtrain::runtime under separate compilation (DTRAIN_INSTANTIATE_KERNEL,
// core/macros.hpp) instead of in every translation unit that trains: three
// vectorised copies of each loop were a third of a test's object code.
#if DTRAIN_HOST_ISA_DISPATCH
#define DTRAIN_HOST_ISA_LOOPS(R, loop, ...)                                                       \
  DTRAIN_INSTANTIATE_KERNEL(                                                                      \
      R ::dtrain::detail::loop##_avx2<__VA_ARGS__>(const __VA_ARGS__&, std::size_t, std::size_t)) \
  DTRAIN_INSTANTIATE_KERNEL(                                                                      \
      R ::dtrain::detail::loop##_avx512<__VA_ARGS__>(const __VA_ARGS__&, std::size_t, std::size_t))
#else
#define DTRAIN_HOST_ISA_LOOPS(R, loop, ...)
#endif
#define DTRAIN_INSTANTIATE_HOST_FOR_EACH(...)                                                                          \
  DTRAIN_INSTANTIATE_KERNEL(                                                                                           \
      void ::dtrain::detail::run_range_baseline<__VA_ARGS__>(const __VA_ARGS__&, std::size_t, std::size_t))            \
  DTRAIN_HOST_ISA_LOOPS(void, run_range, __VA_ARGS__)                                                                  \
  DTRAIN_INSTANTIATE_KERNEL(                                                                                           \
      void ::dtrain::detail::run_range<__VA_ARGS__>(const __VA_ARGS__&, std::size_t, std::size_t))                     \
  DTRAIN_INSTANTIATE_KERNEL(void ::dtrain::detail::parallel_for<__VA_ARGS__>(::dtrain::detail::HostPool*, std::size_t, \
                                                                             std::size_t, const __VA_ARGS__&))
#define DTRAIN_INSTANTIATE_HOST_SUM(...)                                                                      \
  DTRAIN_INSTANTIATE_KERNEL(                                                                                  \
      double ::dtrain::detail::sum_range_baseline<__VA_ARGS__>(const __VA_ARGS__&, std::size_t, std::size_t)) \
  DTRAIN_HOST_ISA_LOOPS(double, sum_range, __VA_ARGS__)                                                       \
  DTRAIN_INSTANTIATE_KERNEL(                                                                                  \
      double ::dtrain::detail::sum_range<__VA_ARGS__>(const __VA_ARGS__&, std::size_t, std::size_t))

namespace dtrain {
DTRAIN_BUILTIN_TEMPLATES(DTRAIN_INSTANTIATE, Host)
}  // namespace dtrain

DTRAIN_FOR_EACH_DTYPE(DTRAIN_BUILTIN_FUNCTORS, DTRAIN_INSTANTIATE_HOST_FOR_EACH, DTRAIN_INSTANTIATE_HOST_SUM)
