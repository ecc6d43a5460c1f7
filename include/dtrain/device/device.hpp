#pragma once
// The compute-device concept. Host (OpenBLAS, host loops) and Cuda (cuBLAS,
// kernels launched over the same functors) both satisfy it, so units,
// optimizers and strategies are written once.

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace dtrain {

template <class D>
concept Device = requires(D& d, const float* cx, float* x, std::size_t n) {
  { D::name } -> std::convertible_to<const char*>;
  typename D::template buffer<float>;
  d.synchronize();
  d.copy_to_host(x, cx, n);    // device -> host, blocking
  d.copy_from_host(x, cx, n);  // host -> device
  d.copy(x, cx, n);            // device -> device
};

}  // namespace dtrain
