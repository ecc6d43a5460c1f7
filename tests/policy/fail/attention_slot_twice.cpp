// expect: nn::Attention: a policy slot (mask, positions, projections or input) is given twice
#include <dtrain/nn/rotary_attention.hpp>

using namespace dtrain::nn;
#ifdef DTRAIN_CONTROL
using U = Attention<Bidirectional, Rotary>;
#else
using U = Attention<Causal, Rotary, Bidirectional>;
#endif
[[maybe_unused]] constexpr auto size = sizeof(U);
