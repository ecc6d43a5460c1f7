#pragma once
// The two kernels every dtrain::Cuda computation goes through: a grid-stride
// loop calling a functor per index, and the same loop summing the functor's
// values into one double per block. dtrain::Cuda (device/cuda.hpp) includes
// this file when nvcc compiles the translation unit.

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <algorithm>
#include <concepts>
#include <cstddef>

namespace dtrain::detail {

inline constexpr unsigned kernel_block = 256;
// Enough blocks to fill the largest GPU several times over; the grid-stride
// loop covers any n with a bounded grid.
inline constexpr unsigned max_partial_sums = 1024;

inline unsigned grid_size(std::size_t n, unsigned max_blocks) {
  const std::size_t needed = (n + kernel_block - 1) / kernel_block;
  return static_cast<unsigned>(std::min<std::size_t>(needed, max_blocks));
}

template <class F>
__global__ void __launch_bounds__(kernel_block) for_each_kernel(std::size_t n, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// Per-block partial sums in a fixed order (no atomics), so the same input on
// the same GPU gives the same bits every time: the gradient norm drives
// clipping and the loss scale, and a step must be reproducible.
template <class F>
__global__ void __launch_bounds__(kernel_block) partial_sums_kernel(std::size_t n, F f, double* partials) {
  __shared__ double shared[kernel_block];
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += static_cast<double>(f(i));
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = kernel_block / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// A functor that can also do F::vector_width consecutive elements at once
// with wide loads and stores (AdamWStep), when its buffers allow (vector_ok).
template <class F>
concept VectorFunctor = requires(const F& f, std::size_t i) {
  { F::vector_width } -> std::convertible_to<std::size_t>;
  { f.vector_ok() } -> std::convertible_to<bool>;
  f.apply_vector(i);
};

// The vector form of for_each_kernel: whole vectors in the grid-stride loop,
// the last n % width elements one by one by the first block.
template <VectorFunctor F>
__global__ void __launch_bounds__(kernel_block) for_each_vector_kernel(std::size_t n, F f) {
  constexpr std::size_t width = F::vector_width;
  const std::size_t vectors = n / width;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t v = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += stride)
    f.apply_vector(v * width);
  if (blockIdx.x == 0 && threadIdx.x < n - vectors * width) f(vectors * width + threadIdx.x);
}

template <class F>
cudaError_t launch_for_each(cudaStream_t stream, std::size_t n, const F& f, unsigned max_blocks) {
  if (n == 0) return cudaSuccess;
  if constexpr (VectorFunctor<F>) {
    if (f.vector_ok()) {
      static_assert(F::vector_width <= kernel_block);
      for_each_vector_kernel<<<grid_size(n / F::vector_width + 1, max_blocks), kernel_block, 0, stream>>>(n, f);
      return cudaGetLastError();
    }
  }
  for_each_kernel<<<grid_size(n, max_blocks), kernel_block, 0, stream>>>(n, f);
  return cudaGetLastError();
}

// Writes grid_size(n, max_partial_sums) partial sums to `partials`.
template <class F>
cudaError_t launch_partial_sums(cudaStream_t stream, std::size_t n, const F& f, double* partials) {
  partial_sums_kernel<<<grid_size(n, max_partial_sums), kernel_block, 0, stream>>>(n, f, partials);
  return cudaGetLastError();
}

}  // namespace dtrain::detail

#endif  // __CUDACC__
