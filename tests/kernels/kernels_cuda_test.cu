// dtrain::Cuda against dtrain::Host: the same functors, GEMMs and reductions
// on the same inputs, plus the device's own contract (buffers, copies,
// memory statistics, errors). Needs a GPU; exits 77 without one.
#include "support/gpu_main.hpp"
// gpu_main.hpp first: it sets Boost.Test up for its own main() before anything includes Boost.Test.

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.hpp"

#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/backend/host/device.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/optimizer.hpp"
#include "dtrain/kernels/reduce.hpp"

namespace {

namespace t = dtrain::testing;
using dtrain::bf16;
using dtrain::Cuda;
using dtrain::fp16;
using dtrain::Host;

// The same values on the host and on the GPU, to run one functor on both.
template <class T>
struct Mirror {
  std::vector<T> host;
  Cuda::buffer<T> device;

  Mirror(Cuda& dev, std::vector<T> values) : host(std::move(values)), device(dtrain::make_buffer<T>(dev, host.size())) {
    dev.copy_from_host(device.data(), host.data(), host.size());
  }
  std::vector<T> device_values(Cuda& dev) const {
    std::vector<T> out(host.size());
    dev.copy_to_host(out.data(), device.data(), out.size());
    return out;
  }
  // Both sides as float64, to compare with expect_close.
  std::vector<double> host_double() const { return t::to_double<T>(std::span<const T>(host)); }
  std::vector<double> device_double(Cuda& dev) const {
    const std::vector<T> v = device_values(dev);
    return t::to_double<T>(std::span<const T>(v));
  }
};

template <class T>
Mirror<T> random_mirror(Cuda& dev, std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  return Mirror<T>(dev, t::to_dtype<T>(t::random_nonzero(n, rng, scale)));
}

// Counts how often each index is visited.
struct CountVisits {
  std::uint32_t* hits;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { hits[i] += 1; }
};

struct IndexValue {
  DTRAIN_HOST_DEVICE double operator()(std::size_t i) const { return static_cast<double>(i); }
};

template <class T>
void compare_gemm(Cuda& cuda, bool ta, bool tb, float beta) {
  Host host(1);
  std::mt19937_64 rng(20);
  const std::int64_t m = 67, n = 45, k = 130;
  const std::int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
  auto a = random_mirror<T>(cuda, static_cast<std::size_t>((ta ? k : m) * lda), rng);
  auto b = random_mirror<T>(cuda, static_cast<std::size_t>((tb ? n : k) * ldb), rng);
  auto c = random_mirror<T>(cuda, static_cast<std::size_t>(m * ldc), rng);
  host.gemm(ta, tb, m, n, k, 0.5f, a.host.data(), lda, b.host.data(), ldb, beta, c.host.data(), ldc);
  cuda.gemm(ta, tb, m, n, k, 0.5f, a.device.data(), lda, b.device.data(), ldb, beta, c.device.data(), ldc);
  // Different summation orders in fp32, then possibly one rounding apart in T.
  t::expect_close(
      c.device_double(cuda), c.host_double(), 2 * t::roundoff<T>() + 1e-5,
      std::string("gemm ") + dtrain::dtype_traits<T>::name.data() + (ta ? " A^T" : " A") + (tb ? " B^T" : " B"));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_device)

BOOST_AUTO_TEST_CASE(buffers_copies_and_memory_statistics) {
  Cuda dev(0);
  BOOST_TEST(dev.device_id() == 0);
  BOOST_TEST(dev.stream() != nullptr);
  const std::size_t before = dev.memory_allocated();
  {
    auto z = dtrain::make_buffer<float>(dev, 1000, dtrain::zero_init);
    BOOST_TEST(dev.memory_allocated() == before + 4000);
    std::vector<float> back(1000, 1.f);
    dev.copy_to_host(back.data(), z.data(), back.size());
    for (float v : back) BOOST_TEST_REQUIRE(v == 0.f);

    const std::vector<float> src{1.f, 2.f, 3.f, 4.f};
    dev.copy_from_host(z.data(), src.data(), 4);
    auto moved = std::move(z);
    BOOST_TEST(z.data() == nullptr);
    auto other = dtrain::make_buffer<float>(dev, 4);
    dev.copy(other.data(), moved.data(), 4);
    dev.zero(other.data() + 1, 1);
    std::vector<float> out(4);
    dev.copy_to_host(out.data(), other.data(), 4);
    BOOST_TEST(out == (std::vector<float>{1.f, 0.f, 3.f, 4.f}), boost::test_tools::per_element());
  }
  BOOST_TEST(dev.memory_allocated() == before);
  BOOST_TEST(dev.peak_memory_allocated() >= before + 4016);
  float* w = dev.workspace<float>(256);
  BOOST_TEST(w != nullptr);
  BOOST_TEST(dev.memory_allocated() == before + 1024);
}

BOOST_AUTO_TEST_CASE(out_of_memory_reports_sizes_and_recovers) {
  Cuda dev(0);
  BOOST_CHECK_EXCEPTION(
      dtrain::make_buffer<std::byte>(dev, std::size_t{1} << 52), dtrain::cuda_error, [](const dtrain::cuda_error& e) {
        const std::string what = e.what();
        return what.find("out of memory") != std::string::npos && what.find("free of") != std::string::npos &&
               what.find(std::to_string(std::size_t{1} << 52) + " bytes") != std::string::npos;
      });
  auto ok = dtrain::make_buffer<float>(dev, 16);  // the error did not stick
  BOOST_TEST(ok.size() == 16u);
}

BOOST_AUTO_TEST_CASE(invalid_device_is_a_cuda_error) { BOOST_CHECK_THROW(Cuda(100000), dtrain::cuda_error); }

BOOST_AUTO_TEST_CASE(for_each_visits_every_index_once_and_sum_is_deterministic) {
  Cuda dev(0);
  const std::size_t n = (std::size_t{1} << 22) + 7;  // more than one grid-stride pass
  auto hits = dtrain::make_buffer<std::uint32_t>(dev, n, dtrain::zero_init);
  dev.for_each(n, CountVisits{hits.data()});
  std::vector<std::uint32_t> h(n);
  dev.copy_to_host(h.data(), hits.data(), n);
  for (std::size_t i = 0; i < n; ++i) BOOST_TEST_REQUIRE(h[i] == 1u, "index " << i);
  BOOST_TEST(dev.sum(n, IndexValue{}) == static_cast<double>(n) * (n - 1) / 2);
  BOOST_TEST(dev.sum(0, IndexValue{}) == 0.0);

  std::mt19937_64 rng(21);
  auto x = random_mirror<float>(dev, 1'000'003, rng);
  Host host(1);
  const double on_gpu = dtrain::squared_norm(dev, std::as_const(x.device).span());
  BOOST_TEST(on_gpu == dtrain::squared_norm(host, std::span<const float>(x.host)), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(dtrain::squared_norm(dev, std::as_const(x.device).span()) == on_gpu);  // bit for bit
}

BOOST_AUTO_TEST_CASE(gemm_matches_host) {
  Cuda dev(0);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.f, 0.5f}) {
        compare_gemm<float>(dev, ta, tb, beta);
        compare_gemm<bf16>(dev, ta, tb, beta);
        compare_gemm<fp16>(dev, ta, tb, beta);
      }
}

