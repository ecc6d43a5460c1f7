#pragma once
// The attention family's SeparateQkv members (nn/attention_policies.hpp),
// nn::Attention<Mask, Positions, SeparateQkv, Input>; nn::RotaryAttention is
// Attention<Rotary>, causal self-attention as Llama-family models compute it,
// over activations [rows = B * T, dim]:
//   q = x Wq^T (+ bq)   [heads x head_dim]      k, v = x Wk^T, x Wv^T (+ b)
//                                                [kv_heads x head_dim]
//   QK-norm (qk_norm): RMSNorm over head_dim on every q and k head
//   rotary position embedding on q and k (transformers' half-split layout:
//   element d pairs with d + head_dim/2, rotated by t * rope_theta^(-2i/head_dim))
//   grouped-query attention: query head h reads key/value head h / (heads / kv_heads)
//   per (batch, head): A = softmax_mask(q k^T / sqrt(head_dim)), o = A v
//   y = concat_heads(o) Wo^T (+ bo)
// Bidirectional: the mask keeps every key. CrossInput: k and v from the
// memory [B * T_mem, memory_dim] instead of x (detail::CrossAttentionPaths).
// Parameters (transformers' names and shapes): q.weight [heads hd, dim],
// k.weight [kv_heads hd, memory_dim], v.weight [kv_heads hd, memory_dim],
// o.weight [dim, heads hd], then q/k/v.bias with qkv_bias (Qwen2), o.bias
// with out_bias, q_norm.weight and k_norm.weight [hd] with qk_norm. Padding:
// the batch's "attention_mask" as for nn::CausalSelfAttention (positions
// stay 0..T-1, as transformers numbers them in a forward pass; rotary scores
// depend only on t - j, so left padding does not change what the tokens
// compute); CrossInput: "encoder_attention_mask" [B, T_mem].
//
// Kept for backward (UnitContext::saved): the rotated q, the key and value
// heads repeated to `heads` (so every product is one strided batched GEMM,
// as transformers' repeat_kv), the probabilities and the merged heads:
// 4 * rows * heads * hd + B * heads * T * T elements (self-attention; with
// QK-norm also q's and k's projections). The repeated key and value
// gradients are summed back per group, in a fixed order (no atomics).
// Causal self-attention without QK-norm, on a GPU with
// DTRAIN_ATTENTION=cudnn, in bf16 or fp16: cuDNN's fused attention takes
// grouped key/value heads as they are, in the projections' rows
// (device/fused_attention.hpp): kept are the rotated q, k and v rows, the
// merged heads and the softmax statistics (saved_size_on). The other forms
// run on a GPU only with DTRAIN_GPU_ATTENTION=on (not yet proven there).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/device/fused_attention.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/kernels/matrix.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/attention_policies.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/lora.hpp"
#include "dtrain/nn/rms_norm.hpp"

namespace dtrain::nn {

namespace detail {

// cos and sin of t * inv_freq[i] for t < time, i < head_dim / 2, [time, half]
// each. The frequency and the angle are rounded to float as transformers
// computes them in float32, so long positions give the same angles; the
// trigonometry of the rounded angle is exact to double.
struct RopeTable {
  float* cos_out;
  float* sin_out;
  std::int64_t half;
  float theta;
  float factor = 1.f;  // linear scaling: the frequencies divided by it (in float, as transformers' "linear")
  DTRAIN_HOST_DEVICE void operator()(std::size_t n) const {
    const auto t = static_cast<std::int64_t>(n) / half, i = static_cast<std::int64_t>(n) % half;
    const float inv_freq = static_cast<float>(1.0 / ::pow(static_cast<double>(theta),
                                                          static_cast<double>(2 * i) / static_cast<double>(2 * half))) /
                           factor;
    const double angle = static_cast<double>(static_cast<float>(t) * inv_freq);
    cos_out[n] = static_cast<float>(::cos(angle));
    sin_out[n] = static_cast<float>(::sin(angle));
  }
};

// The rotation of one pair (a, b) = (x[d], x[d + half]) by an angle with
// cosine c and sine sn, and its transpose (which undoes it: the gradient).
//   rotate:   a' = a c - b sn,   b' = b c + a sn
//   unrotate: a = a' c + b' sn,  b = b' c - a' sn
struct RotatedPair {
  float a, b;
};
DTRAIN_HOST_DEVICE inline RotatedPair rotate_pair(float a, float b, float c, float sn) {
  return {a * c - b * sn, b * c + a * sn};
}
DTRAIN_HOST_DEVICE inline RotatedPair unrotate_pair(float a, float b, float c, float sn) {
  return {a * c + b * sn, b * c - a * sn};
}

// The fused path's rotation, in place on projection rows [B*T, heads hd]:
// one index per (row, head, pair), rotating (or with `inverse` unrotating)
// elements d and d + hd/2 of the head by position t's angles.
template <class T>
struct RotatePairs {
  T* rows;
  std::int64_t heads, head_dim, time;
  const float* cos_t;
  const float* sin_t;
  bool inverse;
  const std::int64_t* positions = nullptr;  // packed records' positions [rows], or null: row % time
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t half = head_dim / 2, n = static_cast<std::int64_t>(i);
    const std::int64_t f = n % half, h = (n / half) % heads, row = n / (half * heads);
    const std::int64_t t = positions != nullptr ? positions[row] : row % time;
    T* head = rows + row * heads * head_dim + h * head_dim;
    const float c = cos_t[t * half + f], sn = sin_t[t * half + f];
    const float a = static_cast<float>(head[f]), b = static_cast<float>(head[f + half]);
    const RotatedPair r = inverse ? unrotate_pair(a, b, c, sn) : rotate_pair(a, b, c, sn);
    head[f] = dtype_cast<T>(r.a);
    head[f + half] = dtype_cast<T>(r.b);
  }
};

// The shapes of one call: q has `heads`, k and v `kv_heads`, all head_dim wide.
struct GqaShape {
  std::int64_t batch, time, heads, kv_heads, head_dim;
  bool rope;
  const std::int64_t* positions = nullptr;  // packed records' positions [B, T] on the device, or null
  DTRAIN_HOST_DEVICE std::int64_t rows() const { return batch * time; }
  // The rotary position of token t of sequence b: t, or its place in its packed record.
  DTRAIN_HOST_DEVICE std::int64_t position(std::int64_t b, std::int64_t t) const {
    return positions != nullptr ? positions[b * time + t] : t;
  }
  DTRAIN_HOST_DEVICE std::int64_t group() const { return heads / kv_heads; }
  DTRAIN_HOST_DEVICE std::int64_t head_elems() const { return rows() * heads * head_dim; }
};

// Projections [rows, h hd] -> q, k, v in the head layout [B, heads, T, hd],
// rotating q and k and repeating each key/value head for its group. Run over
// 3 * B * heads * T * hd elements (q, then k, then v).
template <class T>
struct ToRotatedHeads {
  GqaShape s;
  const T* q_rows;
  const T* k_rows;
  const T* v_rows;
  const float* cos_t;
  const float* sin_t;
  T* q;  // followed by k and v, head_elems() apart
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i), per = s.head_elems();
    const std::int64_t part = n / per, e = n % per;
    const std::int64_t d = e % s.head_dim, t = (e / s.head_dim) % s.time, bh = e / (s.head_dim * s.time);
    const std::int64_t b = bh / s.heads, h = bh % s.heads;
    const std::int64_t src_head = part == 0 ? h : h / s.group();
    const std::int64_t width = (part == 0 ? s.heads : s.kv_heads) * s.head_dim;
    const T* row = (part == 0   ? q_rows
                    : part == 1 ? k_rows
                                : v_rows) +
                   (b * s.time + t) * width + src_head * s.head_dim;
    float out = static_cast<float>(row[d]);
    if (s.rope && part < 2) {
      const std::int64_t half = s.head_dim / 2, f = d % half, p = s.position(b, t);
      const RotatedPair r = rotate_pair(static_cast<float>(row[f]), static_cast<float>(row[f + half]),
                                        cos_t[p * half + f], sin_t[p * half + f]);
      out = d < half ? r.a : r.b;
    }
    q[n] = dtype_cast<T>(out);
  }
  // The host's loops (backend/host/device_isa.hpp): one head row of head_dim at a
  // time, its first half and its second half each a contiguous loop.
  void span(std::size_t begin, std::size_t end) const {
    const std::int64_t hd = s.head_dim, half = hd / 2, per = s.head_elems();
    dtrain::detail::row_pieces(begin, end, hd, [&](std::int64_t r, std::int64_t d0, std::int64_t d1) {
      const std::int64_t part = r * hd / per, t = r % s.time, bh = (r * hd % per) / (hd * s.time);
      const std::int64_t b = bh / s.heads, h = bh % s.heads, src_head = part == 0 ? h : h / s.group();
      const std::int64_t width = (part == 0 ? s.heads : s.kv_heads) * hd;
      const T* row = (part == 0 ? q_rows : part == 1 ? k_rows : v_rows) + (b * s.time + t) * width + src_head * hd;
      T* out = q + r * hd;
      if (!(s.rope && part < 2)) {
        for (std::int64_t d = d0; d < d1; ++d) out[d] = dtype_cast<T>(static_cast<float>(row[d]));
        return;
      }
      const float* c = cos_t + s.position(b, t) * half;
      const float* sn = sin_t + s.position(b, t) * half;
      for (std::int64_t d = d0; d < (d1 < half ? d1 : half); ++d)
        out[d] =
            dtype_cast<T>(rotate_pair(static_cast<float>(row[d]), static_cast<float>(row[d + half]), c[d], sn[d]).a);
      for (std::int64_t d = (d0 > half ? d0 : half); d < d1; ++d) {
        const std::int64_t f = d - half;
        out[d] = dtype_cast<T>(rotate_pair(static_cast<float>(row[f]), static_cast<float>(row[d]), c[f], sn[f]).b);
      }
    });
  }
};

