#pragma once
// dtrain::Host: the CPU device. Buffers are 64-byte aligned heap memory,
// GEMMs go to oneDNN or OpenBLAS (host_gemm below), and for_each splits a
// large range over the rank's
// threads (see for_each) and runs each part with the widest vector
// instructions the processor has (device_isa.hpp). The rank's threads are a
// pool of dtrain's own that also splits the GEMMs (host_threads below).
//
// Threads per rank: every process starts one OpenBLAS pool with a thread
// per core, so N ranks on one machine fight over the cores (3x slower when
// it was measured). Host() therefore gives each rank its share of the cores
// it may use, usable cores / ranks on this node (cores_per_local_rank in
// launch/env.hpp, which reads dtrain-run's, torchrun's, mpirun's and srun's
// variables), unless OPENBLAS_NUM_THREADS says otherwise. Under every
// launcher a rank thus gets the same count, so a GEMM splits its sums alike
// and runs give bit-identical results. The OpenBLAS thread count is
// process-wide: ranks running as threads of one process share it.
//
// Under an address-space limit (ulimit -v) each pool thread's 128 MiB buffer
// counts against it, so the count is also capped at what a quarter of the
// limit holds (blas_threads_per_rank). OpenBLAS starts its pool as it loads,
// one thread per core unless OPENBLAS_NUM_THREADS says, and lowering the
// count later ends no thread; a pool already too large for the limit is
// reported (blas_pool_error) rather than left to hang the process at exit.

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtrain/backend/host/device_isa.hpp"
#include "dtrain/backend/host/device_tuning.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/host_env.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/device/device.hpp"

// Declared here rather than taken from <cblas.h>: only OpenBLAS's cblas.h
// declares them, and a system may point <cblas.h> at another vendor's header.
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace dtrain {

namespace detail {

class HostAllocator {
 public:
  HostAllocator() = default;
  HostAllocator(std::shared_ptr<device_memory> stats, memory_category category)
      : stats_(std::move(stats)), category_(category) {}

  DTRAIN_DECL void* allocate(std::size_t bytes);
  DTRAIN_DECL void deallocate(void* p, std::size_t bytes) noexcept;
  void fill_zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }

 private:
  std::shared_ptr<device_memory> stats_;
  memory_category category_ = memory_category::other;
};

// A positive integer from the environment, or `fallback` when unset.
DTRAIN_DECL int positive_env_int(const char* name, int fallback);

// A BLAS dimension as OpenBLAS's 32-bit int (the error out of line).
[[noreturn]] DTRAIN_DECL void blas_int_overflow(std::int64_t v, const char* what);

inline int blas_int(std::int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) blas_int_overflow(v, what);
  return static_cast<int>(v);
}

inline void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                  std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blas_int(m, "m"),
              blas_int(n, "n"), blas_int(k, "k"), alpha, A, blas_int(lda, "lda"), B, blas_int(ldb, "ldb"), beta, C,
              blas_int(ldc, "ldc"));
}

// A dense fp32 copy of a rows x cols row-major matrix with leading dimension ld.
template <class T>
std::vector<float> widen(const T* src, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(r * cols + c)] = static_cast<float>(src[r * ld + c]);
  return out;
}

// How a rank's threads share its parallel work (DTRAIN_HOST_THREADS):
//   pool      (the default) one pool of dtrain's threads per process and
//             thread count runs everything: the GEMM engine runs
//             single-threaded and a large GEMM is split into blocks of rows
//             or columns, one per thread; a batch of GEMMs (attention's heads) is split by
//             matrices; for_each splits ranges, and a row functor's rows
//             (index_work). The threads wait spinning for a moment between
//             jobs, so no job pays a thread start and no idle OpenBLAS
//             thread competes with them for a core: a step at 1 rank x 2
//             threads took two thirds of the time of the mode below.
//   openblas  the GEMM engine's own threads run each GEMM on threads()
//             threads (OpenBLAS's pool, oneDNN's OpenMP team), and
//             for_each starts threads() - 1 threads for each large range
//             (a thread start costs about 10 us, hence the grain below);
//             dtrain's own kernels for rows run on the calling thread.
// Results are reproducible run to run in both, and equal between them for
// everything but GEMMs: OpenBLAS picks its kernel by a product's size, so a
// block of a product may be summed in another order than the whole, a
// difference in the last bits (as between thread counts).
}  // namespace detail