BOOST_AUTO_TEST_CASE(optimizer_functors_match_host) {
  Cuda dev(0);
  Host host(1);
  std::mt19937_64 rng(22);
  const std::size_t n = 100'003;
  auto p = random_mirror<float>(dev, n, rng);
  Mirror<float> m(dev, std::vector<float>(n)), v(dev, std::vector<float>(n)), sp(dev, p.host),
      buf(dev, std::vector<float>(n));
  Mirror<bf16> out(dev, std::vector<bf16>(n));
  Mirror<fp16> sout(dev, std::vector<fp16>(n));
  const dtrain::AdamWHyper adam{.lr = 1e-2f, .weight_decay = 0.1f};
  const dtrain::SgdHyper sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
  for (int step = 1; step <= 3; ++step) {
    const auto g = random_mirror<float>(dev, n, rng);
    // Step 2 starts one element in: buffers off 16-byte alignment take the
    // GPU's scalar path, the others its 4-wide path (n % 4 == 3: a tail too).
    const std::size_t o = step == 2 ? 1 : 0;
    host.for_each(n - o, dtrain::AdamWStep<bf16>({p.host.data() + o, g.host.data() + o, m.host.data() + o,
                                                  v.host.data() + o, out.host.data() + o},
                                                 adam, step, 0.5f));
    dev.for_each(n - o, dtrain::AdamWStep<bf16>({p.device.data() + o, g.device.data() + o, m.device.data() + o,
                                                 v.device.data() + o, out.device.data() + o},
                                                adam, step, 0.5f));
    host.for_each(n,
                  dtrain::SgdStep<fp16>({sp.host.data(), g.host.data(), buf.host.data(), sout.host.data()}, sgd, 0.5f));
    dev.for_each(n, dtrain::SgdStep<fp16>({sp.device.data(), g.device.data(), buf.device.data(), sout.device.data()},
                                          sgd, 0.5f));
  }
  // fp32 on both; the GPU may contract a*b+c into one FMA, a rounding apart.
  for (auto* mirror : {&p, &m, &v, &sp, &buf})
    t::expect_close(mirror->device_double(dev), mirror->host_double(), 1e-6, "optimizer state");
  t::expect_close(out.device_double(dev), out.host_double(), 2 * t::roundoff<bf16>(), "AdamW bf16 param_out");
  t::expect_close(sout.device_double(dev), sout.host_double(), 2 * t::roundoff<fp16>(), "SGD fp16 param_out");
}

