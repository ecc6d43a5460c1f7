#pragma once
// The kernels every dtrain::Cuda computation goes through: a grid-stride
// loop calling a functor per index, and the same loop summing the functor's
// values into one double per block; and for row functors (kernels/math.hpp,
// SerialRow) the same two with a group of threads per row (LaneGroup).
// dtrain::Cuda (backend/cuda/device.hpp) includes this file when nvcc compiles the
// translation unit.

#if defined(__CUDACC__)

#include <cuda_runtime.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "dtrain/backend/cuda/device_tuning.hpp"

namespace dtrain::detail {

inline constexpr unsigned kernel_block = CudaTuning::kernel_block;

inline unsigned grid_size(std::size_t n, unsigned max_blocks) {
  const std::size_t needed = (n + kernel_block - 1) / kernel_block;
  return static_cast<unsigned>(std::min<std::size_t>(needed, max_blocks));
}

template <class F>
__global__ void __launch_bounds__(kernel_block) for_each_kernel(std::size_t n, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// Writes the sum of every thread's `acc` over the block to partials[block],
// in a fixed order (a tree over the threads' indices, no atomics), so the
// same input on the same GPU gives the same bits every time: the gradient
// norm drives clipping and the loss scale, and a step must be reproducible.
// Called by every thread of the block.
__device__ inline void block_partial_sum(double acc, double* partials) {
  __shared__ double shared[kernel_block];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = kernel_block / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// Per-block partial sums of f over a grid-stride loop.
template <class F>
__global__ void __launch_bounds__(kernel_block) partial_sums_kernel(std::size_t n, F f, double* partials) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += static_cast<double>(f(i));
  block_partial_sum(acc, partials);
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

// One row on Lanes threads of a warp (Lanes divides 32): the row functor's
// reductions and element loops spread over them. Thread `lane` sums elements
// lane, lane + Lanes, ... in order, then the lanes combine pairwise (lane k
// takes lane k + w for w = Lanes/2 .. 1), exactly as SerialRow's lane_sum
// does in one thread; the result reaches every lane.
template <unsigned Lanes>
struct LaneGroup {
  static_assert(Lanes >= 1 && 32 % Lanes == 0, "a lane group lies within one warp");
  unsigned lane;  // 0 .. Lanes - 1
  unsigned mask;  // the group's threads in its warp

  // Host-device so row functors (host-device templates) can name them; they
  // only ever run on the GPU (lane_rows_kernel).
  __host__ __device__ bool leader() const { return lane == 0; }
  template <class F>
  __host__ __device__ float sum(std::int64_t n, F f) const {
    float acc = 0.f;
    for (std::int64_t j = lane; j < n; j += Lanes) acc += f(j);
    return combine(acc, [](float a, float b) { return a + b; });
  }
  template <class F>
  __host__ __device__ float max(std::int64_t n, float lowest, F f) const {
    const auto larger = [](float a, float b) { return a < b ? b : a; };  // math::max's order
    float acc = lowest;
    for (std::int64_t j = lane; j < n; j += Lanes) acc = larger(acc, f(j));
    return combine(acc, larger);
  }
  template <class F>
  __host__ __device__ void each(std::int64_t n, F f) const {
    for (std::int64_t j = lane; j < n; j += Lanes) f(j);
  }

 private:
  template <class Op>
  __host__ __device__ float combine(float acc, Op op) const {
#if defined(__CUDA_ARCH__)
    for (unsigned w = Lanes / 2; w >= 1; w /= 2) acc = op(acc, __shfl_down_sync(mask, acc, w, Lanes));
    return __shfl_sync(mask, acc, 0, Lanes);
#else
    (void)op;
    return acc;  // never reached: lane groups exist only in kernels
#endif
  }
};

// A functor whose rows can run on a LaneGroup (kernels/math.hpp, SerialRow).
template <class F>
concept LaneRowFunctor = requires(const F& f, std::size_t i, const LaneGroup<F::row_lanes>& g) {
  { F::row_lanes } -> std::convertible_to<unsigned>;
  f.row(i, g);
};

template <class F>
__device__ LaneGroup<F::row_lanes> lane_group() {
  constexpr unsigned L = F::row_lanes;
  const unsigned in_warp = threadIdx.x % 32;
  return {in_warp % L, (L == 32 ? 0xffffffffu : ((1u << L) - 1u)) << (in_warp / L * L)};
}

// Rows over lane groups, grid-stride; every thread of a group takes the same row.
template <LaneRowFunctor F>
__global__ void __launch_bounds__(kernel_block) lane_rows_kernel(std::size_t rows, F f) {
  constexpr unsigned L = F::row_lanes;
  const LaneGroup<L> g = lane_group<F>();
  const std::size_t groups = static_cast<std::size_t>(gridDim.x) * blockDim.x / L;
  for (std::size_t r = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / L; r < rows; r += groups)
    f.row(r, g);
}

// partial_sums_kernel with a lane group per row: each row's value (the same
// on every lane) counted once, by its leader.
template <LaneRowFunctor F>
__global__ void __launch_bounds__(kernel_block) lane_row_sums_kernel(std::size_t rows, F f, double* partials) {
  constexpr unsigned L = F::row_lanes;
  const LaneGroup<L> g = lane_group<F>();
  const std::size_t groups = static_cast<std::size_t>(gridDim.x) * blockDim.x / L;
  double acc = 0.0;
  for (std::size_t r = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / L; r < rows; r += groups) {
    const double v = static_cast<double>(f.row(r, g));
    if (g.leader()) acc += v;
  }
  block_partial_sum(acc, partials);
}

template <LaneRowFunctor F>
cudaError_t launch_lane_rows(cudaStream_t stream, std::size_t rows, const F& f, unsigned max_blocks) {
  if (rows == 0) return cudaSuccess;
  lane_rows_kernel<<<grid_size(rows * F::row_lanes, max_blocks), kernel_block, 0, stream>>>(rows, f);
  return cudaGetLastError();
}

template <LaneRowFunctor F>
cudaError_t launch_lane_row_sums(cudaStream_t stream, std::size_t rows, const F& f, double* partials) {
  const unsigned blocks = grid_size(rows * F::row_lanes, CudaTuning::max_partial_sums);
  lane_row_sums_kernel<<<blocks, kernel_block, 0, stream>>>(rows, f, partials);
  return cudaGetLastError();
}

// A vector form no GPU run has proven yet (the functor says wide_path).
template <class F>
concept UnprovenVector = VectorFunctor<F> && requires {
  requires F::wide_path;
};

// `wide`: whether unproven vector forms may run (CudaPaths::elementwise).
template <class F>
cudaError_t launch_for_each(cudaStream_t stream, std::size_t n, const F& f, unsigned max_blocks, bool wide) {
  if (n == 0) return cudaSuccess;
  if constexpr (VectorFunctor<F>) {
    if (f.vector_ok() && (wide || !UnprovenVector<F>)) {
      static_assert(F::vector_width <= kernel_block);
      for_each_vector_kernel<<<grid_size(n / F::vector_width + 1, max_blocks), kernel_block, 0, stream>>>(n, f);
      return cudaGetLastError();
    }
  }
  for_each_kernel<<<grid_size(n, max_blocks), kernel_block, 0, stream>>>(n, f);
  return cudaGetLastError();
}

// Writes grid_size(n, CudaTuning::max_partial_sums) partial sums to `partials`.
template <class F>
cudaError_t launch_partial_sums(cudaStream_t stream, std::size_t n, const F& f, double* partials) {
  partial_sums_kernel<<<grid_size(n, CudaTuning::max_partial_sums), kernel_block, 0, stream>>>(n, f, partials);
  return cudaGetLastError();
}

}  // namespace dtrain::detail

#endif  // __CUDACC__
