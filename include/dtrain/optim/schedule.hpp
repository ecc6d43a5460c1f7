#pragma once
// Learning-rate schedules: small value types mapping an optimizer step
// (counted from 0) to the learning rate of that step. They are pure functions
// of the step, so a checkpoint needs only the step to resume a schedule.
//
//   dtrain::Schedule lr = dtrain::WarmupCosineLR{.peak_lr = 3e-4f, .warmup_steps = 100, .total_steps = 5000};
//   optimizer.set_lr(lr(step));
//
// Schedules give the absolute learning rate: the rate in an optimizer config
// is the one used when no schedule is given. To adapt a rate tuned at one
// batch size to a larger effective batch, scale it first with scale_lr().

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <numbers>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dtrain/core/error.hpp"
#include "dtrain/optim/config.hpp"

namespace dtrain {

namespace detail {
inline void check_step(std::int64_t step) {
  if (step < 0)
    throw error("LR schedule evaluated at step " + std::to_string(step),
                "schedules count optimizer steps from 0; pass the number of steps taken so far");
}

// The rate at a step of the linear warmup from warmup_start * peak (step 0)
// to peak (step warmup_steps), in double.
inline float warmup_rate(double peak, std::int64_t step, std::int64_t warmup_steps, float warmup_start) {
  const double t = static_cast<double>(step) / static_cast<double>(warmup_steps);
  return static_cast<float>(peak * (warmup_start + (1.0 - warmup_start) * t));
}

// The decays of WarmupDecayLR after its warmup: the fraction of
// (peak_lr - min_lr) left at `step`, warmup_steps <= step < total_steps.
struct CosineDecay {
  static constexpr std::string_view name = "cosine", type = "WarmupCosineLR";
  static double left(std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps) {
    const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
};
struct LinearDecay {
  static constexpr std::string_view name = "linear", type = "LinearLR";
  static double left(std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps) {
    return static_cast<double>(total_steps - step) / static_cast<double>(total_steps - warmup_steps);
  }
};
}  // namespace detail

// The same rate at every step.
struct ConstantLR {
  static constexpr std::string_view name = "constant";

  float lr = 0.f;  // required

  float operator()(std::int64_t step) const {
    detail::check_step(step);
    return lr;
  }
  void validate() const { detail::check_field("ConstantLR", "lr", lr, detail::positive); }
};

// Linear warmup from warmup_start * peak_lr (step 0) to peak_lr (step
// warmup_steps), then Decay down to min_lr at total_steps, and min_lr after.
template <class Decay>
struct WarmupDecayLR {
  static constexpr std::string_view name = Decay::name;

  float peak_lr = 0.f;            // required
  std::int64_t warmup_steps = 0;  // 0: start at peak_lr
  std::int64_t total_steps = 0;   // required; warmup_steps <= total_steps
  float min_lr = 0.f;
  float warmup_start = 0.f;  // fraction of peak_lr at step 0

  float operator()(std::int64_t step) const {
    detail::check_step(step);
    // In double: near total_steps what is left of the decay is small (the
    // cosine close to -1), and float would lose most of the difference to
    // min_lr.
    const double peak = peak_lr;
    if (step < warmup_steps) return detail::warmup_rate(peak, step, warmup_steps, warmup_start);
    if (step >= total_steps) return min_lr;
    return static_cast<float>(min_lr + (peak - min_lr) * Decay::left(step, warmup_steps, total_steps));
  }

  void validate() const {
    const std::string s(Decay::type);
    detail::check_field(s, "peak_lr", peak_lr, detail::positive);
    detail::check_field(s, "warmup_steps", warmup_steps, detail::step_count);
    detail::check_field(s, "total_steps", total_steps, detail::positive_step_count);
    detail::check_field(s, "min_lr", min_lr, detail::non_negative);
    detail::check_field(s, "warmup_start", warmup_start, detail::fraction);
    if (warmup_steps > total_steps)
      throw config_error(s + ".warmup_steps = " + std::to_string(warmup_steps) +
                             " exceeds total_steps = " + std::to_string(total_steps),
                         "warmup must end by total_steps: lower .warmup_steps or raise .total_steps");
    if (min_lr > peak_lr)
      throw config_error(
          s + ".min_lr = " + detail::number_text(min_lr) + " exceeds peak_lr = " + detail::number_text(peak_lr),
          "set .min_lr <= .peak_lr (often peak_lr / 10, or 0)");
  }
};

// Linear warmup, then half a cosine down to min_lr at total_steps, and
// min_lr after. Step 0 runs at lr 0 with the default warmup_start, as in
// Hugging Face's get_cosine_schedule_with_warmup, so PyTorch references line
// up.
using WarmupCosineLR = WarmupDecayLR<detail::CosineDecay>;

// Linear warmup, then a straight line from peak_lr down to min_lr at
// total_steps, and min_lr after (Hugging Face's
// get_linear_schedule_with_warmup with min_lr 0).
using LinearLR = WarmupDecayLR<detail::LinearDecay>;

// Linear warmup to peak_lr at warmup_steps, then peak_lr x sqrt(warmup_steps
// / step): the original Transformer's schedule, which needs no run length
// (fairseq's inverse_sqrt). Without warmup the decay counts from step 1.
struct InverseSqrtLR {
  static constexpr std::string_view name = "inverse_sqrt";

  float peak_lr = 0.f;            // required
  std::int64_t warmup_steps = 0;  // the step the decay starts from (0: decays from step 1)
  float warmup_start = 0.f;       // fraction of peak_lr at step 0

