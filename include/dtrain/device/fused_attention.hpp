#pragma once
// Fused causal attention for the attention units, on any device: whether a
// call can take it (use_fused_attention) and the calls themselves, which on
// a GPU built with cuDNN (DTRAIN_HAS_CUDNN) go to cuDNN's flash attention
// (backend/cuda/device_attention.hpp) and elsewhere are never reached. The units
// keep their reference path (GEMMs and the causal softmax) for everything
// else: the host, fp32, a build without cuDNN, DTRAIN_ATTENTION=reference
// (the default until a GPU run has proven the fused path), or a problem
// cuDNN cannot serve.

#include <cstdint>
#include <type_traits>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA
#include "dtrain/backend/cuda/device.hpp"
#endif
#include "dtrain/device/attention_shape.hpp"
#if DTRAIN_HAS_CUDA && DTRAIN_HAS_CUDNN
#include "dtrain/backend/cuda/device_attention.hpp"
#endif

namespace dtrain {

// fp32 elements of the softmax statistics (one per query row and head),
// counted in elements of T: what a fused forward keeps beside q, k, v and o.
template <class T>
constexpr std::int64_t attention_stats_size(std::int64_t batch, std::int64_t heads, std::int64_t time) {
  return (batch * heads * time * static_cast<std::int64_t>(sizeof(float)) + static_cast<std::int64_t>(sizeof(T)) - 1) /
         static_cast<std::int64_t>(sizeof(T));
}

// Whether attention `s` in T runs fused on `dev`: a GPU built with cuDNN,
// bf16 or fp16, DTRAIN_ATTENTION=cudnn, and a problem cuDNN serves.
template <class Dev, class T>
bool use_fused_attention([[maybe_unused]] Dev& dev, [[maybe_unused]] const FusedAttentionShape& s) {
#if DTRAIN_HAS_CUDA && DTRAIN_HAS_CUDNN
  if constexpr (std::is_same_v<Dev, Cuda> && !std::is_same_v<T, float>)
    return dev.paths().attention == attention_kernels::cudnn && cudnn_attention_supported(dev, s, attention_dtype_of<T>());
#endif
  return false;
}

template <class Dev, class T>
void fused_attention_forward([[maybe_unused]] Dev& dev, [[maybe_unused]] const FusedAttentionShape& s,
                             [[maybe_unused]] float scale, [[maybe_unused]] const T* q, [[maybe_unused]] const T* k,
                             [[maybe_unused]] const T* v, [[maybe_unused]] const T* bias, [[maybe_unused]] T* o,
                             [[maybe_unused]] float* stats) {
#if DTRAIN_HAS_CUDA && DTRAIN_HAS_CUDNN
  if constexpr (std::is_same_v<Dev, Cuda> && !std::is_same_v<T, float>) {
    cudnn_attention_forward(dev, s, attention_dtype_of<T>(), scale, q, k, v, bias, o, stats);
    return;
  }
#endif
  throw config_error("fused attention called where it cannot run", "report this as a dtrain bug");
}

template <class Dev, class T>
void fused_attention_backward([[maybe_unused]] Dev& dev, [[maybe_unused]] const FusedAttentionShape& s,
                              [[maybe_unused]] float scale, [[maybe_unused]] const T* q, [[maybe_unused]] const T* k,
                              [[maybe_unused]] const T* v, [[maybe_unused]] const T* o,
                              [[maybe_unused]] const T* d_o, [[maybe_unused]] const float* stats,
                              [[maybe_unused]] const T* bias, [[maybe_unused]] T* dq, [[maybe_unused]] T* dk,
                              [[maybe_unused]] T* dv) {
#if DTRAIN_HAS_CUDA && DTRAIN_HAS_CUDNN
  if constexpr (std::is_same_v<Dev, Cuda> && !std::is_same_v<T, float>) {
    cudnn_attention_backward(dev, s, attention_dtype_of<T>(), scale, q, k, v, o, d_o, stats, bias, dq, dk, dv);
    return;
  }
#endif
  throw config_error("fused attention called where it cannot run", "report this as a dtrain bug");
}

}  // namespace dtrain