// The transpose: gradients in the head layout -> gradients of the three
// projections [rows, h hd], undoing the rotation and summing each key/value
// head's group. Run over rows * (heads + 2 kv_heads) * hd elements.
template <class T>
struct FromRotatedHeads {
  GqaShape s;
  const T* dq;  // followed by dk and dv (repeated), head_elems() apart
  const float* cos_t;
  const float* sin_t;
  T* dq_rows;
  T* dk_rows;
  T* dv_rows;
  DTRAIN_HOST_DEVICE float unrotate(const T* head_row, std::int64_t t, std::int64_t d) const {
    if (!s.rope) return static_cast<float>(head_row[d]);
    const std::int64_t half = s.head_dim / 2, f = d % half;
    const RotatedPair r = unrotate_pair(static_cast<float>(head_row[f]), static_cast<float>(head_row[f + half]),
                                        cos_t[t * half + f], sin_t[t * half + f]);
    return d < half ? r.a : r.b;
  }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t q_cols = s.heads * s.head_dim, kv_cols = s.kv_heads * s.head_dim;
    const std::int64_t cols = q_cols + 2 * kv_cols, row = n / cols, col = n % cols;
    const std::int64_t b = row / s.time, t = row % s.time, p = s.position(b, t);
    const auto head_row = [&](const T* base, std::int64_t h) {
      return base + ((b * s.heads + h) * s.time + t) * s.head_dim;
    };
    if (col < q_cols) {
      dq_rows[row * q_cols + col] = dtype_cast<T>(unrotate(head_row(dq, col / s.head_dim), p, col % s.head_dim));
      return;
    }
    const bool is_k = col < q_cols + kv_cols;
    const std::int64_t c = col - q_cols - (is_k ? 0 : kv_cols), kvh = c / s.head_dim, d = c % s.head_dim;
    const T* base = dq + (is_k ? 1 : 2) * s.head_elems();
    float sum = 0.f;
    for (std::int64_t h = kvh * s.group(); h < (kvh + 1) * s.group(); ++h)
      sum += is_k ? unrotate(head_row(base, h), p, d) : static_cast<float>(head_row(base, h)[d]);
    (is_k ? dk_rows : dv_rows)[row * kv_cols + c] = dtype_cast<T>(sum);
  }
  // The host's loops (backend/host/device_isa.hpp): each output row in pieces of
  // one head, the unrotation as two contiguous loops over the halves, a key
  // or value head's group summed head by head into 64 accumulators (each
  // element's sum in the order operator() adds it).
  void span(std::size_t begin, std::size_t end) const {
    const std::int64_t hd = s.head_dim, half = hd / 2, q_cols = s.heads * hd, kv_cols = s.kv_heads * hd;
    dtrain::detail::row_pieces(
        begin, end, q_cols + 2 * kv_cols, [&](std::int64_t row, std::int64_t j0, std::int64_t j1) {
          const std::int64_t b = row / s.time, t = row % s.time;
          const float* c = cos_t + s.position(b, t) * half;
          const float* sn = sin_t + s.position(b, t) * half;
          const auto head_row = [&](const T* base, std::int64_t h) {
            return base + ((b * s.heads + h) * s.time + t) * hd;
          };
          // acc[d - d0] (+)= the unrotated (or, for v, plain) gradient of `in` at d, for d in [d0, d1).
          const auto gather = [&](const T* in, bool rotated, std::int64_t d0, std::int64_t d1, float* acc,
                                  bool add) DTRAIN_LAMBDA_INLINE {
            if (!(rotated && s.rope)) {
              for (std::int64_t d = d0; d < d1; ++d) {
                const float v = static_cast<float>(in[d]);
                acc[d - d0] = add ? acc[d - d0] + v : v;
              }
              return;
            }
            for (std::int64_t d = d0; d < (d1 < half ? d1 : half); ++d) {
              const float v = unrotate_pair(static_cast<float>(in[d]), static_cast<float>(in[d + half]), c[d], sn[d]).a;
              acc[d - d0] = add ? acc[d - d0] + v : v;
            }
            for (std::int64_t d = (d0 > half ? d0 : half); d < d1; ++d) {
              const std::int64_t f = d - half;
              const float v = unrotate_pair(static_cast<float>(in[f]), static_cast<float>(in[d]), c[f], sn[f]).b;
              acc[d - d0] = add ? acc[d - d0] + v : v;
            }
          };
          for (std::int64_t col = j0; col < j1;) {
            const bool is_q = col < q_cols, is_k = !is_q && col < q_cols + kv_cols;
            const std::int64_t start = is_q ? 0 : is_k ? q_cols : q_cols + kv_cols;
            const std::int64_t head = (col - start) / hd, first = (col - start) % hd;
            const std::int64_t last = first + (j1 - col) < hd ? first + (j1 - col) : hd;
            T* out = is_q ? dq_rows + row * q_cols + head * hd : (is_k ? dk_rows : dv_rows) + row * kv_cols + head * hd;
            constexpr std::int64_t chunk = 64;  // this host form's own stack scratch, not a backend's knob
            float acc[chunk];
            for (std::int64_t d0 = first; d0 < last; d0 += chunk) {
              const std::int64_t d1 = d0 + chunk < last ? d0 + chunk : last;
              if (is_q) {
                gather(head_row(dq, head), true, d0, d1, acc, false);
              } else {
                const T* base = dq + (is_k ? 1 : 2) * s.head_elems();
                for (std::int64_t d = d0; d < d1; ++d) acc[d - d0] = 0.f;
                for (std::int64_t h = head * s.group(); h < (head + 1) * s.group(); ++h)
                  gather(head_row(base, h), is_k, d0, d1, acc, true);
              }
              for (std::int64_t d = d0; d < d1; ++d) out[d] = dtype_cast<T>(acc[d - d0]);
            }
            col += last - first;
          }
        });
  }
};