enum class host_threads { openblas, pool };

// Which library multiplies the fp32 matrices (DTRAIN_HOST_GEMM; fp16
// products, and bf16 ones where the engine has no bf16 GEMM, are widened to
// fp32 and go the same way; oneDNN multiplies bf16 itself, Host::gemm_bf16):
//   onednn    oneDNN's dnnl_sgemm (Debian's libdnnl2, loaded at run time:
//             nothing to link). The default where libdnnl.so.2 loads: on
//             the models' products at one thread it was 1.10-1.22x faster
//             than OpenBLAS on an Intel Xeon and 1.05-1.08x on an AMD EPYC.
//   openblas  OpenBLAS's cblas_sgemm (linked). The default where oneDNN is
//             not installed.
// Unset or "auto" picks as above, but OpenBLAS under an address-space limit
// (ulimit -v: oneDNN is then never loaded); naming onednn where it cannot be loaded
// is an error that says what to install. Each engine's results are
// reproducible run to run; the two differ from each other in the last bits.
enum class host_gemm { openblas, onednn };

namespace detail {

// The mode DTRAIN_HOST_THREADS names ("" for the default, pool); a config_error
// for any other name.
DTRAIN_DECL host_threads host_threads_named(std::string_view name);
// DTRAIN_HOST_THREADS, read once per process.
DTRAIN_DECL host_threads host_threads_from_env();

// One engine's row-major fp32 GEMM, C = alpha op(A) op(B) + beta C, on
// `threads` threads of the engine's own (1: the calling thread only; for
// OpenBLAS the process-wide count applies instead). Returns 0, or the
// engine's error status.
using SgemmFn = int (*)(int threads, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                        float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                        float* C, std::int64_t ldc);
// The engine DTRAIN_HOST_GEMM names ("" or "auto": oneDNN when it loads,
// else OpenBLAS); a config_error for any other name, or for "onednn" where
// libdnnl.so.2 cannot be loaded.
DTRAIN_DECL host_gemm host_gemm_named(std::string_view name);
// DTRAIN_HOST_GEMM, read once per process.
DTRAIN_DECL host_gemm host_gemm_from_env();
// The engine's GEMM (oneDNN's loaded on first use; a config_error naming
// what to install when it cannot be).
DTRAIN_DECL SgemmFn sgemm_of(host_gemm engine);
// One engine's row-major bf16 x bf16 -> fp32 GEMM (the bits of bf16 values),
// C fp32; nullptr for an engine without one (OpenBLAS), or where oneDNN's
// does not run on this processor.
using Bf16GemmFn = int (*)(int threads, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                           float alpha, const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B,
                           std::int64_t ldb, float beta, float* C, std::int64_t ldc);
DTRAIN_DECL Bf16GemmFn bf16_gemm_of(host_gemm engine);
// Why oneDNN cannot be loaded here ("" when it can).
DTRAIN_DECL const std::string& onednn_unavailable();
// An engine's error status as an exception naming the product.
[[noreturn]] DTRAIN_DECL void sgemm_failed(host_gemm engine, int status, std::int64_t m, std::int64_t n,
                                           std::int64_t k);

// The elements one index of f touches: a row functor (one index per row of
// a softmax, a norm, a loss) states its row length as work_per_index(), so
// the pool splits 4096 rows of 128 as it splits 512K elements.
template <class F>
std::size_t index_work(const F& f) {
  if constexpr (requires { f.work_per_index(); }) {
    return std::max<std::size_t>(1, static_cast<std::size_t>(f.work_per_index()));
  } else {
    return 1;
  }
}

// Indices per block of Host::sum: whole rows for a row functor.
template <class F>
std::size_t sum_block_indices(const F& f) {
  const std::size_t work = index_work(f);
  return work > 1 ? std::max<std::size_t>(1, HostTuning::sum_block / work) : HostTuning::sum_block;
}

// dtrain's threads for one Host (host_threads::pool): threads() - 1 workers
// and the calling thread. try_run hands every worker the job's parts at
// once and runs part 0 itself. A worker that finds no job spins for
// HostTuning::pool_spin before it sleeps (a futex), so the jobs of one step reach a
// running thread.
class HostPool {
 public:
  using Task = void (*)(const void* job, std::size_t part);

