#pragma once
// Float math callable from functors on the host and on the GPU. On the GPU
// the CUDA single-precision functions. On the host exp, erf and sqrt are our
// own branch-free versions (below): libm's are opaque calls that keep GCC
// from vectorising a functor's loop, and GELU spent a third of a host training
// step in them. exp and erf are accurate to a few ulps, so host and GPU
// results agree to rounding, not to the bit; sqrt is correctly rounded, as
// the GPU's sqrtf is, so it agrees to the bit.

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"

// The host's square root in a translation unit built without
// -fno-math-errno (the default). std::sqrt must then set errno for a
// negative argument, so GCC keeps it a scalar call and no loop that uses it
// vectorises. dtrain_sqrt_lanes is declared to GCC as a function with SIMD
// variants (`simd`, the vector ABI glibc's libmvec uses) and `const`: the
// loop vectoriser calls the variant of the loop's instruction level, which
// is the processor's square-root instruction on 4, 8 or 16 floats. The
// variants are defined here, `inline` (one copy per program), under the
// names the vector ABI derives from the function's symbol,
// dtrain_sqrt_scalar. That symbol is defined by a function GCC sees as
// another one (no simd attribute), so GCC neither clones it into variants
// of its own nor inlines it: loops see the call, not errno's. Every variant
// is IEEE's correctly rounded square root, the same bits as std::sqrt. GCC
// on x86-64 only (not under nvcc, whose host code keeps
// math::host_impl::sqrt_host); with -fno-math-errno std::sqrt is used
// directly.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__) && \
    !defined(__NO_MATH_ERRNO__)
#define DTRAIN_SQRT_LANES 1
extern "C" {
typedef float dtrain_v4sf __attribute__((vector_size(16)));
typedef float dtrain_v8sf __attribute__((vector_size(32)));
typedef float dtrain_v16sf __attribute__((vector_size(64)));
__attribute__((used, noinline)) inline float dtrain_sqrt_scalar(float x) { return __builtin_sqrtf(x); }
__attribute__((const, simd("notinbranch"))) float dtrain_sqrt_lanes(float x) __asm__("dtrain_sqrt_scalar");
__attribute__((used)) inline dtrain_v4sf _ZGVbN4v_dtrain_sqrt_scalar(dtrain_v4sf x) { return __builtin_ia32_sqrtps(x); }
__attribute__((used, target("avx"))) inline dtrain_v8sf _ZGVcN8v_dtrain_sqrt_scalar(dtrain_v8sf x) {
  return __builtin_ia32_sqrtps256(x);
}
__attribute__((used, target("avx2"))) inline dtrain_v8sf _ZGVdN8v_dtrain_sqrt_scalar(dtrain_v8sf x) {
  return __builtin_ia32_sqrtps256(x);
}
__attribute__((used, target("avx512f"))) inline dtrain_v16sf _ZGVeN16v_dtrain_sqrt_scalar(dtrain_v16sf x) {
  return __builtin_ia32_sqrtps512_mask(x, x, static_cast<unsigned short>(0xffff), 4 /* current rounding */);
}
}
#else
#define DTRAIN_SQRT_LANES 0
#endif

