#define BOOST_TEST_MODULE core
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <dtrain/core/dtype.hpp>
#include <dtrain/core/element.hpp>

#if DTRAIN_HAS_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

using namespace dtrain;

namespace {

// Independent reference: among all finite values of the 16-bit format (and
// its infinity), the one nearest to x in float64; ties go to the even
// (last bit 0) encoding. Built once as sorted tables of positive values.
struct Table {
  std::vector<double> value;  // ascending, positive encodings 0x0000.. up to the largest finite
  std::vector<std::uint16_t> bits;
  double overflow;  // values at or beyond this round to infinity
  std::uint16_t inf_bits;
};

template <class H>
Table make_table(std::uint16_t inf_bits) {
  Table t;
  for (std::uint32_t b = 0; b < inf_bits; ++b) {
    t.value.push_back(static_cast<float>(H::from_bits(static_cast<std::uint16_t>(b))));
    t.bits.push_back(static_cast<std::uint16_t>(b));
  }
  // Rounding to nearest even sends the midpoint between the largest finite
  // value and the next power step (max + ulp/2) to infinity.
  const double top = t.value.back(), ulp = top - t.value[t.value.size() - 2];
  t.overflow = top + ulp / 2;
  t.inf_bits = inf_bits;
  return t;
}

std::uint16_t reference(const Table& t, float xf) {
  const double x = xf;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::abs(x);
  if (a >= t.overflow) return sign | t.inf_bits;
  const auto it = std::lower_bound(t.value.begin(), t.value.end(), a);
  const std::size_t hi = static_cast<std::size_t>(it - t.value.begin());
  if (hi == 0) return sign | t.bits[0];
  if (hi == t.value.size()) return sign | t.bits.back();  // above the largest finite value, below the overflow midpoint
  const std::size_t lo = hi - 1;
  const double dlo = a - t.value[lo], dhi = t.value[hi] - a;
  const std::size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((t.bits[lo] & 1) ? hi : lo);
  return sign | t.bits[pick];
}

float random_float(std::mt19937& gen) {
  // Uniform over bit patterns: covers subnormals, huge values, every exponent.
  std::uint32_t u;
  do u = gen();
  while (((u >> 23) & 0xff) == 0xff);  // NaN/inf handled separately
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

BOOST_AUTO_TEST_CASE(bf16_and_fp16_round_to_nearest_even_like_a_float64_reference) {
  const Table tb = make_table<bf16>(0x7f80), th = make_table<fp16>(0x7c00);
  std::mt19937 gen(1234);
  std::size_t bad_b = 0, bad_h = 0;
  for (int i = 0; i < 2'000'000; ++i) {
    float x = random_float(gen);
    if (i % 2) x = std::ldexp(x, -std::ilogb(x) + static_cast<int>(gen() % 40) - 26);  // fp16's range too
    if (bf16(x).bits != reference(tb, x) && bad_b++ < 3)
      BOOST_TEST_MESSAGE("bf16 " << std::hexfloat << x << ": " << std::hex << bf16(x).bits << " vs "
                                 << reference(tb, x));
    if (fp16(x).bits != reference(th, x) && bad_h++ < 3)
      BOOST_TEST_MESSAGE("fp16 " << std::hexfloat << x << ": " << std::hex << fp16(x).bits << " vs "
                                 << reference(th, x));
  }
  BOOST_TEST(bad_b == 0u);
  BOOST_TEST(bad_h == 0u);
}

BOOST_AUTO_TEST_CASE(special_values_and_round_trips) {
  const float inf = std::numeric_limits<float>::infinity();
  BOOST_TEST(std::isinf(static_cast<float>(bf16(inf))));
  BOOST_TEST(std::isinf(static_cast<float>(fp16(-inf))));
  BOOST_TEST(std::isnan(static_cast<float>(bf16(std::nanf("")))));
  BOOST_TEST(std::isnan(static_cast<float>(fp16(std::nanf("")))));
  BOOST_TEST(std::isinf(static_cast<float>(fp16(65520.f))));  // the midpoint above 65504 ties to infinity
  BOOST_TEST(static_cast<float>(fp16(65519.f)) == 65504.f);
  BOOST_TEST(static_cast<float>(fp16(0x1p-24f)) == 0x1p-24f);  // smallest subnormal
  BOOST_TEST(fp16(0x1p-25f).bits == 0u);                       // exactly half of it ties to zero
  BOOST_TEST(std::signbit(static_cast<float>(bf16(-0.f))));
  // Every finite encoding survives decode/encode unchanged.
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = fp16::from_bits(static_cast<std::uint16_t>(b));
    if (!std::isnan(static_cast<float>(h))) BOOST_REQUIRE(fp16(static_cast<float>(h)).bits == h.bits);
    const auto g = bf16::from_bits(static_cast<std::uint16_t>(b));
    if (!std::isnan(static_cast<float>(g))) BOOST_REQUIRE(bf16(static_cast<float>(g)).bits == g.bits);
  }
}

#if DTRAIN_HAS_CUDA
// The CUDA headers' host conversions (round to nearest even) agree with ours.
BOOST_AUTO_TEST_CASE(matches_cuda_host_conversions) {
  std::mt19937 gen(99);
  for (int i = 0; i < 1'000'000; ++i) {
    const float x = random_float(gen);
    const __nv_bfloat16 b = __float2bfloat16_rn(x);
    const __half h = __float2half_rn(x);
    std::uint16_t bb, hb;
    std::memcpy(&bb, &b, 2);
    std::memcpy(&hb, &h, 2);
    BOOST_REQUIRE(bf16(x).bits == bb);
    BOOST_REQUIRE(fp16(x).bits == hb);
  }
}
#endif

BOOST_AUTO_TEST_CASE(dtype_cast_and_traits) {
  BOOST_TEST(static_cast<float>(dtype_cast<bf16>(1.0f + 0x1p-9f)) == 1.0f);  // below half a bf16 ulp
  BOOST_TEST(static_cast<float>(dtype_cast<fp16>(dtype_cast<bf16>(3.0f))) == 3.0f);
  static_assert(dtype_traits<bf16>::id == element_type::bf16 && element_bytes(element_type::f16) == 2);
  static_assert(HalfDtype<fp16> && !HalfDtype<float> && Dtype<float>);
}