  DTRAIN_DECL explicit HostPool(int threads);
  DTRAIN_DECL ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  int threads() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  // task(job, p) for every p in [0, parts), parts <= threads(), p = 0 on the
  // calling thread; returns when all have returned. Returns false and runs
  // nothing when the pool is already running a job (a call from another
  // thread, or from inside a task): the caller then runs the parts itself.
  // task must not throw.
  DTRAIN_DECL bool try_run(std::size_t parts, Task task, const void* job);

 private:
  static constexpr std::uint64_t stop_parts = 0xffff;
  DTRAIN_DECL void work(std::size_t index);

  std::atomic<bool> busy_{false};
  std::atomic<std::uint64_t> word_{0};  // job number << 16 | parts
  std::atomic<std::size_t> pending_{0};
  std::atomic<Task> task_{nullptr};
  std::atomic<const void*> job_{nullptr};
  std::vector<std::thread> workers_;
};

// The process's pool of `threads` threads, shared by every Host of that
// thread count (the device, an offload arena's host side): one set of
// threads per process, not one per Host competing for the same cores.
DTRAIN_DECL std::shared_ptr<HostPool> shared_host_pool(int threads);

// g(p) for p in [0, parts) on the pool (the calling thread included), or
// one after the other on the calling thread when there is no pool or it is
// busy.
template <class G>
void run_parts(HostPool* pool, std::size_t parts, const G& g) {
  const auto task = [](const void* job, std::size_t part) { (*static_cast<const G*>(job))(part); };
  if (parts > 1 && pool != nullptr && pool->try_run(parts, task, &g)) return;
  for (std::size_t p = 0; p < parts; ++p) g(p);
}

// The length of each of `parts` contiguous ranges that cover [0, count):
// an even share rounded up to a multiple of `align` (the last may be shorter).
inline std::size_t range_chunk(std::size_t count, std::size_t parts, std::size_t align) {
  return ((count + parts - 1) / parts + align - 1) / align * align;
}

// g(begin, end) for each non-empty range of range_chunk's cut of [0, count)
// into `parts`, on the pool (see run_parts).
template <class G>
void run_ranges(HostPool* pool, std::size_t count, std::size_t parts, std::size_t align, const G& g) {
  const std::size_t chunk = range_chunk(count, parts, align);
  run_parts(pool, parts, [&](std::size_t p) {
    const std::size_t begin = p * chunk;
    if (begin < count) g(begin, std::min(count, begin + chunk));
  });
}

// f(i) for i in [0, n) on `parts` threads, the calling thread included, each
// over one contiguous range: the pool's when there is one, else threads
// started for this call. Ranges start at multiples of HostTuning::range_align
// elements (a row functor's at whole rows, which share at most the line where
// one range ends). Each thread runs its own copy of f (run_range makes it).
template <class F>
void parallel_for(HostPool* pool, std::size_t n, std::size_t parts, const F& f) {
  const std::size_t line = index_work(f) > 1 ? 1 : HostTuning::range_align;
  auto run = [&f](std::size_t begin, std::size_t end) { run_range(f, begin, end); };
  if (pool != nullptr) return run_ranges(pool, n, parts, line, run);
  const std::size_t chunk = range_chunk(n, parts, line);
  std::vector<std::jthread> workers;
  workers.reserve(parts - 1);
  for (std::size_t begin = chunk; begin < n; begin += chunk)
    workers.emplace_back(run, begin, std::min(n, begin + chunk));
  run(0, std::min(n, chunk));
}

// How the pool cuts a product's C: `parts` blocks of whole rows (by_rows,
// when m >= n) or columns, each `chunk` long (a multiple of
// HostTuning::gemm_block; the last
// may be shorter); parts 1 when the product is too small to be worth it.
struct GemmSplit {
  std::int64_t parts = 1, chunk = 0;
  bool by_rows = true;
};
DTRAIN_DECL GemmSplit gemm_split(int threads, std::int64_t m, std::int64_t n, std::int64_t k);

// block(by_rows, begin, size) -> status for each block of `split`, each on
// its own thread of the pool; the whole product, block(true, 0, m), on the
// calling thread when there is one block or the pool is busy (a product
// inside a batch's part). Returns 0 or a block's error status.
template <class Block>
int run_gemm_blocks(HostPool* pool, const GemmSplit& split, std::int64_t m, std::int64_t n, const Block& block) {
  if (split.parts < 2 || pool == nullptr) return block(true, std::int64_t{0}, m);
  const std::int64_t dim = split.by_rows ? m : n;
  std::atomic<int> failed{0};
  const auto part = [&](std::size_t p) {
    const std::int64_t begin = static_cast<std::int64_t>(p) * split.chunk;
    const std::int64_t size = std::min(dim, begin + split.chunk) - begin;
    if (size <= 0) return;
    if (const int status = block(split.by_rows, begin, size); status != 0)
      failed.store(status, std::memory_order_relaxed);
  };
  using Part = decltype(part);
  const auto task = [](const void* job, std::size_t p) { (*static_cast<const Part*>(job))(p); };
  if (!pool->try_run(static_cast<std::size_t>(split.parts), task, &part)) return block(true, std::int64_t{0}, m);
  return failed.load(std::memory_order_relaxed);
}

// `engine`'s sgemm on the pool (gemm_split, run_gemm_blocks), each block
// multiplied single-threaded. Returns 0 or the first error status of a block.
DTRAIN_DECL int pool_sgemm(HostPool* pool, int threads, SgemmFn engine, bool trans_a, bool trans_b, std::int64_t m,
                           std::int64_t n, std::int64_t k, float alpha, const float* A, std::int64_t lda,
                           const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

}  // namespace detail

class Host : public detail::DeviceMemory<Host, detail::HostAllocator> {
 public:
  static constexpr const char* name = "host";
  // This backend's tuning table (backend/host/device_tuning.hpp).
  using tuning = detail::HostTuning;
  static constexpr bool host_accessible = true;
  template <class T>
  using buffer = Buffer<T, detail::HostAllocator>;