  float operator()(std::int64_t step) const {
    detail::check_step(step);
    const double peak = peak_lr;
    if (step < warmup_steps) return detail::warmup_rate(peak, step, warmup_steps, warmup_start);
    const double pivot = static_cast<double>(std::max<std::int64_t>(warmup_steps, 1));
    return static_cast<float>(peak * std::sqrt(pivot / static_cast<double>(std::max<std::int64_t>(step, 1))));
  }

  void validate() const {
    detail::check_field("InverseSqrtLR", "peak_lr", peak_lr, detail::positive);
    detail::check_field("InverseSqrtLR", "warmup_steps", warmup_steps, detail::step_count);
    detail::check_field("InverseSqrtLR", "warmup_start", warmup_start, detail::fraction);
  }
};

template <class S>
concept LrSchedule = std::copy_constructible<S> && requires(const S& s, std::int64_t step) {
  { s(step) } -> std::convertible_to<float>;
};

// Any schedule behind one runtime type, for settings chosen at run time (a
// command line, a config file) or schedules the user writes as a lambda.
class Schedule {
 public:
  // Validates the schedule when it has a validate(), so a Schedule is always usable.
  // The Schedule check comes first and short-circuits: checking LrSchedule
  // <Schedule> would ask whether Schedule is copyable while that is being
  // decided (clang rejects the recursion; GCC does not notice it).
  template <class S>
  requires(!std::same_as<std::remove_cvref_t<S>, Schedule> && LrSchedule<S>) Schedule(S schedule)
      : name_(name_of<S>()), fn_(validated(std::move(schedule))) {}

  float operator()(std::int64_t step) const { return fn_(step); }
  // The schedule's static `name` ("constant", "cosine"), or "custom".
  std::string_view name() const { return name_; }

 private:
  template <class S>
  static constexpr std::string_view name_of() {
    if constexpr (requires {
                    { &S::name } -> std::convertible_to<const std::string_view*>;
                  })
      return S::name;
    else
      return "custom";
  }

  template <class S>
  static S validated(S schedule) {
    if constexpr (requires { schedule.validate(); }) schedule.validate();
    return schedule;
  }

  std::string_view name_;
  std::function<float(std::int64_t)> fn_;
};

// The settings of a schedule chosen by name at run time.
struct ScheduleParams {
  float lr = 0.f;  // constant: the rate; the others: the peak
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;  // cosine and linear; the others ignore the run length
  float min_lr = 0.f;
  float warmup_start = 0.f;
};

// name: "constant" (ConstantLR), "cosine" (WarmupCosineLR), "linear"
// (LinearLR) or "inverse_sqrt" (InverseSqrtLR). A schedule of your own is a
// callable from the step to the rate: Schedule([](std::int64_t step) { ... }).
inline Schedule make_schedule(std::string_view name, const ScheduleParams& p) {
  if (name == ConstantLR::name) {
    // Refused rather than dropped: a user who asked for warmup expects it.
    if (p.warmup_steps != 0 || p.min_lr != 0.f || p.warmup_start != 0.f)
      throw config_error("LR schedule 'constant' takes no warmup_steps, min_lr or warmup_start",
                         "use 'cosine', 'linear' or 'inverse_sqrt' for warmup and decay, or leave those settings at 0");
    return ConstantLR{.lr = p.lr};
  }
  const auto warmup_decay = [&p]<class S>(std::type_identity<S>) -> Schedule {
    return S{.peak_lr = p.lr,
             .warmup_steps = p.warmup_steps,
             .total_steps = p.total_steps,
             .min_lr = p.min_lr,
             .warmup_start = p.warmup_start};
  };
  if (name == WarmupCosineLR::name) return warmup_decay(std::type_identity<WarmupCosineLR>{});
  if (name == LinearLR::name) return warmup_decay(std::type_identity<LinearLR>{});
  if (name == InverseSqrtLR::name) {
    if (p.min_lr != 0.f)
      throw config_error("LR schedule 'inverse_sqrt' takes no min_lr: it decays without end",
                         "leave min_lr at 0, or use 'cosine' or 'linear'");
    return InverseSqrtLR{.peak_lr = p.lr, .warmup_steps = p.warmup_steps, .warmup_start = p.warmup_start};
  }
  throw config_error("unknown LR schedule '" + std::string(name) + "'",
                     "use one of: constant, cosine, linear, inverse_sqrt");
}

// How a learning rate tuned at one batch size follows a larger effective
// batch: linear (Goyal et al., for SGD) or square root (common for Adam).
enum class lr_scaling_rule { none, linear, sqrt };

// batch_multiplier: the effective batch over the batch lr was tuned at,
// usually the world size (times Accumulate<N> if tuned without accumulation).
inline float scale_lr(float lr, lr_scaling_rule rule, int batch_multiplier) {
  if (batch_multiplier < 1)
    throw config_error("scale_lr: batch multiplier " + std::to_string(batch_multiplier) + " must be >= 1",
                       "pass the effective batch size over the batch size lr was tuned at, e.g. the world size");
  if (rule == lr_scaling_rule::linear) return static_cast<float>(static_cast<double>(lr) * batch_multiplier);
  if (rule == lr_scaling_rule::sqrt) return static_cast<float>(lr * std::sqrt(static_cast<double>(batch_multiplier)));
  return lr;
}

}  // namespace dtrain
