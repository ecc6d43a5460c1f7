#pragma once
// From the config's strategy and precision names to what the Trainer is
// built with. The strategy is chosen at run time (a StrategyFactory, built
// once per device for every example: common/strategies.hpp); the precision
// fixes the compute dtype, so it stays a compile-time type, one TrainerCore
// per precision.

#include <string>
#include <tuple>
#include <type_traits>

#include "common/config.hpp"

#include <dtrain/core/error.hpp>
#include <dtrain/policy/precision.hpp>
#include <dtrain/policy/strategy.hpp>

namespace examples {

// Throws unless `name` is one of dtrain::builtin_strategies' names.
inline void check_strategy_name(const std::string& name) {
  std::string known;
  const bool found = [&]<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    ((known += (known.empty() ? "" : ", ") + std::string(Kind::name)), ...);
    return ((name == Kind::name) || ...);
  }(std::type_identity<dtrain::builtin_strategies>{});
  if (!found) throw dtrain::config_error("strategy = '" + name + "' is unknown", "use one of " + known);
}

// The precisions the examples offer: precision=fp32|bf16|fp16, with
// reduce_dtype=same for the 16-bit reductions.
using Precisions = std::tuple<dtrain::Precision<dtrain::fp32>, dtrain::Precision<dtrain::bf16>,
                              dtrain::Precision<dtrain::bf16, dtrain::bf16>, dtrain::Precision<dtrain::fp16>,
                              dtrain::Precision<dtrain::fp16, dtrain::fp16>>;

// f.template operator()<Prec>() with the config's precision.
template <class F>
int with_precision(const Common& c, F&& f) {
  using namespace dtrain;
  const bool same = c.reduce_dtype == "same";
  if (c.precision == "fp32") return f.template operator()<Precision<fp32>>();
  if (c.precision == "bf16")
    return same ? f.template operator()<Precision<bf16, bf16>>() : f.template operator()<Precision<bf16>>();
  if (c.precision == "fp16")
    return same ? f.template operator()<Precision<fp16, fp16>>() : f.template operator()<Precision<fp16>>();
  throw config_error("precision = '" + c.precision + "' is unknown", "use fp32, bf16 or fp16");
}

}  // namespace examples
