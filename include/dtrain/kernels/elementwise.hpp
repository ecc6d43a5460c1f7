#pragma once
// Elementwise functors over flat buffers, applied with dev.for_each(n, f) so
// one definition runs on the host and on the GPU:
//
//   dev.for_each(n, dtrain::Cast<float, dtrain::bf16>{master, params});
//   dev.for_each(n, dtrain::AccumulateInto<dtrain::bf16>{grad_f32, micro_grad});
//
// Arithmetic is in fp32; a half result is rounded once, to nearest even.

#include <cstddef>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

// dst[i] = To(src[i]), e.g. fp32 master weights -> bf16 compute parameters.
template <Dtype From, Dtype To>
struct Cast {
  const From* src;
  To* dst;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { dst[i] = dtype_cast<To>(src[i]); }
};

// dst[i] += float(src[i]): sums micro-batch gradients into an fp32 buffer.
template <Dtype T>
struct AccumulateInto {
  float* dst;
  const T* src;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { dst[i] += static_cast<float>(src[i]); }
};

// dst[i] = T(dst[i] + src[i]) in the compute dtype: a tied parameter's
// gradient added into its owner's (one rounding, like any other sum in T).
template <Dtype T>
struct AddInto {
  T* dst;
  const T* src;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    dst[i] = dtype_cast<T>(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
  }
};

// data[i] *= factor, e.g. averaging or unscaling gradients in place.
template <Dtype T>
struct Scale {
  T* data;
  float factor;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    data[i] = dtype_cast<T>(static_cast<float>(data[i]) * factor);
  }
};

}  // namespace dtrain