// Key/value rows [B * time, kv_heads hd] -> the head layout [B, heads, time,
// hd], each key/value head repeated for its group (as transformers'
// repeat_kv), without rotation (cross-attention's memory). Run over
// 2 * batch * heads * time * head_dim elements (k, then v).
template <class T>
struct RepeatKvHeads {
  std::int64_t batch, time, heads, kv_heads, head_dim;
  const T* k_rows;
  const T* v_rows;
  T* k;  // followed by v, batch * heads * time * head_dim apart
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i), per = batch * heads * time * head_dim;
    const std::int64_t part = n / per, e = n % per;
    const std::int64_t d = e % head_dim, t = (e / head_dim) % time, bh = e / (head_dim * time);
    const std::int64_t b = bh / heads, h = bh % heads;
    const T* row = (part == 0 ? k_rows : v_rows) + (b * time + t) * kv_heads * head_dim;
    k[n] = row[h / (heads / kv_heads) * head_dim + d];
  }
};

// Its transpose: the repeated heads' gradients -> key/value rows, each
// key/value head's group summed in head order (no atomics). Run over
// 2 * batch * time * kv_heads * head_dim elements (dk, then dv).
template <class T>
struct SumKvGroups {
  std::int64_t batch, time, heads, kv_heads, head_dim;
  const T* dk;  // followed by dv, in the head layout
  T* dk_rows;
  T* dv_rows;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::int64_t cols = kv_heads * head_dim, per = batch * time * cols;
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t part = n / per, e = n % per, row = e / cols, col = e % cols;
    const std::int64_t b = row / time, t = row % time, group = heads / kv_heads, d = col % head_dim;
    const T* base = dk + part * batch * heads * time * head_dim;
    float sum = 0.f;
    for (std::int64_t h = col / head_dim * group; h < (col / head_dim + 1) * group; ++h)
      sum += static_cast<float>(base[((b * heads + h) * time + t) * head_dim + d]);
    (part == 0 ? dk_rows : dv_rows)[e] = dtype_cast<T>(sum);
  }
};

// The shape of a bidirectional or cross attention: queries [B, heads, q_time,
// hd], keys and values [B, heads, k_time, hd] (repeated to `heads`).
struct CrossLayout {
  std::int64_t batch, q_time, k_time, heads, head_dim;
  HeadLayout queries() const { return {batch, q_time, heads, head_dim, 1}; }
};

// Attention scores [B heads, q_time, k_time] to probabilities, in place, over
// the keys `mask` ([B, k_time], int32 or int64, or null) and `positions`
// (packed records, self-attention, or null) keep.
template <class Dev, class T>
void masked_softmax(Dev& dev, CrossLayout l, T* att, const DeviceTensor* mask, const std::int64_t* positions) {
  const auto rows = static_cast<std::size_t>(l.batch * l.heads * l.q_time);
  if (mask != nullptr && mask->type == element_type::i32)
    return dev.for_each(
        rows, MaskedSoftmax<T, std::int32_t>{att, l.q_time, l.k_time, mask->data<std::int32_t>(), l.heads, positions});
  dev.for_each(
      rows, MaskedSoftmax<T, std::int64_t>{att, l.q_time, l.k_time,
                                           mask != nullptr ? mask->data<std::int64_t>() : nullptr, l.heads, positions});
}

// heads_attention without the causal limit: every query against every key
// the masks keep, one strided batched GEMM per product over all (batch,
// head) pairs; o (scratch) then merged into rows [B q_time, heads hd].
template <class Dev, class T>
void full_attention(Dev& dev, CrossLayout l, const T* q, const T* k, const T* v, T* att, T* o, T* merged,
                    const DeviceTensor* mask, const std::int64_t* positions, float scores = 0.f) {
  const std::int64_t hd = l.head_dim, qt = l.q_time * hd, kt = l.k_time * hd, a = l.q_time * l.k_time;
  const std::int64_t bh = l.batch * l.heads;
  const float scale = scores_scale(scores, hd);
  dev.gemm_batched(false, true, l.q_time, l.k_time, hd, scale, q, hd, qt, k, hd, kt, 0.f, att, l.k_time, a, bh);
  masked_softmax(dev, l, att, mask, positions);
  dev.gemm_batched(false, false, l.q_time, hd, l.k_time, 1.f, att, l.k_time, a, v, hd, kt, 0.f, o, hd, qt, bh);
  permute_heads(dev, l.queries(), o, merged, false);
}

// Its backward, as heads_attention_backward's: d_o, d_att (in place from the
// probabilities' gradient to the scores'), d_q, d_k, d_v in the head layout.
template <class Dev, class T>
void full_attention_backward(Dev& dev, CrossLayout l, const T* q, const T* k, const T* v, const T* att,
                             const T* d_merged, T* d_o, T* d_att, T* d_q, T* d_k, T* d_v, float scores = 0.f) {
  const std::int64_t hd = l.head_dim, qt = l.q_time * hd, kt = l.k_time * hd, a = l.q_time * l.k_time;
  const std::int64_t bh = l.batch * l.heads, tq = l.q_time, tk = l.k_time;
  const float scale = scores_scale(scores, hd);
  permute_heads(dev, l.queries(), d_merged, d_o, true);
  dev.gemm_batched(false, true, tq, tk, hd, 1.f, d_o, hd, qt, v, hd, kt, 0.f, d_att, tk, a, bh);
  dev.gemm_batched(true, false, tk, hd, tq, 1.f, att, tk, a, d_o, hd, qt, 0.f, d_v, hd, kt, bh);
  dev.for_each(static_cast<std::size_t>(bh * tq), SoftmaxRowsBackward<T>{att, d_att, tk, scale});
  dev.gemm_batched(false, false, tq, hd, tk, 1.f, d_att, tk, a, k, hd, kt, 0.f, d_q, hd, qt, bh);
  dev.gemm_batched(true, false, tk, hd, tq, 1.f, d_att, tk, a, q, hd, qt, 0.f, d_k, hd, kt, bh);
}

}  // namespace detail