BOOST_AUTO_TEST_CASE(elementwise_functors_and_non_finite_match_host_bit_for_bit) {
  Cuda dev(0);
  Host host(1);
  std::mt19937_64 rng(23);
  const std::size_t n = 50'001;
  auto src = random_mirror<float>(dev, n, rng, 1e3);
  src.host[17] = std::numeric_limits<float>::infinity();
  src.host[4242] = std::numeric_limits<float>::quiet_NaN();
  dev.copy_from_host(src.device.data(), src.host.data(), n);
  auto half = Mirror<bf16>(dev, std::vector<bf16>(n));
  auto acc = random_mirror<float>(dev, n, rng);
  host.for_each(n, dtrain::Cast<float, bf16>{src.host.data(), half.host.data()});
  dev.for_each(n, dtrain::Cast<float, bf16>{src.device.data(), half.device.data()});
  host.for_each(n, dtrain::AccumulateInto<bf16>{acc.host.data(), half.host.data()});
  dev.for_each(n, dtrain::AccumulateInto<bf16>{acc.device.data(), half.device.data()});
  host.for_each(n, dtrain::Scale<bf16>{half.host.data(), 0.3f});
  dev.for_each(n, dtrain::Scale<bf16>{half.device.data(), 0.3f});
  const std::vector<bf16> h = half.device_values(dev);
  const std::vector<float> a = acc.device_values(dev);
  for (std::size_t i = 0; i < n; ++i) {
    // A NaN's payload is not part of the contract: x86 propagates the input's,
    // the GPU returns its canonical NaN (seen on an H200: the NaN at 4242).
    const bool both_nan = std::isnan(static_cast<float>(h[i])) && std::isnan(static_cast<float>(half.host[i]));
    BOOST_TEST_REQUIRE((h[i].bits == half.host[i].bits || both_nan), "bf16 at " << i);
    BOOST_TEST_REQUIRE((a[i] == acc.host[i] || (std::isnan(a[i]) && std::isnan(acc.host[i]))), "accumulator at " << i);
  }
  // The cast with DTRAIN_ELEMENTWISE=wide: aligned, the 4-wide path with a
  // tail; one element in (off 8-byte alignment), the scalar one. The bits
  // are the host's either way.
  Cuda wide(0);
  wide.set_paths({.elementwise = dtrain::elementwise_kernels::wide});
  for (const std::size_t o : {std::size_t{0}, std::size_t{1}}) {
    auto cast = Mirror<bf16>(wide, std::vector<bf16>(n));
    auto from = Mirror<float>(wide, src.host);
    host.for_each(n - o, dtrain::Cast<float, bf16>{from.host.data() + o, cast.host.data() + o});
    wide.for_each(n - o, dtrain::Cast<float, bf16>{from.device.data() + o, cast.device.data() + o});
    const std::vector<bf16> got = cast.device_values(wide);
    for (std::size_t i = o; i < n; ++i) {
      const bool both_nan = std::isnan(static_cast<float>(got[i])) && std::isnan(static_cast<float>(cast.host[i]));
      BOOST_TEST_REQUIRE((got[i].bits == cast.host[i].bits || both_nan), "wide cast (offset " << o << ") at " << i);
    }
  }
  BOOST_TEST(dtrain::count_non_finite(dev, std::as_const(src.device).span()) == 2u);
  BOOST_TEST(!std::isfinite(dtrain::squared_norm(dev, std::as_const(half.device).span())));
}

BOOST_AUTO_TEST_SUITE_END()
