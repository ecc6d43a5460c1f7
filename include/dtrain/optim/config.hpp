#pragma once
// Optimizers as plain aggregates, so a call site reads
//   dtrain::AdamW{.lr = 3e-4f, .weight_decay = 0.1f}
// Each is its settings plus its element-wise rule (the Optimizer concept at
// the end); FlatOptimizer runs the rule over a flat buffer. validate() throws
// dtrain::config_error naming the field and its valid range: whoever
// consumes a config calls it first, so a bad value fails before the first
// step instead of surfacing later as a NaN loss.

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/kernels/optimizer.hpp"

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

  constexpr bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
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

// What an optimizer rule is given for one parameter group at one step.
struct GroupHyper {
  float lr = 0.f;            // the group's rate at this step (schedule, scaling and the group's factor applied)
  float weight_decay = 0.f;  // the group's
  std::int64_t step = 1;     // optimizer steps taken, this one included
};

// Decoupled weight decay Adam (Loshchilov & Hutter), PyTorch's defaults.
struct AdamW {
  static constexpr std::string_view name = "adamw";
  static constexpr std::size_t max_states = 2;
  using coefficients = AdamWCoefficients;

  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;

  void validate() const {
    detail::check_field("AdamW", "lr", lr, detail::positive);
    detail::check_field("AdamW", "beta1", beta1, detail::unit_interval);
    detail::check_field("AdamW", "beta2", beta2, detail::unit_interval);
    detail::check_field("AdamW", "eps", eps, detail::positive);
    detail::check_field("AdamW", "weight_decay", weight_decay, detail::non_negative);
  }
  // PyTorch's names, as checkpoints record them.
  std::vector<std::string_view> state_names() const { return {"exp_avg", "exp_avg_sq"}; }
  coefficients coefficients_for(const GroupHyper& h) const {
    return adamw_coefficients({h.lr, beta1, beta2, eps, h.weight_decay}, h.step);
  }
  DTRAIN_HOST_DEVICE static void update(float& p, float g, float* s, const coefficients& c) {
    adamw_update(p, g, s[0], s[1], c);
  }
};

// SGD with optional (Nesterov) momentum and L2 weight decay folded into the
// gradient, as torch.optim.SGD with dampening 0.
struct SGD {
  static constexpr std::string_view name = "sgd";
  static constexpr std::size_t max_states = 1;
  using coefficients = SgdHyper;

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
  // Without momentum SGD keeps no state.
  std::vector<std::string_view> state_names() const {
    if (momentum != 0.f) return {"momentum_buffer"};
    return {};
  }
  coefficients coefficients_for(const GroupHyper& h) const { return {h.lr, momentum, h.weight_decay, nesterov}; }
  DTRAIN_HOST_DEVICE static void update(float& p, float g, float* s, const coefficients& c) {
    sgd_update(p, g, s[0], c);
  }
};

// Clip the global gradient norm (over all ranks' shards) to max_norm before
// the optimizer step.
struct ClipOptions {
  float max_norm = 0.f;  // 0 = off

  bool enabled() const { return max_norm > 0.f; }
  void validate() const { detail::check_field("ClipOptions", "max_norm", max_norm, detail::non_negative); }
};

// An optimizer: an element-wise rule over fp32 master weights, a gradient
// and up to max_states fp32 state buffers per element. dtrain runs it in one
// fused pass over whatever flat a strategy owns on a rank, with per-group
// rates and weight decay; a user's type that models this (with `update`
// marked DTRAIN_HOST_DEVICE and compiled by nvcc for GPUs) plugs into every
// Trainer and strategy without changing dtrain (docs/policies.md shows Lion).
//   name             a short static name, recorded in checkpoints
//   lr, weight_decay the defaults of the groups that set none
//   validate()       throws config_error naming a bad field
//   state_names()    the state buffers in use, named (checkpoints key on them)
//   coefficients_for(GroupHyper) the per-step scalars of one group, on the host
//   update(p, g, s, c) one element: p and s[0..states) in place from gradient g
template <class C>
concept Optimizer = std::copyable<C> && std::is_trivially_copyable_v<typename C::coefficients> &&
    requires(const C& c, const GroupHyper& h, float& p, float g, float* s, const typename C::coefficients& k) {
  { C::name } -> std::convertible_to<std::string_view>;
  { C::max_states } -> std::convertible_to<std::size_t>;
  { c.lr } -> std::convertible_to<float>;
  { c.weight_decay } -> std::convertible_to<float>;
  c.validate();
  { c.state_names() } -> std::convertible_to<std::vector<std::string_view>>;
  { c.coefficients_for(h) } -> std::same_as<typename C::coefficients>;
  C::update(p, g, s, k);
};

}  // namespace dtrain
