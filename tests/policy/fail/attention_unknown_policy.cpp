// expect: nn::Attention: every policy must be one of Causal, Bidirectional, NoPositions, Rotary,
// SeparateQkv, FusedQkv, SelfInput, CrossInput
#include <dtrain/nn/rotary_attention.hpp>

using namespace dtrain::nn;
#ifdef DTRAIN_CONTROL
using U = Attention<Rotary>;
#else
using U = Attention<Rotary, int>;
#endif
[[maybe_unused]] constexpr auto size = sizeof(U);
