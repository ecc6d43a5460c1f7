#pragma once
// Fused causal attention on the GPU: cuDNN 9's scaled-dot-product attention
// (flash attention: the [T, T] scores never reach memory) through the
// cudnn-frontend graph API, forward and backward, bf16 and fp16 with fp32
// accumulation, grouped-query heads (kv_heads dividing heads) and an
// additive key bias for padding.
//
//   q, k, v, o, and their gradients, are read and written where the units
//   keep them (FusedAttentionShape's strides, device/attention_shape.hpp), so
//   the projections' rows [B*T, 3C] or [B*T, C] are used as they are,
//   without a permute.
//   stats [B, heads, T] fp32: the softmax's log-sum-exp per row, the only
//   thing besides q, k, v, o that backward needs.
//
// A graph is built (tens of milliseconds) once per shape, dtype and
// direction and cached per device, with one workspace (Cuda's extra
// workspace) that grows to the largest graph's need. The backward runs
// cuDNN's deterministic algorithm, so a step is reproducible as the rest of
// dtrain's is.
//
// These are declarations: the definitions (cmake/dtrain_cudnn.cpp) include the
// cudnn-frontend headers, which take over a minute to compile under nvcc, so
// they are compiled once per program: dtrain's own build links the
// dtrain_cudnn library, a program using the installed package links
// dtrain::cudnn. Both define DTRAIN_HAS_CUDNN; the units call these only
// then, and only with DTRAIN_ATTENTION=cudnn (CudaPaths), through
// FusedAttention<Cuda>, the device's specialisation of the attention units'
// customisation point (device/fused_attention.hpp), at the end of this file;
// backend/cuda/device.hpp includes it. On a problem cuDNN cannot serve the
// units run their reference path.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA && DTRAIN_HAS_CUDNN

#include <type_traits>

#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/device/attention_shape.hpp"
#include "dtrain/device/fused_attention.hpp"

namespace dtrain {

enum class attention_dtype { bf16, fp16 };

template <class T>
constexpr attention_dtype attention_dtype_of() {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, fp16>, "cuDNN's fused attention takes bf16 or fp16");
  return std::is_same_v<T, bf16> ? attention_dtype::bf16 : attention_dtype::fp16;
}

// Whether cuDNN can run attention `s` on `dev` (builds and caches both
// directions' graphs on first use).
bool cudnn_attention_supported(Cuda& dev, const FusedAttentionShape& s, attention_dtype t);

// o = softmax(q k^T * scale + causal mask + key bias) v, and the softmax
// statistics for backward. bias: [batch, time] (s.key_bias) or null.
void cudnn_attention_forward(Cuda& dev, const FusedAttentionShape& s, attention_dtype t, float scale, const void* q,
                             const void* k, const void* v, const void* bias, void* o, float* stats);

// dq, dk, dv from the forward's q, k, v, o, stats and the output gradient d_o.
void cudnn_attention_backward(Cuda& dev, const FusedAttentionShape& s, attention_dtype t, float scale, const void* q,
                              const void* k, const void* v, const void* o, const void* d_o, const float* stats,
                              const void* bias, void* dq, void* dk, void* dv);

// The attention units' fused path on a GPU: cuDNN, in bf16 and fp16, when
// DTRAIN_ATTENTION=cudnn and cuDNN serves the problem.
template <>
struct FusedAttention<Cuda> {
  template <class T>
  static constexpr bool takes = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

  template <class T>
  static bool supported(Cuda& dev, const FusedAttentionShape& s) {
    return dev.paths().attention == attention_kernels::cudnn &&
           cudnn_attention_supported(dev, s, attention_dtype_of<T>());
  }
  template <class T>
  static void forward(Cuda& dev, const FusedAttentionShape& s, float scale, const T* q, const T* k, const T* v,
                      const T* bias, T* o, float* stats) {
    cudnn_attention_forward(dev, s, attention_dtype_of<T>(), scale, q, k, v, bias, o, stats);
  }
  template <class T>
  static void backward(Cuda& dev, const FusedAttentionShape& s, float scale, const T* q, const T* k, const T* v,
                       const T* o, const T* d_o, const float* stats, const T* bias, T* dq, T* dk, T* dv) {
    cudnn_attention_backward(dev, s, attention_dtype_of<T>(), scale, q, k, v, o, d_o, stats, bias, dq, dk, dv);
  }
};

}  // namespace dtrain

#endif  // DTRAIN_HAS_CUDA && DTRAIN_HAS_CUDNN
