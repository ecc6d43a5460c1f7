#pragma once
// nlohmann/json for dtrain's own .ipp code (checkpoint indexes, safetensors
// headers, Hugging Face configs). Header-only, its templates are compiled
// at -O1 like that code (DTRAIN_IMPL_BEGIN, core/macros.hpp): they parse
// small files once per run. The standard headers it uses come first, outside
// that region, so that the rest of a user's program keeps its own level for
// them; a user who wants nlohmann/json at the build's level includes it
// before dtrain's headers. tests/io/impl_o1_check.cmake checks that no
// standard header is first opened inside the region.

#include <algorithm>
#include <any>
#include <array>
#include <cassert>
#include <cmath>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <forward_list>
#include <functional>
#include <initializer_list>
#include <iomanip>
#include <ios>
#include <iosfwd>
#include <istream>
#include <iterator>
#include <limits>
#include <locale>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <ranges>
#include <sstream>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <valarray>
#include <vector>
#include <version>

#include "dtrain/core/macros.hpp"

DTRAIN_IMPL_BEGIN
#include <nlohmann/json.hpp>
DTRAIN_IMPL_END

DTRAIN_IMPL_BEGIN
namespace dtrain::detail {

// A JSON value as the number type T, or nothing when it is not a number T
// holds. nlohmann's get<T>() converts without a check, and a float beyond
// an integer's range, or a double beyond float's, is undefined behaviour
// (fuzzing found both in dtrain's readers): every reader of outside JSON
// converts through here. Integer types take JSON integers only; floating
// types take any finite number within their range.
template <class T, class Json>
std::optional<T> json_number(const Json& v) {
  if constexpr (std::is_integral_v<T>) {
    if (v.is_number_unsigned()) {
      if (const auto u = v.template get<std::uint64_t>(); std::in_range<T>(u)) return static_cast<T>(u);
    } else if (v.is_number_integer()) {
      if (const auto i = v.template get<std::int64_t>(); std::in_range<T>(i)) return static_cast<T>(i);
    }
    return std::nullopt;
  } else {
    if (!v.is_number()) return std::nullopt;
    const double d = v.template get<double>();
    if (!std::isfinite(d) || std::abs(d) > static_cast<double>(std::numeric_limits<T>::max())) return std::nullopt;
    return static_cast<T>(d);
  }
}

// A value as shown in an error: its JSON, cut to 40 characters.
template <class Json>
std::string json_shown(const Json& v) {
  std::string shown = v.dump();
  return shown.size() > 40 ? shown.substr(0, 37) + "..." : shown;
}

}  // namespace dtrain::detail
DTRAIN_IMPL_END
