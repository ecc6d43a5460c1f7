// dtrain::Host: buffers, copies, GEMM (row-major, all transposes, all dtypes)
// against float64, for_each/sum, the workspace and the BLAS thread sizing.
#define BOOST_TEST_MODULE device
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dtrain/device/host.hpp"
#include "dtrain/launch/env.hpp"
#if DTRAIN_HAS_CUDA
#include "dtrain/device/cuda.hpp"
#endif
#include "kernels/numeric.hpp"

namespace {

using dtrain::testing::expect_close;

// Sets (or unsets, with nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

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
      for (std::int64_t c = 0; c < cols; ++c) out[static_cast<std::size_t>(r * ld + c)] = T(static_cast<float>(at(r, c)));
    return out;
  }
};

template <class T>
Strided random_strided(std::int64_t rows, std::int64_t cols, std::mt19937_64& rng) {
  return {rows, cols, cols + 3,
          dtrain::testing::round_to<T>(dtrain::testing::random_nonzero(static_cast<std::size_t>(rows * cols), rng))};
}

template <class T>
void check_gemm(bool ta, bool tb, float beta) {
  dtrain::Host dev(1);
  std::mt19937_64 rng(10);
  const std::int64_t m = 5, n = 7, k = 9;
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
               std::string("gemm ") + dtrain::dtype_traits<T>::name.data() + (ta ? " A^T" : " A") + (tb ? " B^T" : " B"));
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

BOOST_AUTO_TEST_CASE(gemm_row_major_all_transposes_and_dtypes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 0.5f}) {
        check_gemm<float>(ta, tb, beta);
        check_gemm<dtrain::bf16>(ta, tb, beta);
        check_gemm<dtrain::fp16>(ta, tb, beta);
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
    const dtrain::Host dev(3);
    BOOST_TEST(dev.threads() == 3);
    BOOST_TEST(openblas_get_num_threads() == 3);
  }
  BOOST_CHECK_THROW(dtrain::Host(0), dtrain::config_error);
  // The share is of the cores this process may use (the affinity mask), as
  // dtrain-run computes it, and the ranks on this node come from whichever
  // launcher's variables are present.
  const int cores = dtrain::usable_cpu_count();
  const int half = std::max(1, cores / 2);
  std::list<ScopedEnv> unset;  // whatever launcher runs this test
  for (const char* name : {"OPENBLAS_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                           "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
                           "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"})
    unset.emplace_back(name, std::nullopt);
  {
    ScopedEnv local("LOCAL_WORLD_SIZE", "2");  // dtrain-run, torchrun
    const dtrain::Host dev;
    BOOST_TEST(dev.threads() == half);
    BOOST_TEST(openblas_get_num_threads() == dev.threads());
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
