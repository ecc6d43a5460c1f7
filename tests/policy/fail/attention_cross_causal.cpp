// expect: nn::Attention: CrossInput needs the Bidirectional mask
#include <dtrain/nn/rotary_attention.hpp>

using namespace dtrain::nn;
#ifdef DTRAIN_CONTROL
using U = Attention<CrossInput, Bidirectional>;
#else
using U = Attention<CrossInput>;
#endif
[[maybe_unused]] constexpr auto size = sizeof(U);
