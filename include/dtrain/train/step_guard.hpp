#pragma once
// What stands between a step's gradients and its update: the fp16 loss scale
// (dynamic, as PyTorch's GradScaler), the policy for a non-finite loss or
// gradient (stop naming the first unit, or skip), and clipping by the global
// norm. One decision per step, the same on every rank (the loss and the norm
// are), so every rank applies or skips alike.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/wire.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/strategy/any_strategy.hpp"
#include "dtrain/train/options.hpp"

namespace dtrain {

// The non-tensor state a Trainer carries from step to step (checkpointed).
struct TrainState {
  std::int64_t step = 0;        // optimizer steps taken
  double loss_scale = 1.0;      // fp16's dynamic loss scale (1 otherwise)
  std::int64_t good_steps = 0;  // steps since the scale last changed
};

// The step's verdict: whether to update, the norm to report, and what the
// optimizer multiplies each gradient by (1 / loss scale x the clip factor).
struct StepDecision {
  bool apply = false;
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  float grad_scale = 1.f;
};

namespace detail {
// Where one rank's owned gradient first holds inf or NaN: a key that orders
// positions by unit, then by position in the unit, and the parameter's name.
struct NonfiniteAt {
  std::uint64_t key = std::numeric_limits<std::uint64_t>::max();
  std::string name;
  static constexpr auto wire_fields() {
    return std::tuple{field("key", &NonfiniteAt::key), field("name", &NonfiniteAt::name)};
  }
};

// "the first non-finite gradient is in <param>": the first of every rank's
// `mine`. Collective.
DTRAIN_DECL std::string first_nonfinite_text(World& world, const NonfiniteAt& mine);
}  // namespace detail

template <class Dev, class T>
class StepGuard {
 public:
  StepGuard(const TrainerOptions& options, bool loss_scaling) : options_(options), loss_scaling_(loss_scaling) {}

  // A new run's state: the initial loss scale under fp16.
  TrainState initial_state() const {
    return {0, loss_scaling_ ? static_cast<double>(options_.loss_scale.initial) : 1.0, 0};
  }

  // After the step's gradients are final (`loss` is the step's mean loss).
  // Updates the loss scale in `state`; throws nonfinite_error (naming where)
  // under the stop policy.
  StepDecision decide(double loss, TrainState& state, World& world, Dev& dev, const ModelLayout& layout,
                      AnyStrategy<T>& strategy);

 private:
  // "the first non-finite gradient is in <param>", over every rank's owned
  // elements in layout order. Collective.
  static std::string first_nonfinite(World& world, Dev& dev, const ModelLayout& layout, AnyStrategy<T>& strategy);

  TrainerOptions options_;
  bool loss_scaling_;
};

template <class Dev, class T>
StepDecision StepGuard<Dev, T>::decide(double loss, TrainState& state, World& world, Dev& dev,
                                       const ModelLayout& layout, AnyStrategy<T>& strategy) {
  const bool norm_needed = options_.grad_norm || options_.clip.max_norm > 0 || loss_scaling_;
  const double norm2 = norm_needed ? strategy.grad_norm_squared() : std::numeric_limits<double>::quiet_NaN();
  StepDecision d;
  d.grad_norm = std::sqrt(norm2) / state.loss_scale;
  if (!loss_scaling_ && (!std::isfinite(loss) || (norm_needed && !std::isfinite(norm2)))) {
    if (options_.on_nonfinite == nonfinite_policy::skip) return d;
    throw nonfinite_error("step " + std::to_string(state.step + 1) + " has a non-finite " +
                              (std::isfinite(loss) ? "gradient norm" : "loss") + " (loss " + std::to_string(loss) +
                              "); " + first_nonfinite(world, dev, layout, strategy),
                          "look for a bad batch or a too high learning rate, then resume from the last "
                          "checkpoint; TrainerOptions::on_nonfinite = skip (the examples' on_nonfinite=skip) "
                          "skips such steps instead");
  }
  if (loss_scaling_) {
    if (!std::isfinite(norm2)) {  // an overflow: skip, shrink the scale
      state.loss_scale *= options_.loss_scale.backoff;
      state.good_steps = 0;
      return d;
    }
    if (++state.good_steps == options_.loss_scale.window) {
      state.loss_scale *= options_.loss_scale.growth;
      state.good_steps = 0;
    }
  }
  const double max_norm = options_.clip.max_norm;
  const double clip = max_norm > 0 && d.grad_norm > max_norm ? max_norm / (d.grad_norm + 1e-6) : 1.0;
  d.apply = true;
  d.grad_scale = static_cast<float>(clip / state.loss_scale);
  return d;
}

template <class Dev, class T>
std::string StepGuard<Dev, T>::first_nonfinite(World& world, Dev& dev, const ModelLayout& layout,
                                               AnyStrategy<T>& strategy) {
  const OwnedFlat<T> owned = strategy.owned();
  std::vector<float> grad(owned.size);
  if (owned.on_host)
    std::copy_n(owned.grad, owned.size, grad.data());
  else if (owned.size)
    dev.copy_to_host(grad.data(), owned.grad, owned.size);
  // Ordered by unit, then by position in the unit (the flat itself holds
  // the units in reverse order).
  detail::NonfiniteAt mine;
  for (const OwnedRange& r : strategy.ownership().trainable) {
    const auto& unit = layout.units()[r.unit];
    for (std::size_t i = 0; i < r.count; ++i)
      if (!std::isfinite(grad[r.offset + i])) {
        const std::size_t at = unit.train_offset + r.begin + i;
        const std::uint64_t key = (static_cast<std::uint64_t>(r.unit) << 40) + r.begin + i;
        if (key < mine.key) {
          mine.key = key;
          mine.name.clear();
          for (const auto& slot : unit.params)
            if (slot.spec.trainable && slot.offset <= at &&
                at < slot.offset + static_cast<std::size_t>(slot.spec.numel()))
              mine.name = slot.name;
        }
        break;
      }
  }
  return detail::first_nonfinite_text(world, mine);
}

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_STEP_GUARD_TEMPLATES(X, Dev, T) X(class StepGuard<Dev, T>)

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/train/step_guard.ipp"
#endif
