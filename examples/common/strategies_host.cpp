// Every built-in strategy on the host device, for every example.
#include "common/strategies_impl.hpp"

template struct examples::StrategyFactories<dtrain::Host, examples::Precisions>;
