#pragma once
// What element_type's values are: their names (dtrain's and safetensors'),
// sizes and C++ types. A Batch's tensors (core/tensor.hpp) carry the compute
// dtypes and the integers of token ids and masks; files carry any of them.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

// The C++ types of element_type's values (not the 8-bit floats, which
// dtrain only reads as bytes).
template <class E>
inline constexpr bool is_element =
    std::is_same_v<E, float> || std::is_same_v<E, bf16> || std::is_same_v<E, fp16> || std::is_same_v<E, double> ||
    std::is_same_v<E, bool> || std::is_same_v<E, std::int8_t> || std::is_same_v<E, std::uint8_t> ||
    std::is_same_v<E, std::int16_t> || std::is_same_v<E, std::uint16_t> || std::is_same_v<E, std::int32_t> ||
    std::is_same_v<E, std::uint32_t> || std::is_same_v<E, std::int64_t> || std::is_same_v<E, std::uint64_t>;

template <class E>
requires is_element<E>
constexpr element_type element_type_of() {
  if constexpr (std::is_same_v<E, float>)
    return element_type::f32;
  else if constexpr (std::is_same_v<E, bf16>)
    return element_type::bf16;
  else if constexpr (std::is_same_v<E, fp16>)
    return element_type::f16;
  else if constexpr (std::is_same_v<E, double>)
    return element_type::f64;
  else if constexpr (std::is_same_v<E, bool>)
    return element_type::boolean;
  else if constexpr (std::is_same_v<E, std::int8_t>)
    return element_type::i8;
  else if constexpr (std::is_same_v<E, std::uint8_t>)
    return element_type::u8;
  else if constexpr (std::is_same_v<E, std::int16_t>)
    return element_type::i16;
  else if constexpr (std::is_same_v<E, std::uint16_t>)
    return element_type::u16;
  else if constexpr (std::is_same_v<E, std::int32_t>)
    return element_type::i32;
  else if constexpr (std::is_same_v<E, std::uint32_t>)
    return element_type::u32;
  else if constexpr (std::is_same_v<E, std::int64_t>)
    return element_type::i64;
  else
    return element_type::u64;
}

namespace detail {
struct ElementInfo {
  element_type type;
  std::string_view name;       // dtrain's: "f32", "bf16", "i64", ...
  std::string_view file_name;  // safetensors': "F32", "BF16", "I64", ...
  std::size_t bytes;
};
inline constexpr std::array<ElementInfo, 15> element_infos{{
    {element_type::boolean, "bool", "BOOL", 1},
    {element_type::u8, "u8", "U8", 1},
    {element_type::i8, "i8", "I8", 1},
    {element_type::f8_e5m2, "f8_e5m2", "F8_E5M2", 1},
    {element_type::f8_e4m3, "f8_e4m3", "F8_E4M3", 1},
    {element_type::i16, "i16", "I16", 2},
    {element_type::u16, "u16", "U16", 2},
    {element_type::f16, "f16", "F16", 2},
    {element_type::bf16, "bf16", "BF16", 2},
    {element_type::i32, "i32", "I32", 4},
    {element_type::u32, "u32", "U32", 4},
    {element_type::f32, "f32", "F32", 4},
    {element_type::f64, "f64", "F64", 8},
    {element_type::i64, "i64", "I64", 8},
    {element_type::u64, "u64", "U64", 8},
}};
static_assert(
    [] {
      for (std::size_t i = 0; i < element_infos.size(); ++i)
        if (static_cast<std::size_t>(element_infos[i].type) != i) return false;
      return true;
    }(),
    "element_infos must list element_type in order: element_info() indexes it");
constexpr const ElementInfo& element_info(element_type t) { return element_infos[static_cast<std::size_t>(t)]; }
}  // namespace detail

constexpr std::size_t element_bytes(element_type t) { return detail::element_info(t).bytes; }
constexpr std::string_view element_name(element_type t) { return detail::element_info(t).name; }

constexpr bool is_floating(element_type t) {
  return t == element_type::f32 || t == element_type::bf16 || t == element_type::f16;
}

DTRAIN_DECL std::string shape_text(std::span<const std::int64_t> shape);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/core/element.ipp"
#endif
