// dtrain::Host: buffers, copies, GEMM (row-major, all transposes, all dtypes)
// against float64, for_each/sum, the workspace and the BLAS thread sizing.
#define BOOST_TEST_MODULE device
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <list>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/launch/env.hpp"
#if DTRAIN_HAS_CUDA
#include "dtrain/backend/cuda/device.hpp"
#endif
#include "kernels/numeric.hpp"
#include "support/scoped_env.hpp"

namespace {

using dtrain::testing::expect_close;
using dtrain::testing::ScopedEnv;

// A row-major rows x cols matrix stored with leading dimension ld; the padding
// holds `pad` so a GEMM writing outside its columns is caught.
struct Strided {
  std::int64_t rows, cols, ld;
  std::vector<double> values;  // dense, rows x cols
  double at(std::int64_t r, std::int64_t c) const { return values[static_cast<std::size_t>(r * cols + c)]; }
  template <class T>
  std::vector<T> store(double pad) const {
    std::vector<T> out(static_cast<std::size_t>(rows * ld), T(static_cast<float>(pad)));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c)
        out[static_cast<std::size_t>(r * ld + c)] = T(static_cast<float>(at(r, c)));
    return out;
  }
};

template <class T>
Strided random_strided(std::int64_t rows, std::int64_t cols, std::mt19937_64& rng) {
  return {rows, cols, cols + 3,
          dtrain::testing::round_to<T>(dtrain::testing::random_nonzero(static_cast<std::size_t>(rows * cols), rng))};
}

template <class T>
void check_gemm(dtrain::host_gemm engine, int threads, std::int64_t m, std::int64_t n, std::int64_t k, bool ta, bool tb,
                float beta) {
  dtrain::Host dev(threads, dtrain::host_threads::pool, engine);
  std::mt19937_64 rng(10);
  const Strided a = random_strided<T>(ta ? k : m, ta ? m : k, rng);
  const Strided b = random_strided<T>(tb ? n : k, tb ? k : n, rng);
  const Strided c0 = random_strided<T>(m, n, rng);
  const float alpha = 0.75f;
  // With beta == 0 the old C is NaN: BLAS semantics say it is not read.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Strided c_in = c0;
  if (beta == 0.f) std::fill(c_in.values.begin(), c_in.values.end(), nan);
  const double pad = 1024.0;  // exact in every dtype
  std::vector<T> A = a.store<T>(pad), B = b.store<T>(pad), C = c_in.store<T>(pad);
  dev.gemm(ta, tb, m, n, k, alpha, A.data(), a.ld, B.data(), b.ld, beta, C.data(), c0.ld);

  std::vector<double> expected(static_cast<std::size_t>(m * n)), got(expected.size());
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p) acc += (ta ? a.at(p, i) : a.at(i, p)) * (tb ? b.at(j, p) : b.at(p, j));
      const auto e = static_cast<std::size_t>(i * n + j);
      expected[e] = alpha * acc + (beta == 0.f ? 0.0 : beta * c0.at(i, j));
      got[e] = static_cast<float>(C[static_cast<std::size_t>(i * c0.ld + j)]);
    }
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = n; j < c0.ld; ++j)
      BOOST_TEST_REQUIRE(static_cast<float>(C[static_cast<std::size_t>(i * c0.ld + j)]) == static_cast<float>(pad),
                         "gemm wrote into C's padding");
  // fp32 accumulation (~k float roundings), then one rounding to T.
  expect_close(got, expected, 1.5 * dtrain::testing::roundoff<T>() + 1e-6,
               std::string(engine == dtrain::host_gemm::onednn ? "onednn" : "openblas") + " gemm " + std::to_string(m) +
                   "x" + std::to_string(n) + "x" + std::to_string(k) + " on " + std::to_string(threads) +
                   " thread(s) " + dtrain::dtype_traits<T>::name.data() + (ta ? " A^T" : " A") + (tb ? " B^T" : " B"));
}

