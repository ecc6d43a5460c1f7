#pragma once
// Element types of the tensors a Batch carries and units and losses read on
// the device (both in core/tensor.hpp): the compute dtypes and the integer
// types of token ids and masks.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "dtrain/core/dtype.hpp"

namespace dtrain {

enum class element_type : std::uint8_t { f32, bf16, f16, i32, i64, u8 };

template <class E>
inline constexpr bool is_element = std::is_same_v<E, float> || std::is_same_v<E, bf16> || std::is_same_v<E, fp16> ||
                                   std::is_same_v<E, std::int32_t> || std::is_same_v<E, std::int64_t> ||
                                   std::is_same_v<E, std::uint8_t>;

template <class E>
  requires is_element<E>
constexpr element_type element_type_of() {
  if constexpr (std::is_same_v<E, float>) return element_type::f32;
  else if constexpr (std::is_same_v<E, bf16>) return element_type::bf16;
  else if constexpr (std::is_same_v<E, fp16>) return element_type::f16;
  else if constexpr (std::is_same_v<E, std::int32_t>) return element_type::i32;
  else if constexpr (std::is_same_v<E, std::int64_t>) return element_type::i64;
  else return element_type::u8;
}

constexpr std::size_t element_bytes(element_type t) {
  switch (t) {
    case element_type::f32:
    case element_type::i32: return 4;
    case element_type::bf16:
    case element_type::f16: return 2;
    case element_type::i64: return 8;
    case element_type::u8: return 1;
  }
  return 0;
}

constexpr std::string_view element_name(element_type t) {
  switch (t) {
    case element_type::f32: return "f32";
    case element_type::bf16: return "bf16";
    case element_type::f16: return "f16";
    case element_type::i32: return "i32";
    case element_type::i64: return "i64";
    case element_type::u8: return "u8";
  }
  return "?";
}

constexpr bool is_floating(element_type t) {
  return t == element_type::f32 || t == element_type::bf16 || t == element_type::f16;
}

inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace dtrain
