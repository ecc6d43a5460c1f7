#pragma once
// The compute-device concept. Host (OpenBLAS, host loops) and Cuda (cuBLAS,
// kernels launched over the same functors) both satisfy it, so units,
// optimizers and strategies are written once.
//
// Beyond what is checked here, a device offers:
//   template <class T> using buffer = Buffer<T, allocator>;   (device/buffer.hpp)
//   allocator(category = other)         what make_buffer<T>(dev, n, category) allocates with;
//                                       its bytes count into that memory_category
//   gemm<T>(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
//       ROW-MAJOR C[m x n] = alpha * op(A) * op(B) + beta * C, fp32 accumulation
//       for every dtype; C is not read when beta == 0.
//   gemm_batched<T>(..., A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch)
//       `batch` such GEMMs, matrix i at i * stride of each operand
//   for_each(n, f)   f(i) for i in [0, n), f a DTRAIN_HOST_DEVICE functor
//   sum(n, f)        the sum of f(i) as a double, read back to the host
//   workspace<T>(n)  device scratch valid until the next workspace call
//   tuning           the backend's tuning table (backend/<name>/device_tuning.hpp),
//                    for generic code that sizes its work by device
//                    (Dev::tuning::causal_block)
// Copies take (dst, src, count) like memcpy. Work is ordered on the device's
// stream; copy_to_host and copy_from_host block until the data has arrived.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "dtrain/core/macros.hpp"
#include "dtrain/device/buffer.hpp"

namespace dtrain {

namespace detail {
// Stands in for a kernel functor when the concept checks for_each and sum.
struct device_probe {
  DTRAIN_HOST_DEVICE float operator()(std::size_t) const { return 0.f; }
};

// The memory calls every device answers alike (the workspace and the
// memory_* reports of the concept below), over the statistics its
// allocators count into. A device derives from DeviceMemory<itself, its
// allocator type> and gives it allocator(category) and, as a friend,
// device_stats(): its device_memory.
template <class Dev, BufferAllocator Alloc>
class DeviceMemory {
 public:
  template <class T>
  T* workspace(std::size_t n) {
    return workspace_.template get<T>(static_cast<Dev&>(*this).allocator(memory_category::activations), n);
  }

  std::size_t memory_allocated() const noexcept { return stats().total().allocated(); }
  std::size_t peak_memory_allocated() const noexcept { return stats().total().peak(); }
  void reset_peak_memory_allocated() noexcept { stats().total().reset_peak(); }
  MemoryUsage memory_by_category() const noexcept { return stats().current(); }
  MemoryUsage peak_memory_by_category() const noexcept { return stats().peak(); }

 private:
  device_memory& stats() const noexcept { return static_cast<const Dev&>(*this).device_stats(); }

  Workspace<Alloc> workspace_;
};
}  // namespace detail

template <class D>
concept ComputeDevice = requires(D& d, const float* cx, float* x, std::size_t n, float s, std::int64_t i) {
  { D::name } -> std::convertible_to<const char*>;
  // true when buffers are plain host memory the CPU may read directly
  { D::host_accessible } -> std::convertible_to<bool>;
  typename D::template buffer<float>;
  d.allocator();
  d.allocator(memory_category::params);
  d.synchronize();
  d.copy_to_host(x, cx, n);    // device -> host, blocking
  d.copy_from_host(x, cx, n);  // host -> device, blocking
  d.copy(x, cx, n);            // device -> device, ordered on the device's stream
  d.zero(x, n);
  { d.template workspace<float>(n) } -> std::same_as<float*>;
  d.gemm(false, false, i, i, i, s, cx, i, cx, i, s, x, i);
  d.gemm_batched(false, true, i, i, i, s, cx, i, i, cx, i, i, s, x, i, i, i);
  d.for_each(n, detail::device_probe{});
  { d.sum(n, detail::device_probe{}) } -> std::convertible_to<double>;
  { d.memory_allocated() } -> std::convertible_to<std::size_t>;
  { d.peak_memory_allocated() } -> std::convertible_to<std::size_t>;
  { d.memory_by_category() } -> std::same_as<MemoryUsage>;       // current bytes per category
  { d.peak_memory_by_category() } -> std::same_as<MemoryUsage>;  // high-water mark per category
};

}  // namespace dtrain
