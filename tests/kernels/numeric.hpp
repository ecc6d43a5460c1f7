#pragma once
// Numeric helpers for tests that check kernels and units against a float64
// reference: random non-zero inputs, rounding through a dtype, and a
// tolerance check that reports the worst element. Compiled by g++ and nvcc.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "dtrain/core/dtype.hpp"

namespace dtrain::testing {

// Values with magnitude in [0.1, 1] * scale and a random sign: never zero, so
// no kink (ReLU) or cancellation hides an error.
inline std::vector<double> random_nonzero(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::uniform_real_distribution<double> mag(0.1, 1.0);
  std::bernoulli_distribution negative(0.5);
  std::vector<double> v(n);
  for (auto& x : v) x = (negative(rng) ? -1.0 : 1.0) * mag(rng) * scale;
  return v;
}

// The values a T buffer holding v would hold, back in double.
template <class T>
std::vector<double> round_to(std::vector<double> v) {
  for (auto& x : v) x = static_cast<float>(T(static_cast<float>(x)));
  return v;
}

template <class T>
std::vector<T> to_dtype(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](double x) { return T(static_cast<float>(x)); });
  return out;
}

template <class T>
std::vector<double> to_double(std::span<const T> v) {
  std::vector<double> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](T x) { return static_cast<double>(static_cast<float>(x)); });
  return out;
}

// Unit roundoff of a dtype's storage (half an ulp relative), the scale of
// the tolerances below.
template <class T>
constexpr double roundoff() {
  if constexpr (std::is_same_v<T, bf16>)
    return 1.0 / 256;  // 8 significand bits
  else if constexpr (std::is_same_v<T, fp16>)
    return 1.0 / 2048;  // 11 significand bits
  else
    return 1.0 / (1 << 24);
}

// Every |got[i] - ref[i]| <= tol * max_j |ref[j]|: an error measured against
// the vector's scale, so elements near zero are not held to a relative
// tolerance no floating-point computation meets.
inline void expect_close(std::span<const double> got, std::span<const double> ref, double tol,
                         const std::string& what) {
  BOOST_TEST_REQUIRE(got.size() == ref.size(), what << ": size " << got.size() << " vs " << ref.size());
  double scale = 0.0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::isfinite(got[i]) ? std::abs(got[i] - ref[i]) : INFINITY;
    if (!(err <= worst)) {
      worst = err;
      at = i;
    }
  }
  BOOST_TEST(worst <= tol * scale, what << ": worst error " << worst << " at [" << at << "] (got " << got[at]
                                        << ", reference " << ref[at] << "), allowed " << tol << " * " << scale);
}

}  // namespace dtrain::testing
