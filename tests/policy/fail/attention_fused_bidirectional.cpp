// expect: nn::Attention: could not build an attention unit for these policies (FusedQkv is causal
// self-attention without positions; CrossInput is Bidirectional without Rotary)
#include <dtrain/nn/attention.hpp>

using namespace dtrain::nn;
#ifdef DTRAIN_CONTROL
using U = Attention<FusedQkv>;
#else
using U = Attention<FusedQkv, Bidirectional>;
#endif
[[maybe_unused]] constexpr auto size = sizeof(U);