// The options of the SeparateQkv attentions (nn::RotaryAttention and the
// family's other SeparateQkv members: nn/attention_policies.hpp).
struct GroupedAttentionOptions {
  std::int64_t kv_heads = 0;   // 0: as many as query heads (multi-head attention); 1: multi-query
  float rope_theta = 10000.f;  // Rotary: 0 for no rotation; NoPositions: unused
  bool qkv_bias = false;       // Qwen2-style biases on q, k and v
  bool out_bias = false;
  float init_std = 0.02f;          // weights ~ N(0, init_std); biases 0
  std::int64_t max_positions = 0;  // > 0: longer sequences are an error (max_position_embeddings)
  bool trainable = true;
  // false: the batch's "attention_mask" and "position_ids" are not read
  // (they describe another sequence: a vision tower's layers in LLaVA, whose
  // batch holds the text's)
  bool batch_masks = true;
  // LoRA adapters on the q, k, v and o projections (PEFT's q_proj, k_proj,
  // v_proj, o_proj; diffusers' to_q, to_k, to_v, to_out.0): nn/lora.hpp. In
  // a cross-attention k's and v's adapters read the memory.
  LoraOptions q_lora{};
  LoraOptions k_lora{};
  LoraOptions v_lora{};
  LoraOptions o_lora{};
  // QK-norm (Qwen3, Gemma 3): an RMSNorm over head_dim on every query and key
  // head, before the rotation, with weights q_norm.weight and k_norm.weight
  // [head_dim] (Qwen3's y = x / rms(x) * w; Gemma's (1 + w) is w + 1 here)
  bool qk_norm = false;
  float qk_norm_eps = 1e-6f;
  float qk_norm_offset = 0.f;   // the norms' scale is weight + offset (Gemma 3: 1; nn::RMSNorm's offset)
  std::int64_t memory_dim = 0;  // CrossInput: the memory's width (0: dim)
  // > 0: each head this wide, whatever dim / heads (Gemma's head_dim): q
  // and the merged heads are heads x head_dim wide; 0: dim / heads.
  std::int64_t head_dim = 0;
  // Causal: > 0 leaves out every key `window` or more positions before its
  // query (sliding-window attention, Gemma 3's and Mistral's local layers).
  std::int64_t window = 0;
  float scale = 0.f;        // the scores' scale; 0: 1 / sqrt(head_dim) (Gemma 3: query_pre_attn_scalar^-0.5)
  float rope_factor = 1.f;  // Rotary: linear position scaling (transformers' rope_type "linear", its factor)
};
using RotaryAttentionOptions = GroupedAttentionOptions;

namespace detail {

// What every SeparateQkv attention holds, whatever its policies: its sizes,
// options, adapters and parameters (compiled once: rotary_attention.ipp).
class GroupedAttentionBase {
 public:
  std::int64_t dim() const { return dim_; }
  std::int64_t heads() const { return heads_; }
  std::int64_t kv_heads() const { return kv_heads_; }
  std::int64_t head_dim() const { return head_dim_; }
  std::int64_t memory_dim() const { return memory_dim_; }

  DTRAIN_DECL std::vector<ParamSpec> params() const;

 protected:
  DTRAIN_DECL GroupedAttentionBase(const char* name, std::int64_t dim, std::int64_t heads,
                                   GroupedAttentionOptions options, bool rotary, bool cross, bool causal_mask);

  // q, k, v, o weights; q/k/v biases; o bias; q_norm, k_norm weights
  std::size_t base_count() const {
    return 4 + (options_.qkv_bias ? 3 : 0) + (options_.out_bias ? 1 : 0) + (options_.qk_norm ? 2 : 0);
  }

  // The bias of projection `which` (q, k, v, o), or an empty view.
  template <class T>
  MatView<T> bias(UnitParams<T> p, int which) const {
    if (which < 3) return options_.qkv_bias ? p[static_cast<std::size_t>(4 + which)] : MatView<T>{};
    return options_.out_bias ? p[options_.qkv_bias ? 7u : 4u] : MatView<T>{};
  }

  // The QK-norm weight of q (which 0) or k (1).
  template <class T>
  MatView<T> norm_weight(UnitParams<T> p, int which) const {
    return p[4 + (options_.qkv_bias ? 3u : 0u) + (options_.out_bias ? 1u : 0u) + static_cast<std::size_t>(which)];
  }

  const char* name_;
  std::int64_t dim_;
  std::int64_t heads_;
  std::int64_t head_dim_;
  std::int64_t inner_;  // the queries' and merged heads' width, heads x head_dim
  std::int64_t kv_heads_;
  std::int64_t memory_dim_;
  GroupedAttentionOptions options_;
  bool rope_;  // a rotation to apply: Rotary with rope_theta > 0
  LoraSet lora_;
};

// The calls of a cross-attention unit (what AttentionPaths is to self-attention):
// queries from x [B * T, dim], keys and values from the memory
// [B * T_mem, memory_dim] (T_mem = memory.rows / B), whose padding is the
// batch's "encoder_attention_mask" [B, T_mem]; backward gives the
// parameters', the input's (dx) and the memory's (d_memory) gradients, each
// of dx, d_memory skipped when empty. Its saved view holds
// saved_size(query shape, T_mem) elements.
template <class Unit>
class CrossAttentionPaths {
 public:
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<const T> memory, MatView<T> y,
               const UnitContext<T>& ctx) {
    static_cast<Unit&>(*this).attend(dev, p, x, memory, y, ctx);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> memory,
                MatView<const T> dy, MatView<T> dx, MatView<T> d_memory, const UnitContext<T>& ctx) {
    static_cast<Unit&>(*this).attend_backward(dev, p, grad, x, memory, dy, dx, d_memory, ctx);
  }
};

}  // namespace detail

