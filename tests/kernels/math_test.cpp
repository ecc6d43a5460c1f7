// dtrain's own host exp, erf and sqrt (kernels/math.hpp) against float64 libm.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/sqrt_check.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/backend/host/device.hpp>
#include <dtrain/kernels/math.hpp>

BOOST_AUTO_TEST_CASE(host_exp_is_within_one_ulp_of_float64) {
  double worst = 0;
  for (double v = -87.3; v <= 88.7; v += 3.7e-4) {
    const float x = static_cast<float>(v);
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(dtrain::math::exp(x) - want) / want);
  }
  BOOST_TEST_MESSAGE("exp: worst relative error " << worst);
  BOOST_TEST(worst < 1.2e-7);  // one float ulp is 2^-23 = 1.19e-7 relative at most
}

// math::erf (the rational fit GELU's forward uses) and math::erf_given_exp
// (the series and Abramowitz & Stegun's form GELU's backward uses, given
// exp(-x^2)), each over [-6, 6] against float64.
BOOST_AUTO_TEST_CASE(host_erf_is_within_a_few_ulp_of_float64) {
  for (const bool given_exp : {false, true}) {
    double worst_abs = 0, worst_rel_small = 0;
    for (double v = -6; v <= 6; v += 1.3e-5) {
      const float x = static_cast<float>(v);
      const double want = std::erf(static_cast<double>(x));
      const float got = given_exp ? dtrain::math::erf_given_exp(x, dtrain::math::exp(-(x * x))) : dtrain::math::erf(x);
      const double err = std::abs(got - want);
      worst_abs = std::max(worst_abs, err);
      if (std::abs(x) < 0.5f && x != 0.f) worst_rel_small = std::max(worst_rel_small, err / std::abs(want));
    }
    BOOST_TEST_MESSAGE((given_exp ? "erf_given_exp" : "erf")
                       << ": worst absolute error " << worst_abs << ", relative below 0.5 " << worst_rel_small);
    // the fit's 1.4e-9 and Abramowitz & Stegun 7.1.26's 1.5e-7, plus fp32
    // evaluation (the rational's 2.7e-7 with fused multiply-adds, 3.8e-7 at
    // x86-64's baseline, where this test's own calls run)
    BOOST_TEST(worst_abs < 4e-7);
    BOOST_TEST(worst_rel_small < 2.5e-7);  // both keep relative accuracy near 0
  }
  const double tiny = dtrain::math::erf(1e-30f), tiny_want = 1.1283791670955126 * static_cast<double>(1e-30f);
  BOOST_TEST(std::abs(tiny - tiny_want) <= 1.2e-7 * tiny_want);  // no underflow to 0, one ulp
  BOOST_TEST(dtrain::math::erf(3.92f) == 1.f);                   // the clamp
  BOOST_TEST(dtrain::math::erf(-50.f) == -1.f);                  // past it
}

BOOST_AUTO_TEST_CASE(host_exp_and_erf_special_values) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  BOOST_TEST(dtrain::math::exp(-inf) == 0.f);
  BOOST_TEST(dtrain::math::exp(-100.f) == 0.f);  // below the normal range: flushed to 0
  BOOST_TEST(std::isinf(dtrain::math::exp(inf)));
  BOOST_TEST(std::isinf(dtrain::math::exp(89.f)));
  BOOST_TEST(std::isnan(dtrain::math::exp(nan)));
  BOOST_TEST(dtrain::math::exp(0.f) == 1.f);
  BOOST_TEST(dtrain::math::erf(inf) == 1.f);
  BOOST_TEST(dtrain::math::erf(-inf) == -1.f);
  BOOST_TEST(std::isnan(dtrain::math::erf(nan)));
  BOOST_TEST(dtrain::math::erf(0.f) == 0.f);
}

// The float64 square root rounded to float is the correctly rounded float
// square root (53 >= 2 x 24 + 2 bits: the double rounding is innocuous); the
// whole 2^32 patterns were checked once the same way (every level, no
// mismatch). math::sqrt itself, as this target's flags (-fno-math-errno)
// pick it, and without those flags: math_default_flags_test.cpp.
BOOST_AUTO_TEST_CASE(host_sqrt_is_correctly_rounded_at_every_instruction_level) {
  dtrain::testing::check_sqrt_patterns([](float x) { return dtrain::math::host_impl::sqrt_host(x); }, "sqrt_host");
  dtrain::testing::check_sqrt_patterns([](float x) { return dtrain::math::sqrt(x); }, "math::sqrt");
  const float inf = std::numeric_limits<float>::infinity();
  using dtrain::math::host_impl::sqrt_host;
  BOOST_TEST(std::bit_cast<std::uint32_t>(sqrt_host(-0.f)) == std::bit_cast<std::uint32_t>(-0.f));
  BOOST_TEST(sqrt_host(0.f) == 0.f);
  BOOST_TEST(sqrt_host(inf) == inf);
  BOOST_TEST(std::isnan(sqrt_host(-inf)));
  BOOST_TEST(std::isnan(sqrt_host(-1e-30f)));
  BOOST_TEST(std::isnan(sqrt_host(std::numeric_limits<float>::quiet_NaN())));
  BOOST_TEST(sqrt_host(std::numeric_limits<float>::denorm_min()) == static_cast<float>(std::sqrt(0x1p-149)));
  BOOST_TEST(sqrt_host(4.f) == 2.f);
}