namespace dtrain::math {

namespace host_impl {
// exp(x) = 2^k * e^r with k = round(x / ln 2) and |r| <= ln(2)/2; e^r by its
// Taylor series to r^7 (truncation below 2^-25 relative). ln 2 is split in
// two parts so r is exact. Every step is arithmetic or a select, so loops
// over it vectorise; out-of-range and NaN inputs are fixed up at the end.
DTRAIN_ALWAYS_INLINE float exp_host(float x) {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693145751953125f;  // 16 significant bits: k * ln2_hi is exact
  constexpr float ln2_lo = 1.42860682030941723212e-6f;
  constexpr float round_magic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float lowest = -87.33f;          // ~ln(2^-126): below, results are subnormal
  constexpr float highest = 88.72f;          // ~ln(FLT_MAX)
  const float xc = x < lowest ? lowest : (x > highest ? highest : x);
  const float k = (xc * log2e + round_magic) - round_magic;
  const float r = (xc - k * ln2_hi) - k * ln2_lo;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  // 2^k for k in [-126, 128]: 2^128 has no float encoding, so positive k
  // builds 2^(k-1) and doubles it.
  const bool positive = k > 0.f;
  const auto e = static_cast<std::int32_t>(k) - (positive ? 1 : 0) + 127;
  const float y = p * dtrain::detail::bits_float(static_cast<std::uint32_t>(e) << 23) * (positive ? 2.f : 1.f);
  return x < lowest ? 0.f : (x > highest ? std::numeric_limits<float>::infinity() : (x == x ? y : x));
}

// erf_from_exp (GELU's derivative, which has exp(-x^2) already for the
// density): for |x| < 0.5 the Taylor series (6 terms, error below 2e-9),
// keeping full relative accuracy near 0; beyond, Abramowitz & Stegun
// 7.1.26, 1 - t(a1 + t(a2 + ...)) e^{-x^2} with t = 1 / (1 + p|x|),
// absolute error below 1.5e-7 (about 2 ulp of values above 0.5).
DTRAIN_ALWAYS_INLINE float erf_from_exp(float x, float exp_neg_x2) {
  const float a = x < 0.f ? -x : x;
  const float x2 = x * x;
  float s = -1.f / 1320.f;
  s = s * x2 + 1.f / 216.f;
  s = s * x2 - 1.f / 42.f;
  s = s * x2 + 1.f / 10.f;
  s = s * x2 - 1.f / 3.f;
  s = s * x2 + 1.f;
  const float series = 1.12837916709551257f * x * s;  // 2 / sqrt(pi)
  const float t = 1.f / (1.f + 0.3275911f * a);
  float q = 1.061405429f;
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  const float tail = 1.f - q * t * exp_neg_x2;
  const float signed_tail = x < 0.f ? -tail : tail;
  return a < 0.5f ? series : (x == x ? signed_tail : x);
}

// erf alone (GELU's forward): one rational function, erf(x) = x P(x^2) /
// Q(x^2) on |x| <= 3.92 (beyond, erf rounds to +-1 in float), P of degree
// 6 and Q of degree 5 fitted to float64 erf for the least maximum error and
// then nudged in their last bits for float evaluation with fused
// multiply-adds: absolute error below 2.8e-7 (3.8e-7 where the compiler
// does not fuse them), relative below 2.5e-7 near 0.
// No exp and no second branch: about half the arithmetic of
// erf_from_exp(x, exp(-x^2)), which made GELU's forward pass twice as slow
// as PyTorch's on the host.
DTRAIN_ALWAYS_INLINE float erf_host(float x) {
  constexpr float clamp = 3.92f;
  const float a0 = x < 0.f ? -x : x;
  const float a = a0 < clamp ? a0 : clamp;  // (a NaN takes the clamp; fixed up at the end)
  const float t = a * a;
  float p = -1.333767852e-08f;
  p = p * t + 4.718141099e-06f;
  p = p * t + 3.803829604e-04f;
  p = p * t + 3.832380753e-03f;
  p = p * t + 5.427851528e-02f;
  p = p * t + 1.847002804e-01f;
  p = p * t + 1.128379226e+00f;  // 2 / sqrt(pi), rounded to float
  float q = 6.342219422e-05f;
  q = q * t + 1.305045094e-03f;
  q = q * t + 1.543099154e-02f;
  q = q * t + 1.137754843e-01f;
  q = q * t + 4.970198870e-01f;
  q = q * t + 1.f;
  const float r0 = (a * p) / q;
  const float r = r0 < 1.f ? r0 : 1.f;  // the fit overshoots 1 by up to 2e-7 near the clamp
  return x == x ? (x < 0.f ? -r : r) : x;
}

// The correctly rounded square root (bit-identical to std::sqrt for every
// float, checked exhaustively) from arithmetic and integer selects only.
// std::sqrt must set errno for a negative argument, so without
// -fno-math-errno GCC keeps it a scalar call with a branch and no loop that
// uses it vectorises (AdamW's pass ran 4.5x slower for it). Here:
// 1/sqrt(x) from the bit pattern (3.4% error), one Newton step in float, two
// in double (error ~3e-11), s = x/sqrt(x) and one residual correction in
// double, then one rounding to float. The double result is within 2^-52 of
// sqrt(x), and sqrt of a float is never within 2^-51 (relative) of a
// midpoint between floats, so that rounding is the correct one. Inputs below
// 2^-100 (subnormals) are scaled by 2^100 first. The special cases (+-0,
// +inf, NaN, negative) are selected through integer masks: a floating-point
// select would need -fno-trapping-math to be if-converted.
DTRAIN_ALWAYS_INLINE float sqrt_host(float x) {
  using u32 = std::uint32_t;
  using u64 = std::uint64_t;
  const u32 bits = std::bit_cast<u32>(x);
  const u32 tiny = -static_cast<u32>(bits < 0x0d800000u);  // +0 <= x < 2^-100
  const float scaled = x * 0x1p100f;
  const float xs = std::bit_cast<float>((std::bit_cast<u32>(scaled) & tiny) | (bits & ~tiny));
  float y = std::bit_cast<float>(0x5f3759dfu - (std::bit_cast<u32>(xs) >> 1));
  y = y * (1.5f - 0.5f * xs * y * y);
  const double d = xs;
  double yd = y;
  yd = yd * (1.5 - 0.5 * d * yd * yd);
  yd = yd * (1.5 - 0.5 * d * yd * yd);
  double s = d * yd;
  s = s + 0.5 * yd * (d - s * s);
  const u64 tiny64 = -static_cast<u64>(tiny & 1u);
  constexpr u64 two_to_minus_50 = u64{1023 - 50} << 52, one = u64{1023} << 52;  // the doubles' bit patterns
  s = s * std::bit_cast<double>((two_to_minus_50 & tiny64) | (one & ~tiny64));
  const u32 r = std::bit_cast<u32>(static_cast<float>(s));
  const u32 regular = -static_cast<u32>(bits - 1u < 0x7f7fffffu);  // 0 < x < +inf
  const u32 magnitude = bits & 0x7fffffffu;
  // +-0, NaN, +inf
  const u32 pass = -static_cast<u32>(magnitude == 0u || magnitude > 0x7f800000u || bits == 0x7f800000u);
  const u32 special = (bits & pass) | (0xffc00000u & ~pass);  // negative: the default NaN
  return std::bit_cast<float>((r & regular) | (special & ~regular));
}
}  // namespace host_impl

DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float exp(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  return host_impl::exp_host(x);
#endif
}

DTRAIN_HOST_DEVICE inline float log(float x) {
#if defined(__CUDA_ARCH__)
  return ::logf(x);
#else
  return std::log(x);
#endif
}

// With -fno-math-errno (dtrain::optimized) GCC turns std::sqrt into the
// vector instruction itself; without it, GCC on x86-64 calls the same
// instruction through dtrain_sqrt_lanes's SIMD variants (above), and other
// compilers get sqrt_host. All three give the same bits.
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return ::sqrtf(x);
#elif defined(__NO_MATH_ERRNO__) || !(defined(__GNUC__) || defined(__clang__))
  return std::sqrt(x);
#elif DTRAIN_SQRT_LANES
  return dtrain_sqrt_lanes(x);
#else
  return host_impl::sqrt_host(x);
#endif
}

DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float erf(float x) {
#if defined(__CUDA_ARCH__)
  return ::erff(x);
#else
  return host_impl::erf_host(x);
#endif
}

// erf(x) when the caller has exp(-x^2) already (GELU's derivative needs it
// for the density): the host saves its one exp call; the GPU ignores it.
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float erf_given_exp(float x, [[maybe_unused]] float exp_neg_x2) {
#if defined(__CUDA_ARCH__)
  return ::erff(x);
#else
  return host_impl::erf_from_exp(x, exp_neg_x2);
#endif
}

DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float max(float a, float b) { return a < b ? b : a; }
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE std::int64_t min_i64(std::int64_t a, std::int64_t b) { return b < a ? b : a; }

// Row reductions. A loop `s += f(j)` is a chain the compiler may not reorder
// (float addition is not associative), so it runs one element at a time and
// any exp inside it stays scalar. These keep `lanes` partial results,
// element j going to lane j % lanes, and combine the lanes pairwise at the
// end: a fixed order, the same on every device and at every vector width, in
// which the loop over the lanes is a plain map the compiler vectorises.
inline constexpr int lanes = 16;

template <class F>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float lane_sum(std::int64_t n, F f) {
  float acc[lanes] = {};
  std::int64_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (int k = 0; k < lanes; ++k) acc[k] += f(j + k);
  for (int k = 0; j + k < n; ++k) acc[k] += f(j + k);
  for (int w = lanes / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// The largest f(j), or `lowest` for an empty range.
template <class F>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float lane_max(std::int64_t n, float lowest, F f) {
  float acc[lanes];
  for (int k = 0; k < lanes; ++k) acc[k] = lowest;
  std::int64_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (int k = 0; k < lanes; ++k) acc[k] = max(acc[k], f(j + k));
  for (int k = 0; j + k < n; ++k) acc[k] = max(acc[k], f(j + k));
  for (int w = lanes / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] = max(acc[k], acc[k + w]);
  return acc[0];
}

// How the work of one row is spread over threads. A row functor (LayerNorm,
// RMSNorm, the causal softmax, cross-entropy) writes its row once, as
// `row(i, lanes)`, with its reductions as lanes.sum / lanes.max and its
// element loops as lanes.each, and declares `row_lanes = math::lanes`:
//   SerialRow   every lane in this thread: the host, and the GPU's one
//               thread per row (operator()(i) = row(i, SerialRow{}));
//   LaneGroup   (backend/cuda/device_launch.cuh) row_lanes threads of a warp, one per
//               lane, each summing its own lane's elements in the same order
//               and combining the lanes in the same pairwise tree, so both
//               forms give the same bits. lanes.each gives element j to lane
//               j % lanes, the thread that summed it, so a row may be written
//               in one loop and read back in the next.
struct SerialRow {
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE bool leader() const { return true; }
  template <class F>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float sum(std::int64_t n, F f) const {
    return lane_sum(n, f);
  }
  template <class F>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float max(std::int64_t n, float lowest, F f) const {
    return lane_max(n, lowest, f);
  }
  template <class F>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void each(std::int64_t n, F f) const {
    for (std::int64_t j = 0; j < n; ++j) f(j);
  }
};

// By the exponent bits, so it behaves the same with fast-math flags.
DTRAIN_HOST_DEVICE inline bool is_finite(float x) { return (detail::float_bits(x) & 0x7f800000u) != 0x7f800000u; }

DTRAIN_HOST_DEVICE inline float quiet_nan() { return detail::bits_float(0x7fc00000u); }

// Column sums of a [rows, *] operand: out(c, sum over r of f(r, c)) for the
// `width` columns from c0, each summed down the rows in row order (the same
// order as one column per GPU thread). A full group of W columns keeps W
// sums side by side, so each row's W elements are one vector operation; the
// host runs columns in groups of math::lanes (column_group), the GPU one per
// thread.
template <int W, class F, class Out>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void column_sums(std::int64_t rows, std::int64_t c0, std::int64_t width, F f,
                                                         Out out) {
  if (width == W) {
    float acc[W] = {};
    for (std::int64_t r = 0; r < rows; ++r)
      for (int k = 0; k < W; ++k) acc[k] += f(r, c0 + k);
    for (int k = 0; k < W; ++k) out(c0 + k, acc[k]);
    return;
  }
  for (std::int64_t k = 0; k < width; ++k) {
    float acc = 0.f;
    for (std::int64_t r = 0; r < rows; ++r) acc += f(r, c0 + k);
    out(c0 + k, acc);
  }
}

}  // namespace dtrain::math

namespace dtrain {

// Columns per for_each index for column reductions (math::column_sums):
// math::lanes on the host, 1 on a GPU, whose threads each take a column.
template <class Dev>
constexpr std::int64_t column_group() {
  return Dev::host_accessible ? math::lanes : 1;
}

// for_each indices covering `cols` columns in groups of `group`.
inline std::size_t column_groups(std::int64_t cols, std::int64_t group) {
  return static_cast<std::size_t>((cols + group - 1) / group);
}

namespace detail {
// A functor's span(begin, end), the host's form of its index range
// (backend/host/device_isa.hpp, HostSpanFunctor), walks whole rows:
// g(r, j0, j1) for each row's piece [j0, j1) of the flat range
// [begin, end) of a row-major matrix `cols` wide, in order.
template <class G>
DTRAIN_ALWAYS_INLINE void row_pieces(std::size_t begin, std::size_t end, std::int64_t cols, G&& g) {
  auto n = static_cast<std::int64_t>(begin);
  const auto stop = static_cast<std::int64_t>(end);
  while (n < stop) {
    const std::int64_t r = n / cols, j0 = n % cols, j1 = j0 + (stop - n) < cols ? j0 + (stop - n) : cols;
    g(r, j0, j1);
    n += j1 - j0;
  }
}
}  // namespace detail

}  // namespace dtrain
