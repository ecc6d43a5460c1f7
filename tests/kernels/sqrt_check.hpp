#pragma once
// A float square root through Host::for_each (the vectorised loop) at every
// instruction level this processor has, against the float64 square root
// rounded to float, which is the correctly rounded float square root (53 >=
// 2 x 24 + 2 bits: the double rounding is innocuous). A stride prime to 2^32
// visits ~1 bit pattern in 61 of every exponent: subnormals, zeros,
// infinities, NaNs and negatives included.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <dtrain/backend/host/device.hpp>

namespace dtrain::testing {

template <class Sqrt>
struct SqrtPatterns {
  std::uint32_t first, stride;
  float* out;
  Sqrt sqrt;
  void operator()(std::size_t i) const {
    out[i] = sqrt(std::bit_cast<float>(static_cast<std::uint32_t>(first + i * stride)));
  }
};

template <class Sqrt>
void check_sqrt_patterns(Sqrt sqrt, const char* what) {
  constexpr std::uint32_t stride = 61, first = 12345;
  const std::size_t n = (std::size_t{1} << 32) / stride;
  std::vector<float> got(n);
  const host_isa widest = detail::widest_host_isa(), before = current_host_isa();
  Host dev(2);
  for (int level = 0; level <= static_cast<int>(widest); ++level) {
    set_host_isa(static_cast<host_isa>(level));
    dev.for_each(n, SqrtPatterns<Sqrt>{first, stride, got.data(), sqrt});
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float x = std::bit_cast<float>(static_cast<std::uint32_t>(first + i * stride));
      const float want = static_cast<float>(std::sqrt(static_cast<double>(x)));
      const bool same = std::isnan(want) ? std::isnan(got[i])
                                         : std::bit_cast<std::uint32_t>(want) == std::bit_cast<std::uint32_t>(got[i]);
      if (!same && ++mismatches <= 3) BOOST_TEST_MESSAGE(what << "(" << x << ") = " << got[i] << ", want " << want);
    }
    BOOST_TEST(mismatches == 0u, what << " at " << host_isa_name(static_cast<host_isa>(level)) << ": " << mismatches
                                      << " of " << n << " patterns differ");
  }
  set_host_isa(before);
}

}  // namespace dtrain::testing
