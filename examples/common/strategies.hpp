#pragma once
// The config's strategy as a dtrain::StrategyFactory. Declared here and
// defined in common/strategies_impl.hpp, which only common/strategies_host.cpp
// and common/strategies_cuda.cu include: every strategy's code is compiled
// once per device for all the examples, and the examples' own translation
// units compile the training loop once per precision.

#include "common/config.hpp"

#include <dtrain/strategy/any_strategy.hpp>

namespace examples {

template <class Dev, class Prec>
dtrain::StrategyFactory<Dev, typename Prec::param_type> strategy_for(const Common& c);

}  // namespace examples
