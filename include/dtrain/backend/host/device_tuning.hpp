#pragma once
// The host backend's tuning table: every block size, split threshold,
// alignment and spin of the host device and its communicators, each with
// the reason for its value. Host::tuning names it, so generic code reaches
// a value through the device it computes on (Dev::tuning). Results depend
// on some of these (marked "bits"): a run is bit-reproducible at fixed
// values, and changing one changes results in their last bits.
//
// Not here, because they are contracts rather than knobs:
//   math::lanes (kernels/math.hpp): the lane groups of the row functors,
//     which host and GPU share so their reductions agree bit for bit;
//   ShardReducer::max_in_flight (strategy/sharded.hpp): the reduction slots
//     of the sharded strategies, on every device, which the memory estimate
//     (train/estimate.hpp) counts;
//   the span forms' scratch (nn/rotary_attention.hpp's 64 accumulators):
//     part of a functor's host code, which names no backend.

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace dtrain::detail {

struct HostTuning {
  // ---- device: memory and Host::for_each ----

  // Buffer alignment in bytes: a cache line, and the width of an AVX-512 load.
  static constexpr std::size_t alignment = 64;
  // for_each's ranges start at multiples of this many elements (a row
  // functor's at whole rows), so two threads never write into the same cache
  // line of an `alignment`-aligned buffer, whatever the element size.
  static constexpr std::size_t range_align = 64;
  // Elements per thread below which for_each stays on the calling thread
  // when it starts threads of its own (DTRAIN_HOST_THREADS=openblas):
  // starting and joining a thread costs about 10 us, what the cheapest
  // functors (a copy, a cast) spend on this many elements; an AdamW step
  // spends ten times that.
  static constexpr std::size_t for_each_grain = std::size_t{1} << 15;
  // The same on dtrain's pool (the default), which hands a job to a waiting
  // thread in about a microsecond, so its grain is smaller.
  static constexpr std::size_t pool_grain = std::size_t{1} << 13;
  // How long a pool worker without a job keeps polling before it sleeps:
  // longer than the gaps between the jobs of a step (a GEMM's packing, a
  // serial kernel), far shorter than a step.
  static constexpr std::chrono::microseconds pool_spin{200};

  // ---- device: Host::sum (bits) ----

  // Host::sum adds blocks of about this many elements (a multiple of
  // sum_lanes), each in a fixed order, then the blocks' sums in order. A
  // block is the unit the pool sums in parallel (twice pool_grain), and the
  // blocks do not depend on the threads, so a sum is the same at every
  // thread count and in both thread modes.
  static constexpr std::size_t sum_block = std::size_t{1} << 14;
  // Independent partial sums per block (element i goes to partial i % 32,
  // added pairwise at the end): four AVX-512 (eight AVX2) accumulators keep
  // the additions from waiting on each other's latency.
  static constexpr std::size_t sum_lanes = 32;
  static_assert(sum_block % sum_lanes == 0);

  // ---- device: GEMMs on the pool ----

  // Multiply-adds below which a GEMM is not split over the pool: it takes
  // microseconds, less than handing out the parts.
  static constexpr std::int64_t gemm_min_work = std::int64_t{1} << 18;
  // A split GEMM's blocks of rows or columns are multiples of this: 16 fp32
  // elements of C are a cache line, so two threads never write one line.
  static constexpr std::int64_t gemm_block = 16;

  // ---- nn: attention (bits) ----

  // The causal products and softmax run in blocks of this many query rows,
  // each multiplying only what the causal mask leaves: at 128 positions 3/4
  // of the full products, at 512 about 9/16. A multiple of math::lanes (a
  // block must end on a lane group; nn/attention.hpp checks it).
  static constexpr std::int64_t causal_block = 64;

  // ---- comm: shared memory (backend/host/comm_shm.hpp) ----

  // Elements of the fp32 accumulator a shared-memory reduction sums in per
  // pass (8 KiB): it stays in L1, and each pass is a plain loop the compiler
  // vectorises.
  static constexpr std::size_t shm_sum_block = 2048;
  // A chunk's parts are multiples of this many elements, so every part
  // starts on a cache line (16 fp32 elements).
  static constexpr std::size_t shm_part_align = 16;
  // DTRAIN_SHM_WAIT=auto spins this long before sleeping on the futex:
  // long enough to cover a peer that is a step behind when every local
  // rank has a core of its own ...
  static constexpr std::chrono::microseconds shm_spin{200};
  // ... and only this long when the ranks outnumber the cores, where a
  // spinning rank takes the core its peer needs (bench/run_comm_bench.sh).
  static constexpr std::chrono::microseconds shm_spin_oversubscribed{2};

  // ---- comm: Gloo (backend/host/comm_gloo.hpp) ----

  // A waiter spins (yielding) this long before sleeping on its condition
  // variable: a sleep/wake round trip on a busy machine can cost a scheduler
  // tick (a 1 MiB broadcast took ~4 ms through a sleeping hand-off, ~0.2 ms
  // with a 200 us spin), while a long spin steals the core of a rank still
  // computing when ranks share few cores (50 us: no measurable cost to a
  // 2-rank step on 2 cores).
  static constexpr std::chrono::microseconds gloo_spin{50};
};

}  // namespace dtrain::detail
