#pragma once
// Float math callable from functors on the host and on the GPU. On the GPU
// the CUDA single-precision functions; on the host the <cmath> ones. Both are
// accurate to a few ulps, so host and GPU results agree to rounding, not to
// the bit.

#include <cmath>
#include <cstdint>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain::math {

DTRAIN_HOST_DEVICE inline float exp(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  return std::exp(x);
#endif
}

DTRAIN_HOST_DEVICE inline float log(float x) {
#if defined(__CUDA_ARCH__)
  return ::logf(x);
#else
  return std::log(x);
#endif
}

DTRAIN_HOST_DEVICE inline float sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

DTRAIN_HOST_DEVICE inline float erf(float x) {
#if defined(__CUDA_ARCH__)
  return ::erff(x);
#else
  return std::erf(x);
#endif
}

DTRAIN_HOST_DEVICE inline float max(float a, float b) { return a < b ? b : a; }

// By the exponent bits, so it behaves the same with fast-math flags.
DTRAIN_HOST_DEVICE inline bool is_finite(float x) {
  return (detail::float_bits(x) & 0x7f800000u) != 0x7f800000u;
}

DTRAIN_HOST_DEVICE inline float quiet_nan() { return detail::bits_float(0x7fc00000u); }

}  // namespace dtrain::math
