#pragma once
// nlohmann/json for dtrain's own .ipp code (checkpoint indexes, safetensors
// headers, Hugging Face configs), and parse_json, through which JSON from
// files is read (with a nesting limit). Header-only, its templates are compiled
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

// How deeply JSON read from a file may nest arrays and objects. nlohmann's
// parser keeps its own stack, but dump() (every message that shows a value)
// and the code that walks a value recurse, so "[[[[..." 100000 levels deep
// would overflow the stack. Nothing dtrain reads (configs, checkpoint
// indexes, safetensors headers) nests beyond a few levels; 128 is serde_json's
// limit too, so a file Python or Rust tools read is not refused here.
inline constexpr std::size_t json_max_depth = 128;

// The offset of the first '[' or '{' in `text` that opens a level beyond
// json_max_depth, or nullopt. Strings are skipped as the parser's lexer skips
// them (a '[' in a string is no nesting); anything malformed is left to the
// parser, which stops at it before nesting any deeper than counted here.
inline std::optional<std::size_t> json_too_deep(std::string_view text) {
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > json_max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

// JSON from outside dtrain (a file, a safetensors header): too deep a
// nesting is refused before parsing, and a parse error becomes a dtrain
// error. make_error(problem) returns the error to throw, naming the source
// and the fix; `problem` reads after "<source> is ": "not valid JSON: ..."
// or "JSON nested more than 128 levels deep ...". Every reader of JSON from
// a file parses it through here.
template <class Json = nlohmann::ordered_json, class MakeError>
Json parse_json(std::string_view text, MakeError&& make_error) {
  if (const auto at = json_too_deep(text))
    throw make_error("JSON nested more than " + std::to_string(json_max_depth) + " levels deep (at byte " +
                     std::to_string(*at) + "), deeper than dtrain reads");
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw make_error(std::string("not valid JSON: ") + e.what());
  }
}

// The same for a whole stream (an open file).
template <class Json = nlohmann::ordered_json, class MakeError>
Json parse_json(std::istream& in, MakeError&& make_error) {
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_json<Json>(std::string_view(text), make_error);
}

// A value as shown in an error: its JSON, cut to 40 characters.
template <class Json>
std::string json_shown(const Json& v) {
  std::string shown = v.dump();
  return shown.size() > 40 ? shown.substr(0, 37) + "..." : shown;
}

}  // namespace dtrain::detail
DTRAIN_IMPL_END
