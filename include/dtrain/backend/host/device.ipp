// The definitions device.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <dlfcn.h>

#include <chrono>
#include <map>
#include <mutex>

#include "dtrain/backend/host/device.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL void* HostAllocator::allocate(std::size_t bytes) {
    void* p = ::operator new (bytes, std::align_val_t{HostTuning::alignment}, std::nothrow);
    if (p == nullptr)
      throw error("host allocation of " + std::to_string(bytes) + " bytes failed (out of memory)",
                  "reduce the batch size or the model, or use more ranks with a sharded strategy");
    if (stats_) stats_->on_allocate(category_, bytes);
    return p;
  }

  DTRAIN_DECL void HostAllocator::deallocate(void* p, std::size_t bytes) noexcept {
    ::operator delete (p, std::align_val_t{HostTuning::alignment});
    if (stats_) stats_->on_release(category_, bytes);
  }

  DTRAIN_DECL int positive_env_int(const char* name, int fallback) {
    const char* raw = std::getenv(name);
    if (raw == nullptr || *raw == '\0') return fallback;
    const std::string_view s(raw);
    int value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc{} || end != s.data() + s.size() || value < 1)
      throw config_error(std::string(name) + "='" + raw + "' is not a positive integer",
                         std::string("set ") + name + " to a positive integer or unset it");
    return value;
  }

  DTRAIN_DECL void blas_int_overflow(std::int64_t v, const char* what) {
    throw config_error(
        std::string("gemm ") + what + " = " + std::to_string(v) + " is outside OpenBLAS's 32-bit index range",
        "split the matrix product into smaller blocks");
  }

  DTRAIN_DECL host_threads host_threads_named(std::string_view name) {
    if (name.empty() || name == "pool") return host_threads::pool;
    if (name == "openblas") return host_threads::openblas;
    throw config_error("DTRAIN_HOST_THREADS='" + std::string(name) + "' is not a thread mode",
                       "set DTRAIN_HOST_THREADS to pool or openblas, or unset it");
  }

  DTRAIN_DECL host_threads host_threads_from_env() {
    static const host_threads mode = [] {
      const char* raw = std::getenv("DTRAIN_HOST_THREADS");
      return host_threads_named(raw == nullptr ? "" : raw);
    }();
    return mode;
  }

  // oneDNN, loaded once per process: its row-major sgemm and the OpenMP
  // runtime's thread count (Debian builds oneDNN on OpenMP), or why not.
  struct OneDnnLibrary {
    using Sgemm = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                          const float*, std::int64_t, float, float*, std::int64_t);
    using SetThreads = void (*)(int);
    using GemmBf16 = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float, const std::uint16_t*,
                             std::int64_t, const std::uint16_t*, std::int64_t, float, float*, std::int64_t);
    Sgemm sgemm = nullptr;
    GemmBf16 gemm_bf16 = nullptr;  // nullptr where this processor cannot run it
    SetThreads set_threads = nullptr;
    std::string unavailable;
  };

  DTRAIN_DECL const OneDnnLibrary& onednn_library() {
    static const OneDnnLibrary library = [] {
      OneDnnLibrary l;
      void* handle = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* why = dlerror();
        l.unavailable =
            std::string("libdnnl.so.2 could not be loaded (") + (why != nullptr ? why : "no reason given") + ")";
        return l;
      }
      // dlsym on the handle also searches its dependencies (libgomp).
      l.sgemm = reinterpret_cast<OneDnnLibrary::Sgemm>(dlsym(handle, "dnnl_sgemm"));
      l.set_threads = reinterpret_cast<OneDnnLibrary::SetThreads>(dlsym(handle, "omp_set_num_threads"));
      if (l.sgemm == nullptr || l.set_threads == nullptr) {
        l.unavailable = "libdnnl.so.2 has no dnnl_sgemm or no OpenMP runtime (omp_set_num_threads)";
        l.sgemm = nullptr;
        return l;
      }
      // The bf16 product needs AVX-512 in oneDNN 2.x: kept only where a 1 x 1
      // x 1 product runs (2 x 3 = 6, exact in bf16 and fp32).
      l.gemm_bf16 = reinterpret_cast<OneDnnLibrary::GemmBf16>(dlsym(handle, "dnnl_gemm_bf16bf16f32"));
      if (l.gemm_bf16 != nullptr) {
        const std::uint16_t two = float_to_bf16_bits(2.f), three = float_to_bf16_bits(3.f);
        float c = 0.f;
        l.set_threads(1);
        if (l.gemm_bf16('N', 'N', 1, 1, 1, 1.f, &two, 1, &three, 1, 0.f, &c, 1) != 0 || c != 6.f) l.gemm_bf16 = nullptr;
      }
      return l;
    }();
    return library;
  }

  DTRAIN_DECL const std::string& onednn_unavailable() { return onednn_library().unavailable; }

  DTRAIN_DECL host_gemm host_gemm_named(std::string_view name) {
    // Under an address-space limit (ulimit -v) auto takes OpenBLAS and does
    // not load oneDNN at all: its start-up and JIT code reserve address space
    // they do not check for (a process with the limit nearly used up by
    // OpenBLAS's pool died in oneDNN, 3 runs of 8).
    if (name.empty() || name == "auto")
      return !address_space_limit() && onednn_unavailable().empty() ? host_gemm::onednn : host_gemm::openblas;
    if (name == "openblas") return host_gemm::openblas;
    if (name == "onednn") {
      if (!onednn_unavailable().empty())
        throw config_error("DTRAIN_HOST_GEMM=onednn, but " + onednn_unavailable(),
                           "install oneDNN (Debian: apt install libdnnl2), or set DTRAIN_HOST_GEMM=openblas or auto");
      return host_gemm::onednn;
    }
    throw config_error("DTRAIN_HOST_GEMM='" + std::string(name) + "' is not a GEMM engine",
                       "set DTRAIN_HOST_GEMM to auto, onednn or openblas, or unset it");
  }

  DTRAIN_DECL host_gemm host_gemm_from_env() {
    static const host_gemm engine = [] {
      const char* raw = std::getenv("DTRAIN_HOST_GEMM");
      return host_gemm_named(raw == nullptr ? "" : raw);
    }();
    return engine;
  }

  DTRAIN_DECL SgemmFn sgemm_of(host_gemm engine) {
    if (engine == host_gemm::openblas)
      return [](int, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                std::int64_t ldc) {
        sgemm(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
        return 0;
      };
    if (!onednn_unavailable().empty())
      throw config_error("the oneDNN GEMM engine was asked for, but " + onednn_unavailable(),
                         "install oneDNN (Debian: apt install libdnnl2), or use host_gemm::openblas");
    return
        [](int threads, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
          const OneDnnLibrary& dnnl = onednn_library();
          dnnl.set_threads(threads);  // this thread's OpenMP team for the call: 1 on the pool's threads
          return dnnl.sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
        };
  }

  DTRAIN_DECL Bf16GemmFn bf16_gemm_of(host_gemm engine) {
    if (engine != host_gemm::onednn || onednn_library().gemm_bf16 == nullptr) return nullptr;
    return [](int threads, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
              const std::uint16_t* A, std::int64_t lda, const std::uint16_t* B, std::int64_t ldb, float beta, float* C,
              std::int64_t ldc) {
      const OneDnnLibrary& dnnl = onednn_library();
      dnnl.set_threads(threads);
      return dnnl.gemm_bf16(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    };
  }

  DTRAIN_DECL void sgemm_failed(host_gemm engine, int status, std::int64_t m, std::int64_t n, std::int64_t k) {
    throw error(std::string(engine == host_gemm::onednn ? "oneDNN's GEMM" : "OpenBLAS's sgemm") +
                    " failed with status " + std::to_string(status) + " on a " + std::to_string(m) + " x " +
                    std::to_string(n) + " x " + std::to_string(k) + " product",
                "set DTRAIN_HOST_GEMM=openblas to use the other engine, and report the shapes");
  }

  // Polls `a` until it differs from `old` (spinning for HostTuning::pool_spin,
  // then sleeping) and returns the new value.
  template <class T>
  T await_change(const std::atomic<T>& a, T old) {
    const auto until = std::chrono::steady_clock::now() + HostTuning::pool_spin;
    for (unsigned i = 1;; ++i) {
      const T now = a.load(std::memory_order_acquire);
      if (now != old) return now;
      if (i % 128 != 0) {
        cpu_relax();
      } else if (std::chrono::steady_clock::now() > until) {
        a.wait(old, std::memory_order_acquire);
      }
    }
  }

  DTRAIN_DECL HostPool::HostPool(int threads) {
    if (threads < 2 || static_cast<std::uint64_t>(threads) >= stop_parts)
      throw config_error("HostPool(" + std::to_string(threads) + "): a pool needs 2 to 65534 threads",
                         "use Host's thread count (OPENBLAS_NUM_THREADS or the rank's share of the cores)");
    workers_.reserve(static_cast<std::size_t>(threads - 1));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(static_cast<std::size_t>(i)); });
  }

  DTRAIN_DECL HostPool::~HostPool() {
    const std::uint64_t next = (word_.load(std::memory_order_relaxed) >> 16) + 1;
    word_.store(next << 16 | stop_parts, std::memory_order_release);
    word_.notify_all();
    for (auto& w : workers_) w.join();
  }

  DTRAIN_DECL bool HostPool::try_run(std::size_t parts, Task task, const void* job) {
    if (parts > static_cast<std::size_t>(threads()))
      throw config_error(
          "HostPool::try_run: " + std::to_string(parts) + " parts on " + std::to_string(threads()) + " threads",
          "split the work into at most threads() parts");
    if (busy_.exchange(true, std::memory_order_acquire)) return false;
    task_.store(task, std::memory_order_relaxed);
    job_.store(job, std::memory_order_relaxed);
    pending_.store(parts - 1, std::memory_order_relaxed);
    const std::uint64_t next = (word_.load(std::memory_order_relaxed) >> 16) + 1;
    word_.store(next << 16 | parts, std::memory_order_release);
    word_.notify_all();
    task(job, 0);
    for (std::size_t left = pending_.load(std::memory_order_acquire); left != 0;) left = await_change(pending_, left);
    busy_.store(false, std::memory_order_release);
    return true;
  }

  DTRAIN_DECL void HostPool::work(std::size_t index) {
    std::uint64_t seen = 0;
    for (;;) {
      seen = await_change(word_, seen);
      const std::uint64_t parts = seen & 0xffff;
      if (parts == stop_parts) return;
      if (index >= parts) continue;
      task_.load(std::memory_order_relaxed)(job_.load(std::memory_order_relaxed), index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  DTRAIN_DECL std::shared_ptr<HostPool> shared_host_pool(int threads) {
    static std::mutex mutex;
    static std::map<int, std::weak_ptr<HostPool>> pools;
    const std::lock_guard lock(mutex);
    std::weak_ptr<HostPool>& slot = pools[threads];
    std::shared_ptr<HostPool> pool = slot.lock();
    if (!pool) {
      pool = std::make_shared<HostPool>(threads);
      slot = pool;
    }
    return pool;
  }

  DTRAIN_DECL GemmSplit gemm_split(int threads, std::int64_t m, std::int64_t n, std::int64_t k) {
    constexpr std::int64_t min_work = HostTuning::gemm_min_work, block = HostTuning::gemm_block;
    GemmSplit split;
    split.by_rows = m >= n;
    const std::int64_t dim = split.by_rows ? m : n;
    const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / min_work;
    split.parts = std::max<std::int64_t>(
        1, std::min<std::int64_t>({threads, dim / block, work >= threads ? threads : static_cast<std::int64_t>(work)}));
    split.chunk = static_cast<std::int64_t>(
        range_chunk(static_cast<std::size_t>(dim), static_cast<std::size_t>(split.parts), block));
    return split;
  }

  DTRAIN_DECL int pool_sgemm(HostPool* pool, int threads, SgemmFn engine, bool trans_a, bool trans_b, std::int64_t m,
                             std::int64_t n, std::int64_t k, float alpha, const float* A, std::int64_t lda,
                             const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    // The blocks run on pool threads, where an exception would end the
    // process: check the dimensions here (each block's are no larger).
    (void)blas_int(m, "m"), (void)blas_int(n, "n"), (void)blas_int(k, "k");
    (void)blas_int(lda, "lda"), (void)blas_int(ldb, "ldb"), (void)blas_int(ldc, "ldc");
    const auto block = [&](bool by_rows, std::int64_t begin, std::int64_t size) {
      return by_rows ? engine(1, trans_a, trans_b, size, n, k, alpha, trans_a ? A + begin : A + begin * lda, lda, B,
                              ldb, beta, C + begin * ldc, ldc)
                     : engine(1, trans_a, trans_b, m, size, k, alpha, A, lda, trans_b ? B + begin * ldb : B + begin,
                              ldb, beta, C + begin, ldc);
    };
    return run_gemm_blocks(pool, gemm_split(threads, m, n, k), m, n, block);
  }

  }  // namespace detail

  DTRAIN_DECL Host::Host(int threads, host_threads mode, host_gemm gemm)
      : threads_(threads), gemm_(gemm), sgemm_(detail::sgemm_of(gemm)), bf16_gemm_(detail::bf16_gemm_of(gemm)) {
    if (threads < 1)
      throw config_error("dtrain::Host(" + std::to_string(threads) + "): the thread count must be >= 1",
                         "pass a positive thread count, or use Host() for the rank's share of the cores");
    check_blas_pool();
    start_pool(mode);
    apply_blas_threads();
  }

  DTRAIN_DECL Host::Host(int blas_env, from_env)
      : threads_(blas_env != 0 ? blas_env : blas_threads_per_rank(process_env)),
        gemm_(detail::host_gemm_from_env()),
        sgemm_(detail::sgemm_of(gemm_)),
        bf16_gemm_(detail::bf16_gemm_of(gemm_)) {
    check_blas_pool();
    start_pool(detail::host_threads_from_env());
    if (blas_env == 0 || pool_) apply_blas_threads();
  }

  DTRAIN_DECL void Host::start_pool(host_threads mode) {
    if (threads_ > 1 && mode == host_threads::pool) pool_ = detail::shared_host_pool(threads_);
  }

  DTRAIN_DECL void Host::sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                               const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                               std::int64_t ldc) {
    const int status = pool_ ? detail::pool_sgemm(pool_.get(), threads_, sgemm_, trans_a, trans_b, m, n, k, alpha, A,
                                                  lda, B, ldb, beta, C, ldc)
                             : sgemm_(threads_, trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    if (status != 0) detail::sgemm_failed(gemm_, status, m, n, k);
  }

  DTRAIN_DECL void Host::apply_blas_threads() const {
    // Changing the pool while another thread is inside a BLAS call is not
    // safe in every OpenBLAS build; skip the call when nothing would change.
    // OpenBLAS runs on one thread under dtrain's pool or when oneDNN
    // multiplies.
    const int blas = pool_ || gemm_ != host_gemm::openblas ? 1 : threads_;
    if (openblas_get_num_threads() != blas) openblas_set_num_threads(blas);
  }

  DTRAIN_DECL void Host::check_blas_pool() {
    const auto limit = address_space_limit();
    if (!limit) return;
    const int pool = openblas_get_num_threads();
    const int room = blas_threads_within(*limit);
    if (pool <= room) return;
    const auto mib = [](std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; };
    throw blas_pool_error(
        "OpenBLAS started " + std::to_string(pool) + " threads as it loaded, each reserving " +
            mib(blas_thread_address_space) + " of address space, and the address-space limit (ulimit -v) of " +
            mib(*limit) + " has room for " + std::to_string(room) +
            " (a quarter of it); a pool thread that finds no room waits for it forever",
        "set OPENBLAS_NUM_THREADS=" + std::to_string(room) +
            " or fewer before the program starts (dtrain-run sets it for its ranks), or raise the limit");
  }

}  // namespace dtrain

DTRAIN_IMPL_END