// The family's SeparateQkv members (nn/attention_policies.hpp): Llama-family
// projections with any mask and positions, self- or cross-attention.
template <class Mask, class Positions, class Input>
class AttentionUnit<Mask, Positions, SeparateQkv, Input>
    : public detail::GroupedAttentionBase,
      public std::conditional_t<std::is_same_v<Input, SelfInput>,
                                detail::AttentionPaths<AttentionUnit<Mask, Positions, SeparateQkv, Input>>,
                                detail::CrossAttentionPaths<AttentionUnit<Mask, Positions, SeparateQkv, Input>>> {
  static constexpr bool causal = std::is_same_v<Mask, Causal>;
  static constexpr bool rotary = std::is_same_v<Positions, Rotary>;
  static constexpr bool cross = std::is_same_v<Input, CrossInput>;
  static_assert(!cross || !causal, "nn::Attention: CrossInput needs the Bidirectional mask");
  static_assert(!cross || !rotary, "nn::Attention: CrossInput takes no Rotary positions");

 public:
  AttentionUnit(std::int64_t dim, std::int64_t heads, GroupedAttentionOptions options = {})
      : GroupedAttentionBase(causal && rotary ? "nn::RotaryAttention" : "nn::Attention", dim, heads, options, rotary,
                             cross, causal) {}

  std::int64_t out_features(std::int64_t in) const { return detail::check_width(name_, in, dim_); }

  // Self-attention: saved_size(shape, in) (the adapters' rows after the
  // attention's own activations; saved_size_on, forward and backward:
  // detail::AttentionPaths). CrossInput: saved_size(query shape, memory
  // length); forward and backward: detail::CrossAttentionPaths.
  std::int64_t saved_size(SeqShape s, std::int64_t memory_time) const {
    if constexpr (cross) return own_saved(s, memory_time) + lora_.saved_size(LoraRows{s.rows(), s.batch * memory_time});
    return own_saved(s, s.time) + lora_.saved_size(s.rows());
  }

 private:
  friend class detail::AttentionPaths<AttentionUnit>;
  friend class detail::CrossAttentionPaths<AttentionUnit>;

  // cuDNN's fused attention is causal self-attention with the default scale;
  // QK-norm and the sliding window are not on it yet.
  bool fusable() const { return causal && !options_.qk_norm && options_.window == 0 && options_.scale == 0.f; }

  // Generation with a key-value cache (nn/kv_cache.hpp): the new rows'
  // projections (QK-norm, rotated at their positions), their keys and values
  // into the cache, each query against its sequence's cached keys (within
  // the sliding window), then the output projection.
  template <class Dev, class T>
  void cached_forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    if constexpr (!causal || cross) {
      throw config_error(std::string(name_) + ": a key-value cache needs causal self-attention",
                         "generate with a causal language model");
    } else {
      detail::check_count(name_, "parameters", p.size(), base_count() + lora_.param_count());
      detail::check_shape(name_, "output", y, x.rows, dim_);
      const std::int64_t N = x.rows, hd = head_dim(), kv = kv_heads_ * hd, cap = ctx.kv->capacity;
      const detail::CacheShape cs{ctx.shape.batch, ctx.shape.time, heads_, kv_heads_, hd, cap};
      const DeviceTensor& pos = detail::cached_positions(name_, ctx, cs);
      const detail::GqaShape table{1, cap, heads_, kv_heads_, hd, rope_, nullptr};  // angles of every cached position
      const std::int64_t pre = options_.qk_norm ? N * (inner_ + kv) : 0;
      // workspace: q k v rows [N, heads hd | N, kv | N, kv] | merged [N, heads hd] | QK-norm's projections |
      // the adapters' rows | rope cos, sin
      const std::int64_t lora_n = lora_.saved_size(N);
      T* q = dev.template workspace<T>(static_cast<std::size_t>(2 * N * inner_ + 2 * N * kv + pre + lora_n) +
                                       rope_elems<T>(table));
      T* k = q + N * inner_;
      T* v = k + N * kv;
      T* merged = v + N * kv;
      T* q_pre = merged + N * inner_;
      T* k_pre = q_pre + N * inner_;
      T* lora = q_pre + pre;
      const Rope rope = rope_table(dev, table, reinterpret_cast<float*>(lora + lora_n));
      T* q_proj = options_.qk_norm ? q_pre : q;
      T* k_proj = options_.qk_norm ? k_pre : k;
      detail::project(dev, x, p[0].data, bias(p, 0).data, q_proj, inner_);
      detail::project(dev, x, p[1].data, bias(p, 1).data, k_proj, kv);
      detail::project(dev, x, p[2].data, bias(p, 2).data, v, kv);
      for (std::size_t i = 0; i < 3; ++i)
        lora_.forward(dev, i, p, x, i == 0 ? q_proj : i == 1 ? k_proj : v, lora, lora_draw(ctx));
      if (options_.qk_norm) {
        head_norm(dev, q_pre, q, N * heads_, norm_weight(p, 0).data);
        head_norm(dev, k_pre, k, N * kv_heads_, norm_weight(p, 1).data);
      }
      if (rope_) {
        const std::int64_t half = hd / 2;
        const auto* at = pos.data<std::int64_t>();
        dev.for_each(static_cast<std::size_t>(N * heads_ * half),
                     detail::RotatePairs<T>{q, heads_, hd, cap, rope.cos_t, rope.sin_t, false, at});
        dev.for_each(static_cast<std::size_t>(N * kv_heads_ * half),
                     detail::RotatePairs<T>{k, kv_heads_, hd, cap, rope.cos_t, rope.sin_t, false, at});
      }
      detail::cached_attention(dev, name_, ctx, cs, q, inner_, k, v, kv, pos.data<std::int64_t>(),
                               detail::scores_scale(options_.scale, hd), options_.window, merged);
      detail::output_projection(dev, lora_, 3, p, MatView<const T>{merged, N, inner_}, p[3].data, bias(p, 3).data, y,
                                lora, lora_draw(ctx));
    }
  }

  template <class Dev, class T>
  void own_forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    attend(dev, p, x, x, y, ctx);
  }

  template <class Dev, class T>
  void own_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> dy,
                    MatView<T> dx, const UnitContext<T>& ctx) {
    attend_backward(dev, p, grad, x, x, dy, dx, dx, ctx);
  }

  // The own path: queries from x, keys and values from m (x itself in
  // self-attention).
  template <class Dev, class T>
  void attend(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<const T> m, MatView<T> y,
              const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, m, ctx);
    detail::check_shape(name_, "output", y, x.rows, dim_);
    check_device<Dev>();
    const std::int64_t Nq = x.rows, Nk = m.rows, kv = kv_heads_ * head_dim();
    // workspace: q k v rows [Nq, heads hd | Nk, kv | Nk, kv] | o [heads layout] | rope cos, sin
    T* q_rows = dev.template workspace<T>(static_cast<std::size_t>(2 * Nq * inner_ + 2 * Nk * kv) + rope_elems<T>(s.g));
    T* k_rows = q_rows + Nq * inner_;
    T* v_rows = k_rows + Nk * kv;
    T* o = v_rows + Nk * kv;
    const Rope rope = rope_table(dev, s.g, reinterpret_cast<float*>(o + Nq * inner_));
    // with QK-norm the projections of q and k are kept (q_pre, k_pre) and
    // their norms go to q_rows, k_rows
    T* q_proj = options_.qk_norm ? s.q_pre : q_rows;
    T* k_proj = options_.qk_norm ? s.k_pre : k_rows;
    detail::project(dev, x, p[0].data, bias(p, 0).data, q_proj, inner_);
    detail::project(dev, m, p[1].data, bias(p, 1).data, k_proj, kv);
    detail::project(dev, m, p[2].data, bias(p, 2).data, v_rows, kv);
    T* lora = ctx.saved.data + own_saved(ctx.shape, s.k_time);
    const LoraRows lora_rows{Nq, Nk};
    for (std::size_t i = 0; i < 3; ++i)
      lora_.forward(dev, i, p, i == 0 ? x : m,
                    i == 0   ? q_proj
                    : i == 1 ? k_proj
                             : v_rows,
                    lora, lora_draw(ctx), lora_rows);
    if (options_.qk_norm) {
      head_norm(dev, s.q_pre, q_rows, Nq * heads_, norm_weight(p, 0).data);
      head_norm(dev, s.k_pre, k_rows, Nk * kv_heads_, norm_weight(p, 1).data);
    }
    if constexpr (cross) {
      detail::permute_heads(dev, s.layout().queries(), q_rows, s.q, true);
      dev.for_each(static_cast<std::size_t>(2 * Nk * inner_),
                   detail::RepeatKvHeads<T>{s.g.batch, s.k_time, heads_, kv_heads_, head_dim(), k_rows, v_rows, s.k});
    } else {
      dev.for_each(static_cast<std::size_t>(3 * s.g.head_elems()),
                   detail::ToRotatedHeads<T>{s.g, q_rows, k_rows, v_rows, rope.cos_t, rope.sin_t, s.q});
    }
    if constexpr (causal)
      detail::heads_attention(dev, name_, s.heads_layout(), s.q, s.k, s.v, s.att, o, s.merged, ctx, options_.scale,
                              options_.window);
    else
      detail::full_attention(dev, s.layout(), s.q, s.k, s.v, s.att, o, s.merged, key_mask(ctx, s.k_time), s.g.positions,
                             options_.scale);
    detail::output_projection(dev, lora_, 3, p, MatView<const T>{s.merged, Nq, inner_}, p[3].data, bias(p, 3).data, y,
                              lora, lora_draw(ctx), lora_rows);
  }

  template <class Dev, class T>
  void attend_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> m,
                       MatView<const T> dy, MatView<T> dx, MatView<T> dm, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, m, ctx);
    detail::check_count(name_, "gradients", grad.size(), p.size());
    detail::check_shape(name_, "output gradient", dy, x.rows, dim_);
    check_device<Dev>();
    const std::int64_t Nq = x.rows, Nk = m.rows, C = inner_, kv = kv_heads_ * head_dim();
    const std::int64_t bh = s.g.batch * heads_, a = s.g.time * s.k_time;
    const std::int64_t qk = options_.qk_norm ? Nq * C + Nk * kv + float_elems<T>(Nq * heads_ + Nk * kv_heads_) : 0;
    // workspace (C: heads hd): d_merged [Nq, C] | d_o | d_att | d_q d_k d_v (heads layout) | dq dk dv rows |
    // (QK-norm) dq dk before the norm, their rstd | rope
    const std::size_t n_ws =
        static_cast<std::size_t>(3 * Nq * C + 2 * Nk * C + bh * a + Nq * C + 2 * Nk * kv + qk) + rope_elems<T>(s.g);
    T* d_merged = dev.template workspace<T>(n_ws);
    T* d_o = d_merged + Nq * C;
    T* d_att = d_o + Nq * C;
    T* d_q = d_att + bh * a;
    T* d_k = d_q + Nq * C;
    T* d_v = d_k + Nk * C;
    T* dq_rows = d_v + Nk * C;
    T* dk_rows = dq_rows + Nq * C;
    T* dv_rows = dk_rows + Nk * kv;
    T* qk_ws = dv_rows + Nk * kv;
    const Rope rope = rope_table(dev, s.g, reinterpret_cast<float*>(qk_ws + qk));

    T* lora = ctx.saved.data + own_saved(ctx.shape, s.k_time);
    const LoraRows lora_rows{Nq, Nk};
    detail::output_projection_backward(dev, lora_, 3, p, grad, MatView<const T>{s.merged, Nq, C}, dy, p[3].data,
                                       grad[3], bias(grad, 3), d_merged, lora, lora_draw(ctx), lora_rows);
    if constexpr (causal)
      detail::heads_attention_backward(dev, s.heads_layout(), s.q, s.k, s.v, s.att, d_merged, d_o, d_att, d_q, d_k, d_v,
                                       options_.scale);
    else
      detail::full_attention_backward(dev, s.layout(), s.q, s.k, s.v, s.att, d_merged, d_o, d_att, d_q, d_k, d_v,
                                      options_.scale);
    if constexpr (cross) {
      detail::permute_heads(dev, s.layout().queries(), d_q, dq_rows, false);
      dev.for_each(static_cast<std::size_t>(2 * Nk * kv),
                   detail::SumKvGroups<T>{s.g.batch, s.k_time, heads_, kv_heads_, head_dim(), d_k, dk_rows, dv_rows});
    } else {
      dev.for_each(static_cast<std::size_t>(Nq * (C + 2 * kv)),
                   detail::FromRotatedHeads<T>{s.g, d_q, rope.cos_t, rope.sin_t, dq_rows, dk_rows, dv_rows});
    }
    if (options_.qk_norm) {  // the gradients before the norms, and the norms' weights'
      T* dq_pre = qk_ws;
      T* dk_pre = dq_pre + Nq * C;
      float* rstd = float_at(dk_pre + Nk * kv);
      head_norm_backward(dev, s.q_pre, dq_rows, dq_pre, Nq * heads_, norm_weight(p, 0).data, norm_weight(grad, 0),
                         rstd);
      head_norm_backward(dev, s.k_pre, dk_rows, dk_pre, Nk * kv_heads_, norm_weight(p, 1).data, norm_weight(grad, 1),
                         rstd + Nq * heads_);
      dq_rows = dq_pre;
      dk_rows = dk_pre;
    }
    projections_backward(dev, p, grad, x, m, dq_rows, dk_rows, dv_rows, lora, dx, dm, lora_draw(ctx), lora_rows);
  }

  // Outside the host, the forms no GPU run has checked yet need DTRAIN_GPU_ATTENTION=on.
  template <class Dev>
  void check_device() const {
    if constexpr (!Dev::host_accessible)
      if (!causal || cross || options_.qk_norm || options_.window > 0 || options_.scale != 0.f)
        detail::require_gpu_switch(std::string(name_) + " (bidirectional, cross, QK-norm, sliding window or scale)",
                                   "DTRAIN_GPU_ATTENTION");
  }

  // RMSNorm over every head_dim-wide head of `rows` head rows: in -> out.
  template <class Dev, class T>
  void head_norm(Dev& dev, const T* in, T* out, std::int64_t rows, const T* w) const {
    const std::int64_t hd = head_dim();
    dev.for_each(static_cast<std::size_t>(rows),
                 detail::RmsNormForward<T>{MatView<const T>{in, rows, hd}, w, MatView<T>{out, rows, hd},
                                           options_.qk_norm_eps, options_.qk_norm_offset});
  }

  // Its backward: d_in from d_out, and the weight's gradient dw (skipped when
  // empty); rstd: `rows` floats of scratch.
  template <class Dev, class T>
  void head_norm_backward(Dev& dev, const T* in, const T* d_out, T* d_in, std::int64_t rows, const T* w, MatView<T> dw,
                          float* rstd) const {
    const std::int64_t hd = head_dim();
    const MatView<const T> xv{in, rows, hd}, dyv{d_out, rows, hd};
    dev.for_each(static_cast<std::size_t>(rows),
                 detail::RmsNormBackwardInput<T>{xv, w, dyv, MatView<T>{d_in, rows, hd}, rstd, options_.qk_norm_eps,
                                                 options_.qk_norm_offset});
    if (!dw.empty())
      dev.for_each(column_groups(hd, column_group<Dev>()),
                   detail::RmsNormBackwardWeight<T>{xv, dyv, rstd, dw.data, column_group<Dev>()});
  }

  // Elements of T that hold n floats from any address (float_at aligns).
  template <class T>
  static std::int64_t float_elems(std::int64_t n) {
    return static_cast<std::int64_t>((static_cast<std::size_t>(n) * sizeof(float) + sizeof(T) - 1) / sizeof(T)) + 1;
  }
  template <class T>
  static float* float_at(T* at) {
    auto addr = reinterpret_cast<std::uintptr_t>(at);
    addr = (addr + alignof(float) - 1) / alignof(float) * alignof(float);
    return reinterpret_cast<float*>(addr);
  }

  // The own path's saved elements for queries of shape s and keys of k_time:
  // q, k and v in the head layout (k, v repeated to `heads`), the
  // probabilities, the merged heads, and with QK-norm q's and k's projections.
  std::int64_t own_saved(SeqShape s, std::int64_t k_time) const {
    const std::int64_t Nq = s.rows(), Nk = s.batch * k_time, kv = kv_heads_ * head_dim();
    return 2 * Nq * inner_ + 2 * Nk * inner_ + s.batch * heads_ * s.time * k_time +
           (options_.qk_norm ? Nq * inner_ + Nk * kv : 0);
  }
  template <class T>
  std::int64_t fused_saved(SeqShape s) const {
    const std::int64_t kv = kv_heads_ * head_dim();
    return detail::float_aligned<T>(s.rows() * (2 * inner_ + 2 * kv)) +
           attention_stats_size<T>(s.batch, heads_, s.time);
  }

  struct Rope {
    const float* cos_t;
    const float* sin_t;
  };

  // From the gradients of the q, k, v projections' outputs (rows): their
  // parameters' gradients, the input's (dx, from q) and the memory's (dm,
  // from k and v; self-attention: dm is dx).
  template <class Dev, class T>
  void projections_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> m,
                            const T* dq_rows, const T* dk_rows, const T* dv_rows, T* lora, MatView<T> dx, MatView<T> dm,
                            LoraDraw draw, LoraRows rows = {}) const {
    const std::int64_t Nq = x.rows, Nk = m.rows, C = dim_, I = inner_, M = memory_dim_, kv = kv_heads_ * head_dim();
    detail::projection_grads(dev, x, MatView<const T>{dq_rows, Nq, I}, grad[0], bias(grad, 0));
    detail::projection_grads(dev, m, MatView<const T>{dk_rows, Nk, kv}, grad[1], bias(grad, 1));
    detail::projection_grads(dev, m, MatView<const T>{dv_rows, Nk, kv}, grad[2], bias(grad, 2));
    if (!dx.empty()) {
      detail::check_shape(name_, "input gradient", dx, Nq, C);
      dev.gemm(false, false, Nq, C, I, 1.f, dq_rows, I, p[0].data, C, 0.f, dx.data, C);
    }
    if (!dm.empty()) {
      detail::check_shape(name_, cross ? "memory gradient" : "input gradient", dm, Nk, M);
      dev.gemm(false, false, Nk, M, kv, 1.f, dk_rows, kv, p[1].data, M, cross ? 0.f : 1.f, dm.data, M);
      dev.gemm(false, false, Nk, M, kv, 1.f, dv_rows, kv, p[2].data, M, 1.f, dm.data, M);
    }
    lora_.backward(dev, 0, p, grad, x, dq_rows, lora, dx, draw, rows);
    lora_.backward(dev, 1, p, grad, m, dk_rows, lora, dm, draw, rows);
    lora_.backward(dev, 2, p, grad, m, dv_rows, lora, dm, draw, rows);
  }

  // The fused path (device/fused_attention.hpp): q [N, dim] and k, v
  // [N, kv_heads hd] in the projections' rows, rotated in place; the
  // attention writes the merged heads [N, dim]. Kept: q, k, v, merged, and
  // the statistics (16-byte aligned after them).
  FusedAttentionShape fused_shape(SeqShape s) const {
    const std::int64_t hd = head_dim(), kv = kv_heads_ * hd;
    const AttentionStrides q{s.time * inner_, hd, inner_}, k{s.time * kv, hd, kv};
    return {s.batch, heads_, kv_heads_, s.time, hd, q, k, k, q, false};
  }

  template <class T>
  struct Fused {
    T* q;
    T* k;
    T* v;
    T* merged;
    float* stats;
    detail::GqaShape g;
    T* lora;  // the adapters' saved rows
  };

  template <class Dev, class T>
  Fused<T> fused_parts(Dev& dev, UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    check_call(p, x, x, ctx, this->template saved_size_on<Dev, T>(dev, ctx.shape, dim_));
    const std::int64_t N = x.rows, kv = kv_heads_ * head_dim();
    T* q = ctx.saved.data;
    T* k = q + N * inner_;
    T* v = k + N * kv;
    T* merged = v + N * kv;
    return {q,
            k,
            v,
            merged,
            reinterpret_cast<float*>(q + detail::float_aligned<T>(N * (2 * inner_ + 2 * kv))),
            call_shape(ctx),
            q + fused_saved<T>(ctx.shape)};
  }

  // Rotates (or unrotates) q's and k's rows in place.
  template <class Dev, class T>
  void rotate_rows(Dev& dev, const detail::GqaShape& g, const Rope& rope, T* q, T* k, bool inverse) const {
    if (!g.rope) return;
    const std::int64_t half = g.head_dim / 2;
    dev.for_each(static_cast<std::size_t>(g.rows() * g.heads * half),
                 detail::RotatePairs<T>{q, g.heads, g.head_dim, g.time, rope.cos_t, rope.sin_t, inverse, g.positions});
    dev.for_each(
        static_cast<std::size_t>(g.rows() * g.kv_heads * half),
        detail::RotatePairs<T>{k, g.kv_heads, g.head_dim, g.time, rope.cos_t, rope.sin_t, inverse, g.positions});
  }

  template <class Dev, class T>
  void fused_forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const Fused<T> s = fused_parts(dev, p, x, ctx);
    detail::check_shape(name_, "output", y, x.rows, dim_);
    const std::int64_t N = x.rows, kv = kv_heads_ * head_dim(), bt = detail::key_bias_size(name_, ctx);
    // workspace: key bias [B, 1, T, T] (with padding) | rope cos, sin
    T* bias_ws = dev.template workspace<T>(static_cast<std::size_t>(bt) + rope_elems<T>(s.g));
    const Rope rope = rope_table(dev, s.g, reinterpret_cast<float*>(bias_ws + bt));
    const T* kb = detail::key_bias(dev, name_, ctx, bias_ws);
    detail::project(dev, x, p[0].data, bias(p, 0).data, s.q, inner_);
    detail::project(dev, x, p[1].data, bias(p, 1).data, s.k, kv);
    detail::project(dev, x, p[2].data, bias(p, 2).data, s.v, kv);
    for (std::size_t i = 0; i < 3; ++i)
      lora_.forward(dev, i, p, x, i == 0 ? s.q : i == 1 ? s.k : s.v, s.lora, lora_draw(ctx));
    rotate_rows(dev, s.g, rope, s.q, s.k, false);
    detail::fused_heads(dev, fused_shape(ctx.shape), kb, s.q, s.k, s.v, s.merged, s.stats);
    detail::output_projection(dev, lora_, 3, p, MatView<const T>{s.merged, N, inner_}, p[3].data, bias(p, 3).data, y,
                              s.lora, lora_draw(ctx));
  }

  template <class Dev, class T>
  void fused_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> dy,
                      MatView<T> dx, const UnitContext<T>& ctx) {
    const Fused<T> s = fused_parts(dev, p, x, ctx);
    detail::check_count(name_, "gradients", grad.size(), p.size());
    detail::check_shape(name_, "output gradient", dy, x.rows, dim_);
    const std::int64_t N = x.rows, C = inner_, kv = kv_heads_ * head_dim();
    const std::int64_t bt = detail::key_bias_size(name_, ctx);
    // workspace: key bias [B, 1, T, T] (with padding) | d_merged [N, C] | dq [N, C] | dk, dv [N, kv] | rope
    T* bias_ws = dev.template workspace<T>(static_cast<std::size_t>(bt + N * (2 * C + 2 * kv)) + rope_elems<T>(s.g));
    T* d_merged = bias_ws + bt;
    T* dq = d_merged + N * C;
    T* dk = dq + N * C;
    T* dv = dk + N * kv;
    const Rope rope = rope_table(dev, s.g, reinterpret_cast<float*>(dv + N * kv));
    const T* kb = detail::key_bias(dev, name_, ctx, bias_ws);
    detail::output_projection_backward(dev, lora_, 3, p, grad, MatView<const T>{s.merged, N, C}, dy, p[3].data, grad[3],
                                       bias(grad, 3), d_merged, s.lora, lora_draw(ctx));
    detail::fused_heads_backward(dev, fused_shape(ctx.shape), kb, s.q, s.k, s.v, s.merged, d_merged, s.stats, dq, dk,
                                 dv);
    rotate_rows(dev, s.g, rope, dq, dk, true);  // the gradients of the projections' (unrotated) outputs
    projections_backward(dev, p, grad, x, x, dq, dk, dv, s.lora, dx, dx, lora_draw(ctx));
  }

  // The own path's saved activations of one call, carved out of UnitContext::saved.
  template <class T>
  struct Parts {
    T* q;  // queries (rotated), then k and v repeated to `heads`, in the head layout
    T* k;
    T* v;
    T* att;
    T* merged;
    T* q_pre;  // QK-norm: the projections before the norm [Nq, dim], [Nk, kv heads hd]; else unused
    T* k_pre;
    detail::GqaShape g;  // the queries' shape (self-attention: the keys' too)
    std::int64_t k_time;
    HeadLayout heads_layout() const { return {g.batch, g.time, g.heads, g.head_dim, 1}; }
    detail::CrossLayout layout() const { return {g.batch, g.time, k_time, g.heads, g.head_dim}; }
  };

  // Workspace elements of T that hold the two [time, head_dim / 2] float tables.
  template <class T>
  static std::size_t rope_elems(const detail::GqaShape& g) {
    const auto floats = static_cast<std::size_t>(g.time * g.head_dim) + 1;
    return (floats * sizeof(float) + sizeof(T) - 1) / sizeof(T) + 1;
  }

  // The tables start at the first float-aligned address at or after `at`.
  template <class Dev>
  Rope rope_table(Dev& dev, const detail::GqaShape& g, float* at) const {
    if (!g.rope) return {nullptr, nullptr};
    float* cos_t = float_at(at);
    const std::int64_t half = g.head_dim / 2;
    float* sin_t = cos_t + g.time * half;
    dev.for_each(static_cast<std::size_t>(g.time * half),
                 detail::RopeTable{cos_t, sin_t, half, options_.rope_theta, options_.rope_factor});
    return {cos_t, sin_t};
  }

  // The checks every call makes; `want`: the saved elements the path needs.
  template <class T>
  void check_call(UnitParams<const T> p, MatView<const T> x, MatView<const T> m, const UnitContext<T>& ctx,
                  std::int64_t want) const {
    detail::check_count(name_, "parameters", p.size(), base_count() + lora_.param_count());
    detail::check_shape(name_, "input", x, ctx.shape.rows(), dim_);
    if constexpr (cross)
      if (m.rows % ctx.shape.batch != 0 || m.cols != memory_dim_)
        throw config_error(std::string(name_) + ": the memory is [" + std::to_string(m.rows) + ", " +
                               std::to_string(m.cols) + "] for " + std::to_string(ctx.shape.batch) +
                               " sequences of width " + std::to_string(memory_dim_),
                           "give the memory [B * T_mem, memory_dim], B as the queries'");
    detail::check_saved(name_, ctx.saved.size(), want,
                        "size the saved view with saved_size_of<T>(unit, device, shape, in)");
    if (options_.max_positions > 0 && ctx.shape.time > options_.max_positions)
      throw config_error(std::string(name_) + ": a sequence of " + std::to_string(ctx.shape.time) +
                             " positions is longer than the model's " + std::to_string(options_.max_positions) +
                             " (max_position_embeddings)",
                         "cut the data into blocks of at most " + std::to_string(options_.max_positions) + " tokens");
  }

  template <class T>
  detail::GqaShape call_shape(const UnitContext<T>& ctx) const {
    const DeviceTensor* pos = detail::position_ids(name_, ctx);
    if (cross && pos != nullptr)
      throw config_error(std::string(name_) + ": cross-attention over packed records (position_ids) is not supported",
                         "give the queries one record per sequence");
    return {ctx.shape.batch,
            ctx.shape.time,
            heads_,
            kv_heads_,
            head_dim(),
            rope_,
            pos != nullptr ? pos->data<std::int64_t>() : nullptr};
  }

  // The keys' padding: the batch's attention_mask (self-attention) or
  // encoder_attention_mask [B, T_mem] (cross), checked, or null.
  template <class T>
  const DeviceTensor* key_mask(const UnitContext<T>& ctx, std::int64_t k_time) const {
    if constexpr (!cross) {
      return detail::attention_mask(name_, ctx);
    } else {
      const DeviceTensor* mask = ctx.batch != nullptr ? ctx.batch->find("encoder_attention_mask") : nullptr;
      if (mask == nullptr) return nullptr;
      if (mask->shape != std::vector<std::int64_t>{ctx.shape.batch, k_time} ||
          (mask->type != element_type::i32 && mask->type != element_type::i64))
        throw config_error(std::string(name_) + ": the batch's encoder_attention_mask is " + shape_text(mask->shape) +
                               " " + std::string(element_name(mask->type)) + " for " + std::to_string(ctx.shape.batch) +
                               " memories of " + std::to_string(k_time),
                           "give encoder_attention_mask [B, T_mem] int32 or int64: 1 for a key, 0 for padding");
      return mask;
    }
  }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, MatView<const T> m, const UnitContext<T>& ctx) const {
    const std::int64_t k_time = cross && ctx.shape.batch > 0 ? m.rows / ctx.shape.batch : ctx.shape.time;
    check_call(p, x, m, ctx, saved_size(ctx.shape, k_time));
    const detail::GqaShape g = call_shape(ctx);
    const std::int64_t Nq = x.rows, Nk = m.rows;
    T* q = ctx.saved.data;
    T* k = q + Nq * inner_;
    T* v = k + Nk * inner_;
    T* att = v + Nk * inner_;
    T* merged = att + g.batch * heads_ * g.time * k_time;
    T* q_pre = merged + Nq * inner_;
    return {q, k, v, att, merged, q_pre, q_pre + Nq * inner_, g, k_time};
  }
};

using RotaryAttention = Attention<Rotary>;

}  // namespace dtrain::nn

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_ROTARY_ATTENTION_FUNCTORS(EACH, SUM, T) \
  EACH(::dtrain::nn::detail::ToRotatedHeads<T>)        \
  EACH(::dtrain::nn::detail::FromRotatedHeads<T>)      \
  EACH(::dtrain::nn::detail::RotatePairs<T>)           \
  EACH(::dtrain::nn::detail::RepeatKvHeads<T>)         \
  EACH(::dtrain::nn::detail::SumKvGroups<T>)

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/rotary_attention.ipp"
#endif
