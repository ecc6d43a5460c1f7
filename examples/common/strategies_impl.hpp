#pragma once
// strategy_for's definition: the config's strategy name picks one of
// dtrain::builtin_strategies, the config's keys fill its options.

#include <cstddef>
#include <tuple>
#include <type_traits>

#include "common/dispatch.hpp"
#include "common/strategies.hpp"

#include <dtrain/backend/backends.hpp>
#include <dtrain/strategy/ddp.hpp>
#include <dtrain/strategy/fsdp.hpp>
#include <dtrain/strategy/zero1.hpp>

namespace examples {

// A strategy's options from the config's keys, for the fields it has
// (shard_group, prefetch, bucket_mb).
template <class Options>
Options strategy_options(const Common& c) {
  Options o{};
  if constexpr (requires { o.shard_group; }) o.shard_group = c.shard_group;
  if constexpr (requires { o.prefetch; }) o.prefetch = c.prefetch;
  if constexpr (requires { o.bucket_bytes; }) o.bucket_bytes = static_cast<std::size_t>(c.bucket_mb * (1 << 20));
  return o;
}

template <class Dev, class Prec>
dtrain::StrategyFactory<Dev, typename Prec::param_type> strategy_for(const Common& c) {
  using T = typename Prec::param_type;
  using R = typename Prec::reduce_type;
  check_strategy_name(c.strategy);
  dtrain::StrategyFactory<Dev, T> out;
  [&]<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    ((c.strategy == Kind::name &&
      (out = dtrain::strategy_factory<Kind, Dev, T, R>(
           strategy_options<dtrain::strategy_options_t<typename dtrain::strategy_impl<Kind, Dev, T, R>::type>>(c)),
       true)) ||
     ...);
  }(std::type_identity<dtrain::builtin_strategies>{});
  return out;
}

// Its explicit instantiation (strategies_host.cpp, strategies_cuda.cu)
// compiles strategy_for<Dev, Prec> for every precision of Precisions, which
// the examples' translation units then only declare.
template <class Dev, class Precs>
struct StrategyFactories;
template <class Dev, class... Prec>
struct StrategyFactories<Dev, std::tuple<Prec...>> {
  static std::tuple<dtrain::StrategyFactory<Dev, typename Prec::param_type> (*)(const Common&)...> all() {
    return {&strategy_for<Dev, Prec>...};
  }
};

}  // namespace examples
