#pragma once
// Storage dtypes usable on host and device: fp32 (float), bf16 and fp16.
// bf16/fp16 are 16-bit storage types; arithmetic goes through float. The
// float -> half conversions round to nearest, ties to even, exactly like the
// CUDA intrinsics, so host and device produce bit-identical results.

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "dtrain/core/macros.hpp"

namespace dtrain {

namespace detail {
DTRAIN_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
DTRAIN_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep sign, force quiet
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even on the dropped 16 bits
  return static_cast<std::uint16_t>(u >> 16);
}

DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float bf16_bits_to_float(std::uint16_t h) {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}

DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE std::uint16_t float_to_fp16_bits(float f) {
  std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u)  // inf or NaN
    return static_cast<std::uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u)  // >= 65520 rounds to infinity
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (x < 0x38800000u) {                                            // below 2^-14: fp16 subnormal (or zero)
    if (x <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25 ties to 0
    const std::uint32_t e = x >> 23;
    const std::uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // units of 2^-24
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (x - 0x38000000u) >> 13;  // rebias exponent 127 -> 15
  const std::uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry may bump the exponent: correct
  return static_cast<std::uint16_t>(sign | h);
}

DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    e = 113;  // normalise the subnormal
    while (!(m & 0x400u)) {
      m <<= 1;
      --e;
    }
    return bits_float(sign | (e << 23) | ((m & 0x3ffu) << 13));
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}
}  // namespace detail

// A 16-bit float stored as bits; converts implicitly to float for arithmetic.
template <std::uint16_t (*Encode)(float), float (*Decode)(std::uint16_t)>
struct half_storage {
  std::uint16_t bits = 0;

  half_storage() = default;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE explicit half_storage(float f) : bits(Encode(f)) {}
  DTRAIN_HOST_DEVICE static half_storage from_bits(std::uint16_t b) {
    half_storage h;
    h.bits = b;
    return h;
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE operator float() const { return Decode(bits); }
  DTRAIN_HOST_DEVICE friend bool operator==(half_storage a, half_storage b) { return a.bits == b.bits; }
};

using bf16 = half_storage<detail::float_to_bf16_bits, detail::bf16_bits_to_float>;
using fp16 = half_storage<detail::float_to_fp16_bits, detail::fp16_bits_to_float>;
using fp32 = float;

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2);

// The element types dtrain knows, one enum for tensors in memory, in
// batches and in files: the compute dtypes (f32, bf16, f16), the integers of
// ids and masks, and the rest of what safetensors files hold (read, never
// computed in). Names, sizes and the C++ types are core/element.hpp's.
enum class element_type : std::uint8_t {
  boolean,
  u8,
  i8,
  f8_e5m2,
  f8_e4m3,
  i16,
  u16,
  f16,
  bf16,
  i32,
  u32,
  f32,
  f64,
  i64,
  u64
};

template <class T>
struct dtype_traits;
template <>
struct dtype_traits<float> {
  static constexpr element_type id = element_type::f32;
  static constexpr std::string_view name = "fp32";
  static constexpr std::string_view safetensors_name = "F32";
  static constexpr double epsilon = 0x1p-23;  // spacing of values just above 1
};
template <>
struct dtype_traits<bf16> {
  static constexpr element_type id = element_type::bf16;
  static constexpr std::string_view name = "bf16";
  static constexpr std::string_view safetensors_name = "BF16";
  static constexpr double epsilon = 0x1p-7;
};
template <>
struct dtype_traits<fp16> {
  static constexpr element_type id = element_type::f16;
  static constexpr std::string_view name = "fp16";
  static constexpr std::string_view safetensors_name = "F16";
  static constexpr double epsilon = 0x1p-10;
};

template <class T>
concept Dtype = requires {
  dtype_traits<T>::id;
};

template <class T>
concept HalfDtype = Dtype<T> && sizeof(T) == 2;

// Explicit element cast between any two dtypes, usable on host and device.
template <Dtype To, Dtype From>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE To dtype_cast(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else
    return To(static_cast<float>(v));
}

}  // namespace dtrain
