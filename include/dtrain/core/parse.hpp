#pragma once
// Whole-string number parses for what users and peers hand us as text
// (environment variables, launcher flags, fault plans, store requests): "",
// " 3", "3x", "+3" and out-of-range values are rejected rather than read as a
// prefix, so a typo never becomes a rank.

#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>
#include <system_error>

namespace dtrain::detail {

inline std::optional<long long> parse_integer(std::string_view text) {
  long long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc{} || ptr != end) return std::nullopt;
  return value;
}

inline std::optional<double> parse_number(std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc{} || ptr != end || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace dtrain::detail
