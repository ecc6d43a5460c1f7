// nvcc compiles this file: with no Device policy given, a composition made in
// a CUDA translation unit runs on Cuda. The checks are the compilation itself.
#include <type_traits>

#include "dtrain/policy/policies.hpp"

static_assert(std::is_same_v<dtrain::policies<>::device, dtrain::Cuda>);
static_assert(std::is_same_v<dtrain::policies<dtrain::Precision<dtrain::bf16>>::device, dtrain::Cuda>);
static_assert(std::is_same_v<dtrain::policies<dtrain::Device<dtrain::Host>>::device, dtrain::Host>);
