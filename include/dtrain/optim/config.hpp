#pragma once
// Optimizer settings as plain aggregates, so a call site reads
//   dtrain::AdamW{.lr = 3e-4f, .weight_decay = 0.1f}
// They hold numbers only; the optimizers that apply them live beside them in
// optim/. validate() throws dtrain::config_error naming the field and its
// valid range: whoever consumes a config calls it first, so a bad value fails
// before the first step instead of surfacing later as a NaN loss.

#include <charconv>
#include <concepts>
#include <limits>
#include <source_location>
#include <string>
#include <string_view>

#include "dtrain/core/error.hpp"

namespace dtrain {

namespace detail {
// Shortest text that reads back as the same value of T: 1e-08, not 0.000000.
template <class T>
std::string number_text(T v) {
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

// A closed or open interval. NaN fails every comparison, so it is never inside.
struct value_range {
  double lo;
  double hi;
  bool lo_open;
  bool hi_open;
  std::string_view text;

  constexpr bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};

inline constexpr double infinity = std::numeric_limits<double>::infinity();
inline constexpr value_range positive{0, infinity, true, true, "a finite number > 0"};
inline constexpr value_range non_negative{0, infinity, false, true, "a finite number >= 0"};
inline constexpr value_range unit_interval{0, 1, false, true, "a number in [0, 1)"};
inline constexpr value_range fraction{0, 1, false, false, "a number in [0, 1]"};
inline constexpr value_range step_count{0, infinity, false, true, "a step count >= 0"};
inline constexpr value_range positive_step_count{1, infinity, false, true, "a step count >= 1"};

template <class T>
void check_field(std::string_view config, std::string_view field, T value, const value_range& range,
                 std::source_location where = std::source_location::current()) {
  if (range.contains(static_cast<double>(value))) return;
  throw config_error(std::string(config) + "." + std::string(field) + " = " + number_text(value) + " must be " +
                         std::string(range.text),
                     "set ." + std::string(field) + " to " + std::string(range.text), where);
}
}  // namespace detail

// Decoupled weight decay Adam (Loshchilov & Hutter), PyTorch's defaults.
struct AdamW {
  static constexpr std::string_view name = "adamw";

  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;

  void validate() const {
    detail::check_field("AdamW", "lr", lr, detail::positive);
    detail::check_field("AdamW", "beta1", beta1, detail::unit_interval);
    detail::check_field("AdamW", "beta2", beta2, detail::unit_interval);
    detail::check_field("AdamW", "eps", eps, detail::positive);
    detail::check_field("AdamW", "weight_decay", weight_decay, detail::non_negative);
  }
};

// SGD with optional (Nesterov) momentum and L2 weight decay folded into the
// gradient, as torch.optim.SGD with dampening 0.
struct SGD {
  static constexpr std::string_view name = "sgd";

  float lr = 1e-2f;
  float momentum = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;

  void validate() const {
    detail::check_field("SGD", "lr", lr, detail::positive);
    detail::check_field("SGD", "momentum", momentum, detail::non_negative);
    detail::check_field("SGD", "weight_decay", weight_decay, detail::non_negative);
    if (nesterov && momentum == 0.f)
      throw config_error("SGD.nesterov = true needs momentum > 0: Nesterov is a momentum method",
                         "set .momentum (e.g. 0.9) or .nesterov = false");
  }
};

// Clip the global gradient norm (over all ranks' shards) to max_norm before
// the optimizer step.
struct ClipConfig {
  float max_norm = 0.f;  // 0 = off

  bool enabled() const { return max_norm > 0.f; }
  void validate() const { detail::check_field("ClipConfig", "max_norm", max_norm, detail::non_negative); }
};

template <class C>
concept OptimizerConfig = std::copyable<C> && requires(const C& c) {
  { C::name } -> std::convertible_to<std::string_view>;
  { c.lr } -> std::convertible_to<float>;
  c.validate();
};

}  // namespace dtrain
