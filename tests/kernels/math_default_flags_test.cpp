// math::sqrt as a translation unit built without -fno-math-errno (the
// default, what a header-only user gets) computes it: with GCC on x86-64
// through dtrain_sqrt_lanes's SIMD variants (kernels/math.hpp), which must
// give the correctly rounded square root at every instruction level and
// leave loops that use it vectorised (bench_adamw measures the speed).
#define BOOST_TEST_MODULE math_default_flags
#include <cmath>
#include <limits>

#include "kernels/sqrt_check.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/kernels/math.hpp>

#if defined(__NO_MATH_ERRNO__)
#error "math_default_flags_test checks the default flags: build it without -fno-math-errno"
#endif

BOOST_AUTO_TEST_CASE(the_default_build_takes_the_simd_square_root_with_gcc_on_x86_64) {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  BOOST_TEST(DTRAIN_SQRT_LANES == 1);
#else
  BOOST_TEST(DTRAIN_SQRT_LANES == 0);
#endif
}

BOOST_AUTO_TEST_CASE(math_sqrt_is_correctly_rounded_at_every_instruction_level_by_default) {
  dtrain::testing::check_sqrt_patterns([](float x) { return dtrain::math::sqrt(x); }, "math::sqrt");
  const float inf = std::numeric_limits<float>::infinity();
  BOOST_TEST(dtrain::math::sqrt(0.f) == 0.f);
  BOOST_TEST(std::signbit(dtrain::math::sqrt(-0.f)));
  BOOST_TEST(dtrain::math::sqrt(inf) == inf);
  BOOST_TEST(std::isnan(dtrain::math::sqrt(-1.f)));
  BOOST_TEST(dtrain::math::sqrt(4.f) == 2.f);
}
