#pragma once
// Strategy<Kind>'s options with HybridShard's group and the prefetch depth
// set where the kind has them: each strategy owns its options struct
// (DdpOptions, FsdpOptions, Zero1Options), and tests that loop over kinds set
// the knobs the kind understands.

#include <dtrain/strategy/strategy.hpp>

template <class Kind, class Dev = dtrain::Host>
auto kind_options(int shard_group, int prefetch = 1) {
  dtrain::strategy_options_t<typename dtrain::strategy_impl<Kind, Dev, float, float>::type> o{};
  if constexpr (requires { o.shard_group; }) o.shard_group = shard_group;
  if constexpr (requires { o.prefetch; }) o.prefetch = prefetch;
  return o;
}
