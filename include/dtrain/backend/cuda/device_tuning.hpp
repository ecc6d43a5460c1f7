#pragma once
// The CUDA backend's tuning table: the launch shapes of dtrain's kernels and
// the waits of its NCCL communicators, each with the reason for its value.
// Cuda::tuning names it, so generic code reaches a value through the device
// it computes on (Dev::tuning). Plain C++ (no CUDA header), so that g++ and
// nvcc translation units read the same values.
//
// Not here, because they are contracts rather than knobs:
//   a functor's vector_width (its apply_vector's four-element accesses,
//     Vec4 in kernels/elementwise.hpp): the launch takes F::vector_width;
//   math::lanes and a row functor's row_lanes (kernels/math.hpp): the lane
//     groups host and GPU share so their reductions agree bit for bit;
//   ShardReducer::max_in_flight (strategy/sharded.hpp): the reduction slots
//     of the sharded strategies, on every device, which the memory estimate
//     (train/estimate.hpp) counts.

#include <chrono>
#include <cstdint>

namespace dtrain::detail {

struct CudaTuning {
  // ---- device: kernels (backend/cuda/device_launch.cuh) ----

  // Threads per block of every dtrain kernel (and its __launch_bounds__):
  // eight warps, the usual size (no measurement here chose it), several
  // blocks to an SM. The block reduction of the sums runs over it (bits:
  // the sums' order follows it).
  static constexpr unsigned kernel_block = 256;
  // Blocks of for_each per SM: a few resident blocks per SM keep the GPU
  // busy; the grid-stride loop does the rest.
  static constexpr unsigned blocks_per_sm = 8;
  // Blocks (partial sums) of Cuda::sum at most: enough to fill the largest
  // GPU several times over; the grid-stride loop covers any n with a
  // bounded grid, and the partials are added on the host in block order
  // (bits: their number fixes the order).
  static constexpr unsigned max_partial_sums = 1024;

  // ---- nn: attention ----

  // The causal products and softmax in blocks of rows: 0, whole rows, one
  // product each (the blocks are the host's way to skip the masked part of
  // the products: backend/host/device_tuning.hpp).
  static constexpr std::int64_t causal_block = 0;

  // ---- comm: NCCL (backend/cuda/comm_nccl.ipp) ----

  // The watchdog polls a communicator's outstanding collectives timeout /
  // watchdog_polls times per timeout, but at least every watchdog_poll_max
  // (a failure is reported soon after it happens) and at most every
  // watchdog_poll_min (an idle GPU is not kept busy with event queries).
  static constexpr int watchdog_polls = 20;
  static constexpr std::chrono::milliseconds watchdog_poll_min{1};
  static constexpr std::chrono::milliseconds watchdog_poll_max{100};
  // Waiting for a non-blocking NCCL call to settle (initialisation, a
  // collective's set-up) backs off from 1 us to this: set-up takes
  // milliseconds, so the poll stays cheap without adding latency.
  static constexpr std::chrono::microseconds settle_backoff_max{10000};
  // NcclWork::synchronize's host wait backs off from 1 us to this: a
  // collective usually completes within microseconds to milliseconds.
  static constexpr std::chrono::microseconds synchronize_backoff_max{500};
};

}  // namespace dtrain::detail