// Every GEMM engine this machine has (OpenBLAS always; oneDNN where
// libdnnl.so.2 loads, which scripts/setup.sh installs).
std::vector<dtrain::host_gemm> engines_here() {
  std::vector<dtrain::host_gemm> engines{dtrain::host_gemm::openblas};
  if (dtrain::detail::onednn_unavailable().empty()) engines.push_back(dtrain::host_gemm::onednn);
  return engines;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(host_device)

BOOST_AUTO_TEST_CASE(buffer_is_aligned_zeroed_move_only_and_counted) {
  static_assert(!std::is_copy_constructible_v<dtrain::Host::buffer<float>>);
  dtrain::Host dev(1);
  auto a = dtrain::make_buffer<float>(dev, 10, dtrain::zero_init);
  BOOST_TEST(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0u);
  BOOST_TEST(a.size() == 10u);
  for (float x : a.span()) BOOST_TEST_REQUIRE(x == 0.f);
  BOOST_TEST(dev.memory_allocated() == 40u);
  {
    auto b = dtrain::make_buffer<std::int32_t>(dev, 100);
    BOOST_TEST(dev.memory_allocated() == 440u);
    auto moved = std::move(b);
    BOOST_TEST(b.data() == nullptr);
    BOOST_TEST(b.empty());
    BOOST_TEST(moved.size() == 100u);
  }
  BOOST_TEST(dev.memory_allocated() == 40u);
  BOOST_TEST(dev.peak_memory_allocated() == 440u);
  dev.reset_peak_memory_allocated();
  BOOST_TEST(dev.peak_memory_allocated() == 40u);

  auto v = a.view(2, 5);
  BOOST_TEST((v.rows == 2 && v.cols == 5 && v.data == a.data()));
  BOOST_TEST(a.view(1, 3).size() == 3);  // a prefix
  BOOST_CHECK_THROW(a.view(3, 4), dtrain::config_error);
}

BOOST_AUTO_TEST_CASE(copies_and_zero) {
  dtrain::Host dev(1);
  const std::vector<float> src{1.f, -2.f, 3.f, 4.f};
  auto d = dtrain::make_buffer<float>(dev, 4);
  dev.copy_from_host(d.data(), src.data(), 4);
  auto e = dtrain::make_buffer<float>(dev, 4);
  dev.copy(e.data(), d.data(), 4);
  std::vector<float> back(4);
  dev.copy_to_host(back.data(), e.data(), 4);
  BOOST_TEST(back == src, boost::test_tools::per_element());
  dev.zero(e.data() + 1, 2);
  dev.copy_to_host(back.data(), e.data(), 4);
  BOOST_TEST(back == (std::vector<float>{1.f, 0.f, 0.f, 4.f}), boost::test_tools::per_element());
}

// Each engine, on one thread and split over the pool (the second shape:
// by rows at 3 threads), every dtype (bf16 through oneDNN's bf16 GEMM where
// this processor runs it).
BOOST_AUTO_TEST_CASE(gemm_row_major_all_transposes_and_dtypes) {
  struct Case {
    int threads;
    std::int64_t m, n, k;
  };
  for (const dtrain::host_gemm engine : engines_here())
    for (const Case c : {Case{1, 5, 7, 9}, Case{3, 203, 67, 91}, Case{3, 37, 301, 64}})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (float beta : {0.f, 0.5f}) {
            check_gemm<float>(engine, c.threads, c.m, c.n, c.k, ta, tb, beta);
            check_gemm<dtrain::bf16>(engine, c.threads, c.m, c.n, c.k, ta, tb, beta);
            check_gemm<dtrain::fp16>(engine, c.threads, c.m, c.n, c.k, ta, tb, beta);
          }
}

BOOST_AUTO_TEST_CASE(for_each_and_sum_cover_every_index) {
  dtrain::Host dev(1);
  std::vector<int> hits(1001);
  dev.for_each(hits.size(), [&](std::size_t i) { ++hits[i]; });
  for (int h : hits) BOOST_TEST_REQUIRE(h == 1);
  BOOST_TEST(dev.sum(1001, [](std::size_t i) { return static_cast<double>(i); }) == 500500.0);
  BOOST_TEST(dev.sum(0, [](std::size_t) { return 1.0; }) == 0.0);
}

BOOST_AUTO_TEST_CASE(workspace_grows_and_is_reused) {
  dtrain::Host dev(1);
  float* w = dev.workspace<float>(100);
  BOOST_TEST(dev.memory_allocated() == 400u);
  BOOST_TEST(reinterpret_cast<void*>(dev.workspace<double>(10)) == reinterpret_cast<void*>(w));
  dev.workspace<float>(1000);
  BOOST_TEST(dev.memory_allocated() == 4000u);
  // The old block is freed before the new one is taken.
  BOOST_TEST(dev.peak_memory_allocated() == 4000u);
}

BOOST_AUTO_TEST_CASE(blas_threads_follow_the_rank_share_of_cores) {
  {
    // OpenBLAS's own threads run the GEMMs; with dtrain's pool (the
    // default) the pool splits them and OpenBLAS runs on one thread.
    const dtrain::Host dev(3, dtrain::host_threads::openblas, dtrain::host_gemm::openblas);
    BOOST_TEST(dev.threads() == 3);
    BOOST_TEST(openblas_get_num_threads() == 3);
    const dtrain::Host pooled(3);
    BOOST_TEST(pooled.threads() == 3);
    BOOST_TEST((pooled.threads_mode() == dtrain::host_threads::pool));
    BOOST_TEST(openblas_get_num_threads() == 1);
  }
  BOOST_CHECK_THROW(dtrain::Host(0), dtrain::config_error);
  // The share is of the cores this process may use (the affinity mask), as
  // dtrain-run computes it, and the ranks on this node come from whichever
  // launcher's variables are present.
  const int cores = dtrain::usable_cpu_count();
  const int half = std::max(1, cores / 2);
  std::list<ScopedEnv> unset;  // whatever launcher runs this test
  for (const char* name :
       {"OPENBLAS_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID",
        "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"})
    unset.emplace_back(name, std::nullopt);
  {
    ScopedEnv local("LOCAL_WORLD_SIZE", "2");  // dtrain-run, torchrun
    const dtrain::Host dev;
    BOOST_TEST(dev.threads() == half);
    const bool blas_threads =
        dev.threads_mode() == dtrain::host_threads::openblas && dev.gemm_engine() == dtrain::host_gemm::openblas;
    BOOST_TEST(openblas_get_num_threads() == (blas_threads ? dev.threads() : 1));
  }
  {
    ScopedEnv local("OMPI_COMM_WORLD_LOCAL_SIZE", "2");  // mpirun
    BOOST_TEST(dtrain::Host().threads() == half);
  }
  {
    // srun: this node's entry of the step's per-node task counts.
    ScopedEnv task("SLURM_PROCID", "3"), node("SLURM_NODEID", "1"), counts("SLURM_STEP_TASKS_PER_NODE", "1,2");
    BOOST_TEST(dtrain::Host().threads() == half);
  }
  {
    // The launcher's variables in precedence order: torchrun's over mpirun's.
    ScopedEnv local("LOCAL_WORLD_SIZE", "1"), ompi("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    BOOST_TEST(dtrain::Host().threads() == cores);
  }
  BOOST_TEST(dtrain::Host().threads() == cores);  // no launcher: one rank on the node
  {
    ScopedEnv blas5("OPENBLAS_NUM_THREADS", "5");
    BOOST_TEST(dtrain::Host().threads() == 5);  // the user's setting wins
  }
  auto names = [](const char* text) {
    return [text](const dtrain::error& e) { return std::string(e.what()).find(text) != std::string::npos; };
  };
  {
    ScopedEnv local("LOCAL_WORLD_SIZE", "two");
    BOOST_CHECK_EXCEPTION(dtrain::Host(), dtrain::env_error, names("LOCAL_WORLD_SIZE='two' is not an integer"));
  }
  {
    ScopedEnv local("OMPI_COMM_WORLD_LOCAL_SIZE", "0");
    BOOST_CHECK_EXCEPTION(dtrain::Host(), dtrain::env_error,
                          names("OMPI_COMM_WORLD_LOCAL_SIZE=0: a node runs at least one rank"));
  }
  {
    ScopedEnv task("SLURM_PROCID", "0"), node("SLURM_NODEID", "2"), counts("SLURM_STEP_TASKS_PER_NODE", "2(x2)");
    BOOST_CHECK_EXCEPTION(dtrain::Host(), dtrain::env_error, names("SLURM_NODEID=2 has no entry in"));
  }
}

// DTRAIN_HOST_THREADS=pool: dtrain's own threads split GEMMs by rows or
// columns, batches of GEMMs by matrices and for_each by ranges (a row
// functor's by rows). A split GEMM is a product (against float64), never
// writes outside C, and gives the same bits on every call; it may differ
// from the unsplit call in the last bits (OpenBLAS chooses its kernel by
// the size of what it is given). A batch's matrices and for_each's indices
// are computed exactly as on one thread. Every index runs once, also when
// two threads share the pool or a task calls for_each itself.
// Every engine here (engines_here), oneDNN also on its own OpenMP threads.

BOOST_AUTO_TEST_CASE(pool_splits_are_products_and_repeat_bit_for_bit) {
  for (const dtrain::host_gemm engine : engines_here()) {
    BOOST_TEST_MESSAGE("engine " << (engine == dtrain::host_gemm::onednn ? "onednn" : "openblas"));
    dtrain::Host serial(1, dtrain::host_threads::pool, engine), pool(3, dtrain::host_threads::pool, engine);
    // oneDNN on its own OpenMP threads (OpenBLAS's thread count is the
    // process's, so its own threads are not mixed with the pool here)
    std::optional<dtrain::Host> own;
    if (engine == dtrain::host_gemm::onednn) own.emplace(2, dtrain::host_threads::openblas, engine);
    BOOST_TEST((pool.threads_mode() == dtrain::host_threads::pool));
    BOOST_TEST((pool.gemm_engine() == engine));
    BOOST_TEST(openblas_get_num_threads() == 1);
    std::mt19937_64 rng(45);
    struct Shape {
      std::int64_t m, n, k;
    };
    // split by rows (m >= n), by columns, uneven tails, and one too small to split
    for (const Shape s : {Shape{203, 67, 91}, Shape{37, 301, 64}, Shape{130, 129, 33}, Shape{9, 11, 7}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const Strided a = random_strided<float>(ta ? s.k : s.m, ta ? s.m : s.k, rng);
          const Strided b = random_strided<float>(tb ? s.n : s.k, tb ? s.k : s.n, rng);
          const Strided c = random_strided<float>(s.m, s.n, rng);
          const double pad = 7.0;
          const std::vector<float> A = a.store<float>(pad), B = b.store<float>(pad);
          std::vector<float> C1 = c.store<float>(pad), C3 = C1, again = C1, C2 = C1;
          serial.gemm(ta, tb, s.m, s.n, s.k, 0.5f, A.data(), a.ld, B.data(), b.ld, 0.25f, C1.data(), c.ld);
          if (own) own->gemm(ta, tb, s.m, s.n, s.k, 0.5f, A.data(), a.ld, B.data(), b.ld, 0.25f, C2.data(), c.ld);
          pool.gemm(ta, tb, s.m, s.n, s.k, 0.5f, A.data(), a.ld, B.data(), b.ld, 0.25f, C3.data(), c.ld);
          pool.gemm(ta, tb, s.m, s.n, s.k, 0.5f, A.data(), a.ld, B.data(), b.ld, 0.25f, again.data(), c.ld);
          const std::string what = std::string(engine == dtrain::host_gemm::onednn ? "onednn" : "openblas") + " gemm " +
                                   std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
                                   (ta ? " A^T" : " A") + (tb ? " B^T" : " B");
          BOOST_TEST((C3 == again), what << ": two calls differ");
          // against float64 (fp32 accumulation over k), and beside the unsplit call
          double worst = 0.0, apart = 0.0, threaded = 0.0;
          for (std::int64_t i = 0; i < s.m; ++i) {
            for (std::int64_t j = 0; j < s.n; ++j) {
              double acc = 0.0;
              for (std::int64_t p = 0; p < s.k; ++p)
                acc += (ta ? a.at(p, i) : a.at(i, p)) * (tb ? b.at(j, p) : b.at(p, j));
              const double want = 0.5 * acc + 0.25 * c.at(i, j);
              const auto e = static_cast<std::size_t>(i * c.ld + j);
              worst = std::max(worst, std::abs(C3[e] - want) / (1.0 + std::abs(want)));
              apart = std::max(apart, std::abs(double{C3[e]} - double{C1[e]}) / (1.0 + std::abs(want)));
              if (own) threaded = std::max(threaded, std::abs(C2[e] - want) / (1.0 + std::abs(want)));
            }
            for (std::int64_t j = s.n; j < c.ld; ++j) {
              BOOST_TEST_REQUIRE(C3[static_cast<std::size_t>(i * c.ld + j)] == static_cast<float>(pad),
                                 what << ": wrote into C's padding");
              BOOST_TEST_REQUIRE(C2[static_cast<std::size_t>(i * c.ld + j)] == static_cast<float>(pad),
                                 what << ": wrote into C's padding");
            }
          }
          BOOST_TEST(worst < 1e-5, what << ": " << worst << " from float64");
          BOOST_TEST(threaded < 1e-5, what << " on the engine's threads: " << threaded << " from float64");
          BOOST_TEST(apart < 1e-5, what << ": " << apart << " from the unsplit call");
        }
    // a batch of GEMMs, split by matrices
    const std::int64_t batch = 7, m = 33, n = 29, k = 17;
    const Strided a = random_strided<float>(batch * m, k, rng), b = random_strided<float>(batch * k, n, rng);
    const std::vector<float> A = a.store<float>(7.0), B = b.store<float>(7.0);
    std::vector<float> C1(static_cast<std::size_t>(batch * m * n), 3.f), C3 = C1;
    serial.gemm_batched(false, false, m, n, k, 1.f, A.data(), a.ld, m * a.ld, B.data(), b.ld, k * b.ld, 0.f, C1.data(),
                        n, m * n, batch);
    pool.gemm_batched(false, false, m, n, k, 1.f, A.data(), a.ld, m * a.ld, B.data(), b.ld, k * b.ld, 0.f, C3.data(), n,
                      m * n, batch);
    BOOST_TEST((C1 == C3));
  }
}

// DTRAIN_HOST_GEMM: auto (or unset) takes oneDNN where it loads, each engine
// by name, oneDNN where it cannot load and any other name an error saying
// what to do.
BOOST_AUTO_TEST_CASE(host_gemm_engine_by_name) {
  using dtrain::host_gemm;
  const bool have_onednn = dtrain::detail::onednn_unavailable().empty();
  // (under ulimit -v auto takes OpenBLAS)
  const host_gemm best = have_onednn && !dtrain::address_space_limit() ? host_gemm::onednn : host_gemm::openblas;
  BOOST_TEST((dtrain::detail::host_gemm_named("") == best));
  BOOST_TEST((dtrain::detail::host_gemm_named("auto") == best));
  BOOST_TEST((dtrain::detail::host_gemm_named("openblas") == host_gemm::openblas));
  BOOST_TEST((dtrain::Host(2, dtrain::host_threads::pool, host_gemm::openblas).gemm_engine() == host_gemm::openblas));
  auto says = [](const char* text) {
    return [text](const dtrain::config_error& e) { return std::string(e.what()).find(text) != std::string::npos; };
  };
  if (have_onednn) {
    BOOST_TEST((dtrain::detail::host_gemm_named("onednn") == host_gemm::onednn));
  } else {
    BOOST_CHECK_EXCEPTION(dtrain::detail::host_gemm_named("onednn"), dtrain::config_error, says("libdnnl2"));
    BOOST_CHECK_EXCEPTION(dtrain::Host(2, dtrain::host_threads::pool, host_gemm::onednn), dtrain::config_error,
                          says("libdnnl2"));
  }
  BOOST_CHECK_EXCEPTION(dtrain::detail::host_gemm_named("mkl"), dtrain::config_error,
                        says("DTRAIN_HOST_GEMM='mkl' is not a GEMM engine"));
}

namespace {
// A row functor: each index is a row of `cols` elements.
struct CountRows {
  std::vector<int>* hits;
  std::size_t cols;
  std::size_t work_per_index() const { return cols; }
  void operator()(std::size_t r) const {
    for (std::size_t c = 0; c < cols; ++c) ++(*hits)[r * cols + c];
  }
};
// A row functor for sums: each index sums a row of `cols` squares.
struct RowSquares {
  const std::vector<float>* x;
  std::size_t cols;
  std::size_t work_per_index() const { return cols; }
  double operator()(std::size_t r) const {
    double s = 0.0;
    for (std::size_t c = 0; c < cols; ++c) s += double{(*x)[r * cols + c]} * (*x)[r * cols + c];
    return s;
  }
};

// Four rows, each of which runs a for_each of its own.
struct Nested {
  dtrain::Host* dev;
  std::vector<std::atomic<int>>* cells;
  std::size_t per;
  std::size_t work_per_index() const { return per; }
  void operator()(std::size_t part) const {
    dev->for_each(per, [this, part](std::size_t i) { ++(*cells)[part * per + i]; });
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(pool_runs_every_index_once) {
  dtrain::Host pool(3, dtrain::host_threads::pool);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{8193}, std::size_t{1} << 17,
                        (std::size_t{1} << 17) + 7}) {
    std::vector<int> hits(n);
    pool.for_each(n, [&](std::size_t i) { ++hits[i]; });
    BOOST_TEST_REQUIRE(std::count(hits.begin(), hits.end(), 1) == static_cast<std::ptrdiff_t>(n));
  }
  // rows: 97 rows of 300 are worth splitting though 97 indices are not
  std::vector<int> cells(97 * 300);
  pool.for_each(97, CountRows{&cells, 300});
  BOOST_TEST(std::count(cells.begin(), cells.end(), 1) == static_cast<std::ptrdiff_t>(cells.size()));
  // a task that calls for_each, and two threads sharing the pool: the
  // second caller runs its range itself
  std::vector<std::atomic<int>> many(std::size_t{1} << 16);
  pool.for_each(4, Nested{&pool, &many, many.size() / 4});
  BOOST_TEST(std::count_if(many.begin(), many.end(), [](const auto& v) { return v == 1; }) ==
             static_cast<std::ptrdiff_t>(many.size()));
  std::vector<int> left(std::size_t{1} << 18), right(std::size_t{1} << 18);
  for (int round = 0; round < 50; ++round) {
    std::thread other([&] { pool.for_each(right.size(), [&](std::size_t i) { ++right[i]; }); });
    pool.for_each(left.size(), [&](std::size_t i) { ++left[i]; });
    other.join();
  }
  BOOST_TEST(std::count(left.begin(), left.end(), 50) == static_cast<std::ptrdiff_t>(left.size()));
  BOOST_TEST(std::count(right.begin(), right.end(), 50) == static_cast<std::ptrdiff_t>(right.size()));
}

// Host::sum adds fixed blocks in order: the same bits on one thread, on the
// pool and with OpenBLAS's threads, with or without blocks, and a sum
// (against float64 accumulated in long double).
BOOST_AUTO_TEST_CASE(sums_give_the_same_bits_at_every_thread_count) {
  dtrain::Host serial(1), pool(3, dtrain::host_threads::pool), openblas(2, dtrain::host_threads::openblas);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(300001);
  for (float& v : x) v = normal(rng);
  const auto square = [&x](std::size_t i) { return double{x[i]} * x[i]; };
  for (std::size_t n : {std::size_t{1000}, std::size_t{16384}, std::size_t{16385}, x.size()}) {
    const double one = serial.sum(n, square);
    BOOST_TEST(pool.sum(n, square) == one, "n " << n);
    BOOST_TEST(openblas.sum(n, square) == one, "n " << n);
    long double want = 0;
    for (std::size_t i = 0; i < n; ++i) want += static_cast<long double>(x[i]) * x[i];
    BOOST_TEST(std::abs(one - static_cast<double>(want)) <= 1e-12 * static_cast<double>(want), "n " << n);
  }
  // rows: 100 rows of 3000, blocks of whole rows
  const RowSquares rows{&x, 3000};
  const double one = serial.sum(100, rows);
  BOOST_TEST(pool.sum(100, rows) == one);
  long double want = 0;
  for (std::size_t i = 0; i < 300000; ++i) want += static_cast<long double>(x[i]) * x[i];
  BOOST_TEST(std::abs(one - static_cast<double>(want)) <= 1e-12 * static_cast<double>(want));
}

BOOST_AUTO_TEST_CASE(host_threads_mode_by_name) {
  BOOST_TEST((dtrain::detail::host_threads_named("") == dtrain::host_threads::pool));
  BOOST_TEST((dtrain::detail::host_threads_named("openblas") == dtrain::host_threads::openblas));
  BOOST_TEST((dtrain::detail::host_threads_named("pool") == dtrain::host_threads::pool));
  BOOST_CHECK_EXCEPTION(
      dtrain::detail::host_threads_named("omp"), dtrain::config_error, [](const dtrain::config_error& e) {
        return std::string(e.what()).find("DTRAIN_HOST_THREADS='omp' is not a thread mode") != std::string::npos;
      });
  // one thread is one thread: no pool to start
  BOOST_TEST((dtrain::Host(1, dtrain::host_threads::pool).threads_mode() == dtrain::host_threads::openblas));
}

#if DTRAIN_HAS_CUDA
// The GPU's kernel-path switches (docs/gpu.md, "Kernel paths") are read from
// the environment on the host, before any GPU is touched: the old paths by
// default, each new one by name, anything else an error naming the choices.
BOOST_AUTO_TEST_CASE(gpu_kernel_paths_come_from_the_environment) {
  const dtrain::CudaPaths defaults = dtrain::CudaPaths::from_env();
  BOOST_TEST((defaults.rows == dtrain::row_kernels::thread));
  BOOST_TEST((defaults.attention == dtrain::attention_kernels::reference));
  BOOST_TEST((defaults.elementwise == dtrain::elementwise_kernels::scalar));
  {
    ScopedEnv rows("DTRAIN_ROW_KERNELS", "lanes"), attention("DTRAIN_ATTENTION", "cudnn"),
        wide("DTRAIN_ELEMENTWISE", "wide");
    const dtrain::CudaPaths p = dtrain::CudaPaths::from_env();
    BOOST_TEST((p.rows == dtrain::row_kernels::lanes));
    BOOST_TEST((p.attention == dtrain::attention_kernels::cudnn));
    BOOST_TEST((p.elementwise == dtrain::elementwise_kernels::wide));
  }
  ScopedEnv bad("DTRAIN_ATTENTION", "flash");
  BOOST_CHECK_EXCEPTION(dtrain::CudaPaths::from_env(), dtrain::config_error, [](const dtrain::config_error& e) {
    return std::string(e.what()).find("DTRAIN_ATTENTION='flash' is not one of reference|cudnn") != std::string::npos;
  });
}
#endif

BOOST_AUTO_TEST_SUITE_END()