  // The rank's share of the cores (see the top of this file).
  Host() : Host(detail::positive_env_int("OPENBLAS_NUM_THREADS", 0), from_env{}) {}
  explicit Host(int threads) : Host(threads, detail::host_threads_from_env()) {}
  Host(int threads, host_threads mode) : Host(threads, mode, detail::host_gemm_from_env()) {}
  DTRAIN_DECL Host(int threads, host_threads mode, host_gemm gemm);

  int threads() const noexcept { return threads_; }
  // How this Host's threads share the work (DTRAIN_HOST_THREADS).
  host_threads threads_mode() const noexcept { return pool_ ? host_threads::pool : host_threads::openblas; }
  // Which library multiplies its matrices (DTRAIN_HOST_GEMM).
  host_gemm gemm_engine() const noexcept { return gemm_; }
  detail::HostAllocator allocator(memory_category category = memory_category::other) const {
    return detail::HostAllocator(stats_, category);
  }

  void synchronize() noexcept {}

  template <class T>
  void copy_to_host(T* dst, const T* src, std::size_t n) {
    copy(dst, src, n);
  }
  template <class T>
  void copy_from_host(T* dst, const T* src, std::size_t n) {
    copy(dst, src, n);
  }
  template <class T>
  void copy(T* dst, const T* src, std::size_t n) {
    if (n != 0) std::memmove(dst, src, n * sizeof(T));
  }
  template <class T>
  void zero(T* dst, std::size_t n) {
    if (n != 0) std::memset(static_cast<void*>(dst), 0, n * sizeof(T));
  }

