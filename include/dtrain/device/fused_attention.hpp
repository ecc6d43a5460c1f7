#pragma once
// Fused causal attention for the attention units, on any device: whether a
// call can take it (use_fused_attention) and the calls themselves. A backend
// with a fused kernel specialises FusedAttention for its device (the CUDA
// backend with cuDNN: backend/cuda/device_attention.hpp, which its device
// header includes, so whoever can name the device sees the specialisation);
// elsewhere the calls are never reached. The units keep their reference
// path (GEMMs and the causal softmax) for everything else: the host, fp32,
// a build without cuDNN, DTRAIN_ATTENTION=reference (the default until a
// GPU run has proven the fused path), or a problem cuDNN cannot serve.

#include <cstdint>

#include "dtrain/core/error.hpp"
#include "dtrain/device/attention_shape.hpp"

namespace dtrain {

// The customisation point. A specialisation for a device provides
//   template <class T> static constexpr bool takes     the dtypes it computes in
//   template <class T> static bool supported(dev, s)   whether it runs problem s now
//   forward(dev, s, scale, q, k, v, bias, o, stats)     (templates over the dtype)
//   backward(dev, s, scale, q, k, v, o, d_o, stats, bias, dq, dk, dv)
// as fused_attention_forward / _backward below describe them.
template <class Dev>
struct FusedAttention {
  template <class T>
  static constexpr bool takes = false;
};

// fp32 elements of the softmax statistics (one per query row and head),
// counted in elements of T: what a fused forward keeps beside q, k, v and o.
template <class T>
constexpr std::int64_t attention_stats_size(std::int64_t batch, std::int64_t heads, std::int64_t time) {
  return (batch * heads * time * static_cast<std::int64_t>(sizeof(float)) + static_cast<std::int64_t>(sizeof(T)) - 1) /
         static_cast<std::int64_t>(sizeof(T));
}

// Whether attention `s` in T runs fused on `dev` (on a GPU built with cuDNN:
// bf16 or fp16, DTRAIN_ATTENTION=cudnn, and a problem cuDNN serves).
template <class Dev, class T>
bool use_fused_attention([[maybe_unused]] Dev& dev, [[maybe_unused]] const FusedAttentionShape& s) {
  if constexpr (FusedAttention<Dev>::template takes<T>)
    return FusedAttention<Dev>::template supported<T>(dev, s);
  else
    return false;
}

// o = softmax(q k^T * scale + causal mask + key bias) v, and the softmax
// statistics for backward. bias: [batch, time] (s.key_bias) or null.
template <class Dev, class T>
void fused_attention_forward([[maybe_unused]] Dev& dev, [[maybe_unused]] const FusedAttentionShape& s,
                             [[maybe_unused]] float scale, [[maybe_unused]] const T* q, [[maybe_unused]] const T* k,
                             [[maybe_unused]] const T* v, [[maybe_unused]] const T* bias, [[maybe_unused]] T* o,
                             [[maybe_unused]] float* stats) {
  if constexpr (FusedAttention<Dev>::template takes<T>)
    FusedAttention<Dev>::forward(dev, s, scale, q, k, v, bias, o, stats);
  else
    throw config_error("fused attention called where it cannot run", "report this as a dtrain bug");
}

// dq, dk, dv from the forward's q, k, v, o, stats and the output gradient d_o.
template <class Dev, class T>
void fused_attention_backward([[maybe_unused]] Dev& dev, [[maybe_unused]] const FusedAttentionShape& s,
                              [[maybe_unused]] float scale, [[maybe_unused]] const T* q, [[maybe_unused]] const T* k,
                              [[maybe_unused]] const T* v, [[maybe_unused]] const T* o, [[maybe_unused]] const T* d_o,
                              [[maybe_unused]] const float* stats, [[maybe_unused]] const T* bias,
                              [[maybe_unused]] T* dq, [[maybe_unused]] T* dk, [[maybe_unused]] T* dv) {
  if constexpr (FusedAttention<Dev>::template takes<T>)
    FusedAttention<Dev>::backward(dev, s, scale, q, k, v, o, d_o, stats, bias, dq, dk, dv);
  else
    throw config_error("fused attention called where it cannot run", "report this as a dtrain bug");
}

}  // namespace dtrain
