#pragma once
// Elementwise functors over flat buffers, applied with dev.for_each(n, f) so
// one definition runs on the host and on the GPU:
//
//   dev.for_each(n, dtrain::Cast<float, dtrain::bf16>{master, params});
//   dev.for_each(n, dtrain::AccumulateInto<dtrain::bf16>{grad_f32, micro_grad});
//
// Arithmetic is in fp32; a half result is rounded once, to nearest even.

#include <cstddef>
#include <cstdint>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

// Four consecutive elements moved as one aligned access (8 or 16 bytes): the
// GPU's vector paths (Cuda::for_each uses a functor's apply_vector when its
// vector_ok() says every buffer is so aligned). A functor whose vector form
// no GPU run has proven yet says `wide_path = true`: Cuda uses that form
// only with DTRAIN_ELEMENTWISE=wide (CudaPaths). A functor's vector_width is
// its apply_vector's four elements: a contract of its code, not a tuning
// knob (backend/cuda/device_tuning.hpp says so).
template <class T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

inline bool aligned_for_vec4(const void* p, std::size_t element_bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % (4 * element_bytes) == 0;
}

// dst[i] = To(src[i]), e.g. fp32 master weights -> bf16 compute parameters.
template <Dtype From, Dtype To>
struct Cast {
  const From* src;
  To* dst;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { dst[i] = dtype_cast<To>(src[i]); }
#if defined(__CUDACC__)
  // Four elements per access: a 16-byte fp32 load and an 8-byte bf16 store.
  static constexpr std::size_t vector_width = 4;
  static constexpr bool wide_path = true;
  bool vector_ok() const noexcept { return aligned_for_vec4(src, sizeof(From)) && aligned_for_vec4(dst, sizeof(To)); }
  __device__ void apply_vector(std::size_t first) const {
    const Vec4<From> in = *reinterpret_cast<const Vec4<From>*>(src + first);
    Vec4<To> out;
    for (int l = 0; l < 4; ++l) out.v[l] = dtype_cast<To>(in.v[l]);
    *reinterpret_cast<Vec4<To>*>(dst + first) = out;
  }
#endif
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