  // Row-major C = alpha * op(A) * op(B) + beta * C. bf16/fp16 are widened to
  // fp32, multiplied by sgemm and rounded once on the way back: the same
  // fp32 accumulation a GPU's tensor cores do, so host and GPU agree. With
  // oneDNN, bf16 goes to its bf16 GEMM instead (gemm_bf16: the same exact
  // products, summed in fp32, rounded once).
  template <class T>
  void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const T* A,
            std::int64_t lda, const T* B, std::int64_t ldb, float beta, T* C, std::int64_t ldc) {
    static_assert(Dtype<T>, "gemm supports fp32, bf16 and fp16");
    if (m == 0 || n == 0) return;
    if (k == 0) {  // an empty product (a rank's empty batch): C = beta C, whatever the BLAS does
      for (std::int64_t r = 0; r < m; ++r)
        for (std::int64_t col = 0; col < n; ++col)
          C[r * ldc + col] = beta == 0.f ? T(0.f) : T(beta * static_cast<float>(C[r * ldc + col]));
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      sgemm(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
      if constexpr (std::is_same_v<T, bf16>) {
        if (bf16_gemm_ != nullptr)
          return gemm_bf16(trans_a, trans_b, m, n, k, alpha, reinterpret_cast<const std::uint16_t*>(A), lda,
                           reinterpret_cast<const std::uint16_t*>(B), ldb, beta, C, ldc);
      }
      const std::int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
      const std::int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
      const std::vector<float> a = detail::widen(A, a_rows, a_cols, lda);
      const std::vector<float> b = detail::widen(B, b_rows, b_cols, ldb);
      std::vector<float> c =
          beta == 0.f ? std::vector<float>(static_cast<std::size_t>(m * n)) : detail::widen(C, m, n, ldc);
      sgemm(trans_a, trans_b, m, n, k, alpha, a.data(), a_cols, b.data(), b_cols, beta, c.data(), n);
      for (std::int64_t r = 0; r < m; ++r)
        for (std::int64_t col = 0; col < n; ++col) C[r * ldc + col] = T(c[static_cast<std::size_t>(r * n + col)]);
    }
  }

  // `batch` independent GEMMs (attention's per-head products): matrix i of
  // A, B and C starts at i * stride_a / stride_b / stride_c elements. On the
  // pool, each thread multiplies its share of the matrices.
  template <class T>
  void gemm_batched(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const T* A,
                    std::int64_t lda, std::int64_t stride_a, const T* B, std::int64_t ldb, std::int64_t stride_b,
                    float beta, T* C, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
    const auto one = [&](std::int64_t i) {
      gemm(trans_a, trans_b, m, n, k, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
    };
    if (!pool_ || batch < 2) {
      for (std::int64_t i = 0; i < batch; ++i) one(i);
      return;
    }
    const auto count = static_cast<std::size_t>(batch);
    detail::run_ranges(pool_.get(), count, std::min(static_cast<std::size_t>(threads_), count), 1,
                       [&](std::size_t begin, std::size_t end) {
                         for (std::size_t i = begin; i < end; ++i) one(static_cast<std::int64_t>(i));
                       });
  }

  // Functors are data parallel by contract (the GPU runs every index on its
  // own thread), so a large range is split over threads() threads: an
  // optimizer pass over a big model is bound by memory bandwidth, which one
  // core alone does not saturate, or, for math the compiler cannot vectorise,
  // by the cores. As on the GPU, f must not throw.
  template <class F>
  void for_each(std::size_t n, F f) {
    const std::size_t parts =
        pool_ ? std::min(static_cast<std::size_t>(threads_), n * detail::index_work(f) / tuning::pool_grain)
              : std::min(static_cast<std::size_t>(threads_), n / tuning::for_each_grain);
    if (parts > 1) {
      detail::parallel_for(pool_.get(), n, std::min(n, parts), f);
      return;
    }
    detail::run_range(f, 0, n);
  }

  // Vectorised at the instruction level (backend/host/device_isa.hpp: sum_range)
  // over fixed blocks of tuning::sum_block elements (whole rows for a row functor),
  // whose sums are then added in order: the blocks do not depend on the
  // threads, so the result is the same on every run, at every thread count
  // and in both thread modes. The pool sums the blocks in parallel. The
  // Trainer's per-step gradient norm and the losses' sums run through here.
  template <class F>
  double sum(std::size_t n, F f) {
    const std::size_t block = detail::sum_block_indices(f);
    if (n <= block) return detail::sum_range(f, 0, n);
    const std::size_t blocks = (n + block - 1) / block;
    std::vector<double> partial(blocks);
    const std::size_t parts = pool_ ? std::min(static_cast<std::size_t>(threads_), blocks) : 1;
    detail::run_ranges(pool_.get(), blocks, parts, 1, [&](std::size_t first, std::size_t last) {
      for (std::size_t b = first; b < last; ++b)
        partial[b] = detail::sum_range(f, b * block, std::min(n, b * block + block));
    });
    double total = 0.0;
    for (const double v : partial) total += v;
    return total;
  }

  // (workspace and the memory reports: detail::DeviceMemory)

 private:
  friend class detail::DeviceMemory<Host, detail::HostAllocator>;
  detail::device_memory& device_stats() const noexcept { return *stats_; }

  struct from_env {};
  // blas_env == 0: OPENBLAS_NUM_THREADS is unset, so we choose. Otherwise
  // OpenBLAS already read it when it loaded and we only report it.
  DTRAIN_DECL Host(int blas_env, from_env);
  DTRAIN_DECL void start_pool(host_threads mode);
  // The engine's sgemm, on the pool (detail::pool_sgemm) when there is one.
  DTRAIN_DECL void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                         const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                         std::int64_t ldc);
  // bf16 x bf16 summed in fp32 by the engine (oneDNN: the processor's bf16
  // dot products where it has them), the same products as widening to fp32
  // (a product of two bf16 values is exact in fp32), rounded once into C.
  // Each block of C goes through an fp32 scratch that the thread computing
  // it reads C into (beta != 0) and rounds back from. (Inline, unlike the
  // rest of Host's non-template code: its loops over C run in the step,
  // which header-only builds would compile at -O1 in the .ipp.)
  void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                 const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta,
                 bf16* C, std::int64_t ldc) {
    std::vector<float> acc(static_cast<std::size_t>(m * n));
    const int threads = pool_ ? 1 : threads_;
    const auto block = [&](bool by_rows, std::int64_t begin, std::int64_t size) {
      const std::int64_t r0 = by_rows ? begin : 0, rows = by_rows ? size : m;
      const std::int64_t c0 = by_rows ? 0 : begin, cols = by_rows ? n : size;
      float* out = acc.data() + r0 * n + c0;
      if (beta != 0.f)
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < cols; ++c) out[r * n + c] = static_cast<float>(C[(r0 + r) * ldc + c0 + c]);
      const std::uint16_t* a = !by_rows ? A : trans_a ? A + r0 : A + r0 * lda;
      const std::uint16_t* b = by_rows ? B : trans_b ? B + c0 * ldb : B + c0;
      const int status = bf16_gemm_(threads, trans_a, trans_b, rows, cols, k, alpha, a, lda, b, ldb, beta, out, n);
      if (status == 0)
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t c = 0; c < cols; ++c) C[(r0 + r) * ldc + c0 + c] = bf16(out[r * n + c]);
      return status;
    };
    const int status = detail::run_gemm_blocks(
        pool_.get(), pool_ ? detail::gemm_split(threads_, m, n, k) : detail::GemmSplit{}, m, n, block);
    if (status != 0) detail::sgemm_failed(gemm_, status, m, n, k);
  }
  // The pool OpenBLAS started as it loaded, against the address-space limit.
  DTRAIN_DECL static void check_blas_pool();
  DTRAIN_DECL void apply_blas_threads() const;

  int threads_;
  host_gemm gemm_;
  detail::SgemmFn sgemm_;
  detail::Bf16GemmFn bf16_gemm_;            // nullptr: bf16 products widened to fp32 for sgemm_
  std::shared_ptr<detail::HostPool> pool_;  // host_threads::pool with threads_ > 1
  std::shared_ptr<detail::device_memory> stats_ = std::make_shared<detail::device_memory>();
};

static_assert(ComputeDevice<Host>);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/host/device.ipp"
#endif
