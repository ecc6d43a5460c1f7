// Every built-in strategy on the Cuda device, for every example (nvcc).
#include "common/strategies_impl.hpp"

template struct examples::StrategyFactories<dtrain::Cuda, examples::Precisions>;
