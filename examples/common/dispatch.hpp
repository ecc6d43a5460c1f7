#pragma once
// From the config's strategy, precision and accumulate names to compiled
// policies. Each example instantiates its training function once per
// (device, strategy) in a generated translation unit of its own
// (examples/CMakeLists.txt), so the build compiles them in parallel; the
// precision and accumulation variants are instantiated inside each.

#include <dtrain/trainer.hpp>

#include <string>
#include <tuple>
#include <type_traits>

#include "common/config.hpp"

namespace examples {

// The strategies the examples offer; each name is Kind::name (strategy=...).
using Strategies = std::tuple<dtrain::DDP, dtrain::FSDP<dtrain::FullShard>, dtrain::FSDP<dtrain::ShardGradOp>,
                              dtrain::FSDP<dtrain::NoShard>, dtrain::FSDP<dtrain::HybridShard>, dtrain::ZeRO1>;

// Throws unless `name` is one of Strategies' names.
inline void check_strategy_name(const std::string& name) {
  std::string known;
  const bool found = [&]<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    ((known += (known.empty() ? "" : ", ") + std::string(Kind::name)), ...);
    return ((name == Kind::name) || ...);
  }(std::type_identity<Strategies>{});
  if (!found) throw dtrain::config_error("strategy = '" + name + "' is unknown", "use one of " + known);
}

// f.template operator()<Kind>() for the config's strategy Kind.
template <class F>
int with_strategy(const Common& c, F&& f) {
  check_strategy_name(c.strategy);
  return [&]<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    int rc = 0;
    ((c.strategy == Kind::name && (rc = f.template operator()<Kind>(), true)) || ...);
    return rc;
  }(std::type_identity<Strategies>{});
}

// f.template operator()<Policies...>() with the config's precision and
// accumulation, under strategy Kind on device Dev.
template <class Dev, class Kind, class F>
int with_policies(const Common& c, F&& f) {
  using namespace dtrain;
  auto with_accumulate = [&]<class Prec>(std::type_identity<Prec>) {
    switch (c.accumulate) {
      case 1: return f.template operator()<Device<Dev>, Strategy<Kind>, Prec, Accumulate<1>>();
      case 2: return f.template operator()<Device<Dev>, Strategy<Kind>, Prec, Accumulate<2>>();
      case 4: return f.template operator()<Device<Dev>, Strategy<Kind>, Prec, Accumulate<4>>();
      case 8: return f.template operator()<Device<Dev>, Strategy<Kind>, Prec, Accumulate<8>>();
    }
    throw config_error("accumulate = " + std::to_string(c.accumulate) + " is not built into the examples",
                       "use 1, 2, 4 or 8");
  };
  const bool same = c.reduce_dtype == "same";
  if (c.precision == "fp32") return with_accumulate(std::type_identity<Precision<fp32>>{});
  if (c.precision == "bf16")
    return same ? with_accumulate(std::type_identity<Precision<bf16, bf16>>{})
                : with_accumulate(std::type_identity<Precision<bf16>>{});
  if (c.precision == "fp16")
    return same ? with_accumulate(std::type_identity<Precision<fp16, fp16>>{})
                : with_accumulate(std::type_identity<Precision<fp16>>{});
  throw config_error("precision = '" + c.precision + "' is unknown", "use fp32, bf16 or fp16");
}

}  // namespace examples
