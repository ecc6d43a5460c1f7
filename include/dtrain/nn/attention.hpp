#pragma once
// nn::CausalSelfAttention, the attention family's FusedQkv member
// (nn::Attention<FusedQkv>, nn/attention_policies.hpp; the family's other
// members: nn/rotary_attention.hpp): multi-head self-attention where
// position t sees positions 0..t, over activations [rows = B * T, dim]:
//   q | k | v = x Wqkv^T + bqkv            (one fused projection)
//   per (batch, head): A = softmax_causal(q k^T / sqrt(head_dim)), o = A v
//   y = concat_heads(o) Wproj^T + bproj
// Padding: when the batch holds "attention_mask" [B, T] (int32 or int64, 1
// for a token, 0 for padding, transformers' convention) no position attends
// to a padded one; a padded position that precedes every token attends to
// nothing (its output is the projection's bias). Give such positions no
// target (-100), as transformers' collators do.
// Packing: when the batch holds "position_ids" [B, T] (int64, 0 at each
// packed record's first token, then 1, 2, ...), a token attends only to its
// own record (a block-diagonal causal mask, transformers' padding-free
// packing); RotaryAttention rotates by those positions.
// Parameters (PyTorch/nanoGPT layout): qkv.weight [3 dim, dim], qkv.bias
// [3 dim], proj.weight [dim, dim], proj.bias [dim].
//
// Kept for backward (UnitContext::saved, 4 * rows * dim + B * heads * T * T
// elements): q, k and v, the attention probabilities and the merged heads.
// Everything else lives in the device workspace only while the call runs.
// On a GPU with DTRAIN_ATTENTION=cudnn, in bf16 or fp16, the attention is
// cuDNN's fused flash attention instead (device/fused_attention.hpp): no
// [T, T] matrix is formed, and what is kept is the projection's q | k | v
// rows, the merged heads and the softmax statistics (saved_size_on).
// Per-head products are strided batched GEMMs (cuBLAS on the GPU, OpenBLAS
// on the host). On the GPU q, k and v are permuted into the head layout
// [B, heads, T, head_dim], so one batched GEMM covers every (batch, head); on
// the host, where a permutation costs as much as a small GEMM, they stay in
// the projection's rows [B * T, 3 dim] and each head is read in place (a
// leading dimension of 3 dim), one batched GEMM over the heads per sequence.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/device/fused_attention.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/kernels/matrix.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/attention_policies.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/kv_cache.hpp"
#include "dtrain/nn/lora.hpp"

namespace dtrain::nn {

namespace detail {

// rows <-> heads (to_heads: rows -> heads), by runs of head_dim on the host.
template <class Dev, class T>
void permute_heads(Dev& dev, HeadLayout l, const T* src, T* dst, bool to_heads) {
  if constexpr (Dev::host_accessible)
    dev.for_each(static_cast<std::size_t>(l.rows() * l.parts * l.heads), HeadPermuteRuns<T>{l, src, dst, to_heads});
  else
    dev.for_each(static_cast<std::size_t>(l.rows() * l.parts * l.width()), HeadPermute<T>{l, src, dst, to_heads});
}

// The batch's "attention_mask" [B, T] (int32 or int64), checked, or null.
template <class T>
const DeviceTensor* attention_mask(const char* unit, const UnitContext<T>& ctx) {
  const DeviceTensor* mask = ctx.batch != nullptr ? ctx.batch->find("attention_mask") : nullptr;
  if (mask == nullptr) return nullptr;
  if (mask->shape != std::vector<std::int64_t>{ctx.shape.batch, ctx.shape.time})
    throw config_error(std::string(unit) + ": the batch's attention_mask is " + shape_text(mask->shape) + " for " +
                           std::to_string(ctx.shape.batch) + " sequences of " + std::to_string(ctx.shape.time),
                       "give attention_mask [B, T] like the ids: 1 for a token, 0 for padding");
  if (mask->type != element_type::i32 && mask->type != element_type::i64)
    throw config_error(
        std::string(unit) + ": the batch's attention_mask holds " + std::string(element_name(mask->type)),
        "give attention_mask as int32 or int64 (1: token, 0: padding)");
  return mask;
}

// The batch's "position_ids" [B, T] (int64), checked on the host, or null:
// packed records, each numbered 0, 1, ... from its first token (transformers'
// padding-free packing). A token attends only to its own record's tokens.
template <class T>
const DeviceTensor* position_ids(const char* unit, const UnitContext<T>& ctx) {
  const DeviceTensor* pos = ctx.batch != nullptr ? ctx.batch->find("position_ids") : nullptr;
  if (pos == nullptr) return nullptr;
  const std::int64_t b = ctx.shape.batch, time = ctx.shape.time;
  if (pos->shape != std::vector<std::int64_t>{b, time} || pos->type != element_type::i64)
    throw config_error(std::string(unit) + ": the batch's position_ids are " + shape_text(pos->shape) + " " +
                           std::string(element_name(pos->type)) + " for " + std::to_string(b) + " sequences of " +
                           std::to_string(time),
                       "give position_ids [B, T] int64 like the ids, 0 at each packed record's first token");
  const std::int64_t* p = pos->host_data<std::int64_t>();
  for (std::int64_t r = 0; r < b * time; ++r) {
    const std::int64_t t = r % time, want_next = t == 0 ? 0 : p[r - 1] + 1;
    if (p[r] != 0 && p[r] != want_next)
      throw config_error(std::string(unit) + ": position_ids of sequence " + std::to_string(r / time) + " go " +
                             (t == 0 ? std::string("from ") : std::to_string(p[r - 1]) + " to ") +
                             std::to_string(p[r]) + " at position " + std::to_string(t),
                         "number each packed record's tokens 0, 1, 2, ... from its first");
  }
  return pos;
}

// The attention's products over `batch` (batch, head) pairs of a causal
// [time, time] matrix S (scores, probabilities, or their gradients) and
// [time, head_dim] blocks A, B (each with its leading dimension and stride):
//   scores            S = alpha A B^T, of which only S[t, j <= t] is used
//   apply             C = S B, S zero past the diagonal
//   apply_transposed  C = S^T B
// In blocks of the device's causal_block rows (Dev::tuning: on the host,
// each block multiplying only what the mask leaves), or 0: one product
// each, whole rows (the GPU). Nothing reads a row of S past its block's end,
// so nothing writes it there either: the scores products leave it, the
// causal softmax and its backward (block = causal_block_on<Dev>) read a row
// only to the end of its lane group, which a block's end (a multiple of
// math::lanes) bounds, and write it to the block's end.
enum class causal_product { scores, apply, apply_transposed };
// The block the softmax kernels write to (CausalSoftmax::block): 0, whole rows.
template <class Dev>
constexpr std::int64_t causal_block_on = [] {
  static_assert(Dev::tuning::causal_block % math::lanes == 0, "a block must end on a lane group");
  return Dev::tuning::causal_block;
}();

template <class Dev, class T>
void causal_gemm_batched(Dev& dev, causal_product kind, std::int64_t time, std::int64_t head_dim, float alpha,
                         const T* A, std::int64_t lda, std::int64_t stride_a, const T* B, std::int64_t ldb,
                         std::int64_t stride_b, T* C, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  const std::int64_t block = causal_block_on<Dev> > 0 ? causal_block_on<Dev> : time;
  for (std::int64_t r0 = 0; r0 < time; r0 += block) {
    const std::int64_t r1 = std::min(time, r0 + block), rows = r1 - r0;
    T* c = C + r0 * ldc;
    if (kind == causal_product::scores)
      dev.gemm_batched(false, true, rows, r1, head_dim, alpha, A + r0 * lda, lda, stride_a, B, ldb, stride_b, 0.f, c,
                       ldc, stride_c, batch);
    else if (kind == causal_product::apply)
      dev.gemm_batched(false, false, rows, head_dim, r1, alpha, A + r0 * lda, lda, stride_a, B, ldb, stride_b, 0.f, c,
                       ldc, stride_c, batch);
    else  // rows r0.. of S^T B: S's columns r0..r1 over its rows r0..time
      dev.gemm_batched(true, false, rows, head_dim, time - r0, alpha, A + r0 * lda + r0, lda, stride_a, B + r0 * ldb,
                       ldb, stride_b, 0.f, c, ldc, stride_c, batch);
  }
}

// Attention scores [B * heads, T, T] to probabilities, in place: causal,
// without the keys the batch's "attention_mask" marks as padding (if any),
// and within each packed record when the batch has "position_ids".
// window > 0: sliding-window attention (CausalSoftmax::window).
template <class Dev, class T>
void attention_softmax(Dev& dev, const char* unit, T* att, std::int64_t heads, const UnitContext<T>& ctx,
                       std::int64_t window = 0) {
  const std::int64_t time = ctx.shape.time;
  const auto rows = static_cast<std::size_t>(ctx.shape.batch * heads * time);
  const DeviceTensor* mask = attention_mask(unit, ctx);
  const DeviceTensor* pos = position_ids(unit, ctx);
  const std::int64_t* p = pos != nullptr ? pos->data<std::int64_t>() : nullptr;
  constexpr std::int64_t block = causal_block_on<Dev>;
  if (mask == nullptr && p == nullptr)
    return dev.for_each(rows, CausalSoftmax<T>{att, time, nullptr, heads, nullptr, block, window});
  if (mask == nullptr) return dev.for_each(rows, CausalSoftmax<T>{att, time, nullptr, heads, p, block, window});
  if (mask->type == element_type::i32)
    return dev.for_each(rows,
                        CausalSoftmax<T, std::int32_t>{att, time, mask->data<std::int32_t>(), heads, p, block, window});
  dev.for_each(rows, CausalSoftmax<T, std::int64_t>{att, time, mask->data<std::int64_t>(), heads, p, block, window});
}

// The fused path's padding: an additive bias [B, 1, T, T], 0 for a token
// and a large negative number for padding (finite, so a query with every key
// masked, a padding position before the first token, stays finite; nothing
// reads its output and no other query attends to it). Every query gets its
// own row of the key's values: cuDNN's backward read a [B, 1, 1, T] bias
// broadcast over the queries wrongly (gradients off on an H100, 2026-11-27),
// while the full shape is the one its documentation and samples use.
// With position ids, a key before the query's record is masked the same way.
template <class T, class M>
struct KeyBias {
  const M* mask;  // or null
  T* bias;
  std::int64_t time;
  const std::int64_t* positions = nullptr;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i), b = n / (time * time), query = n / time % time, key = n % time;
    const bool kept = (mask == nullptr || mask[b * time + key] != 0) &&
                      (positions == nullptr || key >= query - positions[b * time + query]);
    bias[i] = dtype_cast<T>(kept ? 0.f : -30000.f);
  }
};

// The elements key_bias writes for this call: B * T * T with a padding mask,
// 0 without, rounded up to 16 bytes (what follows it in a workspace stays
// aligned for cuDNN).
template <class T>
std::int64_t key_bias_size(const char* unit, const UnitContext<T>& ctx) {
  if (attention_mask(unit, ctx) == nullptr && position_ids(unit, ctx) == nullptr) return 0;
  const auto per = static_cast<std::int64_t>(16 / sizeof(T));
  const std::int64_t n = ctx.shape.batch * ctx.shape.time * ctx.shape.time;
  return (n + per - 1) / per * per;
}

// The bias for the batch's attention_mask written to `out` (key_bias_size
// elements), or null without a mask.
template <class Dev, class T>
const T* key_bias(Dev& dev, const char* unit, const UnitContext<T>& ctx, T* out) {
  const DeviceTensor* mask = attention_mask(unit, ctx);
  const DeviceTensor* pos = position_ids(unit, ctx);
  if (mask == nullptr && pos == nullptr) return nullptr;
  const std::int64_t time = ctx.shape.time;
  const std::int64_t* p = pos != nullptr ? pos->data<std::int64_t>() : nullptr;
  const auto n = static_cast<std::size_t>(ctx.shape.batch * time * time);
  if (mask != nullptr && mask->type == element_type::i32)
    dev.for_each(n, KeyBias<T, std::int32_t>{mask->data<std::int32_t>(), out, time, p});
  else
    dev.for_each(n, KeyBias<T, std::int64_t>{mask != nullptr ? mask->data<std::int64_t>() : nullptr, out, time, p});
  return out;
}

// Whether a unit's attention on `shape` runs fused (device/fused_attention.hpp):
// only if cuDNN serves it with and without a padding bias, since the saved
// buffer is sized before the batch shows whether it has padding.
template <class Dev, class T>
bool fused_attention(Dev& dev, FusedAttentionShape s) {
  // 16-byte aligned rows and heads, as cuDNN's kernels load them
  constexpr std::int64_t per16 = 16 / static_cast<std::int64_t>(sizeof(T));
  for (const AttentionStrides& t : {s.q, s.k, s.v, s.o})
    if (t.row % per16 != 0 || t.head % per16 != 0) return false;
  s.key_bias = false;
  if (!use_fused_attention<Dev, T>(dev, s)) return false;
  s.key_bias = true;
  return use_fused_attention<Dev, T>(dev, s);
}

// `offset` elements of T rounded up to a 16-byte boundary (the fused path's
// softmax statistics, floats, follow the unit's other saved activations).
template <class T>
std::int64_t float_aligned(std::int64_t offset) {
  const auto per = static_cast<std::int64_t>(16 / sizeof(T));
  return (offset + per - 1) / per * per;
}

// out[N, width] = in W^T (+ b): the bias first so the GEMM adds to it and the
// output is rounded once (as nn::Linear); b may be null.
template <class Dev, class T>
void project(Dev& dev, MatView<const T> in, const T* w, const T* b, T* out, std::int64_t width) {
  float beta = 0.f;
  if (b != nullptr) {
    broadcast_row(dev, b, MatView<T>{out, in.rows, width});
    beta = 1.f;
  }
  dev.gemm(false, true, in.rows, width, in.cols, 1.f, in.data, in.cols, w, in.cols, beta, out, width);
}

// dW = d_out^T in, db = column sums of d_out (each skipped when empty: frozen or absent).
template <class Dev, class T>
void projection_grads(Dev& dev, MatView<const T> in, MatView<const T> d_out, MatView<T> dw, MatView<T> db) {
  if (!dw.empty())
    dev.gemm(true, false, d_out.cols, in.cols, in.rows, 1.f, d_out.data, d_out.cols, in.data, in.cols, 0.f, dw.data,
             in.cols);
  if (!db.empty()) column_sum(dev, d_out, db.data);
}

// What the attention units (CausalSelfAttention, RotaryAttention) compute
// alike, whatever their projections and positions.

// The projection each unit ends with, y = merged Wo^T + bo (b may be null),
// and the adapter on it: LoRA site `site` of the unit's adapters, whose saved
// rows start at `lora_saved`.
template <class Dev, class T>
void output_projection(Dev& dev, const LoraSet& lora, std::size_t site, UnitParams<const T> p, MatView<const T> merged,
                       const T* w, const T* b, MatView<T> y, T* lora_saved, LoraDraw draw, LoraRows rows = {}) {
  project(dev, merged, w, b, y.data, y.cols);
  lora.forward(dev, site, p, merged, y.data, lora_saved, draw, rows);
}

// Its backward: d_merged = dy Wo, the gradients of Wo and bo (dw, db: each
// skipped when empty) and the adapter's, which adds its part to d_merged.
template <class Dev, class T>
void output_projection_backward(Dev& dev, const LoraSet& lora, std::size_t site, UnitParams<const T> p,
                                UnitParams<T> grad, MatView<const T> merged, MatView<const T> dy, const T* w,
                                MatView<T> dw, MatView<T> db, T* d_merged, T* lora_saved, LoraDraw draw,
                                LoraRows rows = {}) {
  const std::int64_t N = merged.rows, in = merged.cols, out = dy.cols;
  dev.gemm(false, false, N, in, out, 1.f, dy.data, out, w, in, 0.f, d_merged, in);
  projection_grads(dev, merged, dy, dw, db);
  lora.backward(dev, site, p, grad, merged, dy.data, lora_saved, MatView<T>{d_merged, N, in}, draw, rows);
}

// The reference attention on q, k, v in the head layout [B, heads, T, hd]
// (`l`, one part): the probabilities into att [B heads, T, T], o = att v
// (head layout, scratch), then o merged into rows [B T, heads hd].
// The scores' scale: `scale`, or 0 for 1 / sqrt(head_dim).
inline float scores_scale(float scale, std::int64_t head_dim) {
  return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

// `scale`: as scores_scale; `window` > 0: sliding-window attention.
template <class Dev, class T>
void heads_attention(Dev& dev, const char* unit, HeadLayout l, const T* q, const T* k, const T* v, T* att, T* o,
                     T* merged, const UnitContext<T>& ctx, float scale = 0.f, std::int64_t window = 0) {
  const std::int64_t T_ = l.time, hd = l.head_dim, tt = T_ * T_, th = T_ * hd, bh = l.batch * l.heads;
  causal_gemm_batched(dev, causal_product::scores, T_, hd, scores_scale(scale, hd), q, hd, th, k, hd, th, att, T_, tt,
                      bh);
  attention_softmax(dev, unit, att, l.heads, ctx, window);
  causal_gemm_batched(dev, causal_product::apply, T_, hd, 1.f, att, T_, tt, v, hd, th, o, hd, th, bh);
  permute_heads(dev, l, o, merged, false);
}

// Its backward from the merged heads' gradient d_merged: d_o (d_merged in
// the head layout), d_att (the probabilities' gradient, then in place the
// scores'), and d_q, d_k, d_v in the head layout.
template <class Dev, class T>
void heads_attention_backward(Dev& dev, HeadLayout l, const T* q, const T* k, const T* v, const T* att,
                              const T* d_merged, T* d_o, T* d_att, T* d_q, T* d_k, T* d_v, float scores = 0.f) {
  const std::int64_t T_ = l.time, hd = l.head_dim, tt = T_ * T_, th = T_ * hd, bh = l.batch * l.heads;
  const float scale = scores_scale(scores, hd);
  permute_heads(dev, l, d_merged, d_o, true);
  causal_gemm_batched(dev, causal_product::scores, T_, hd, 1.f, d_o, hd, th, v, hd, th, d_att, T_, tt, bh);
  causal_gemm_batched(dev, causal_product::apply_transposed, T_, hd, 1.f, att, T_, tt, d_o, hd, th, d_v, hd, th, bh);
  dev.for_each(static_cast<std::size_t>(bh * T_),
               CausalSoftmaxBackward<T>{att, d_att, T_, scale, causal_block_on<Dev>});
  causal_gemm_batched(dev, causal_product::apply, T_, hd, 1.f, d_att, T_, tt, k, hd, th, d_q, hd, th, bh);
  causal_gemm_batched(dev, causal_product::apply_transposed, T_, hd, 1.f, d_att, T_, tt, q, hd, th, d_k, hd, th, bh);
}

// cuDNN's fused attention (device/fused_attention.hpp) on a unit's q, k, v,
// strided as `shape` says, into the merged heads, with the batch's key bias
// (key_bias) or none, scaled by 1 / sqrt(head_dim) as heads_attention is.
template <class Dev, class T>
void fused_heads(Dev& dev, FusedAttentionShape shape, const T* bias, const T* q, const T* k, const T* v, T* merged,
                 float* stats) {
  shape.key_bias = bias != nullptr;
  fused_attention_forward<Dev, T>(dev, shape, 1.f / std::sqrt(static_cast<float>(shape.head_dim)), q, k, v, bias,
                                  merged, stats);
}

// Its backward: dq, dk, dv from the merged heads' gradient d_merged.
template <class Dev, class T>
void fused_heads_backward(Dev& dev, FusedAttentionShape shape, const T* bias, const T* q, const T* k, const T* v,
                          const T* merged, const T* d_merged, const float* stats, T* dq, T* dk, T* dv) {
  shape.key_bias = bias != nullptr;
  fused_attention_backward<Dev, T>(dev, shape, 1.f / std::sqrt(static_cast<float>(shape.head_dim)), q, k, v, merged,
                                   d_merged, stats, bias, dq, dk, dv);
}

// The choice every call of an attention unit makes: cuDNN's fused path where
// the unit's policies allow it (fusable: causal self-attention) and it serves
// the call's shape (fused_attention), the unit's own GEMMs and softmax
// otherwise; and the saved elements that path keeps, the adapters' rows after
// them. A unit derives from AttentionPaths<itself> and lets it (a friend)
// call its fusable, fused_shape, fused_saved<T>, lora_ and its paths:
// fused_forward and fused_backward, own_forward and own_backward.
template <class Unit>
class AttentionPaths {
 public:
  template <class Dev, class T>
  std::int64_t saved_size_on(Dev& dev, SeqShape s, std::int64_t in) const {
    if (!fused<Dev, T>(dev, s)) return unit().saved_size(s, in);
    return unit().template fused_saved<T>(s) + unit().lora_.saved_size(s.rows());
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    if (ctx.kv != nullptr) return unit().cached_forward(dev, p, x, y, ctx);  // generation: nn/kv_cache.hpp
    if (fused<Dev, T>(dev, ctx.shape)) return unit().fused_forward(dev, p, x, y, own(ctx));
    unit().own_forward(dev, p, x, y, own(ctx));
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    if (fused<Dev, T>(dev, ctx.shape)) return unit().fused_backward(dev, p, grad, x, dy, dx, own(ctx));
    unit().own_backward(dev, p, grad, x, dy, dx, own(ctx));
  }

 private:
  // The context the unit attends in: without the batch when its masks
  // describe another sequence (options batch_masks false: a vision tower's
  // layers beside a text whose attention_mask and position_ids the batch holds).
  template <class T>
  UnitContext<T> own(const UnitContext<T>& ctx) const {
    UnitContext<T> c = ctx;
    if (!unit().options_.batch_masks) c.batch = nullptr;
    return c;
  }
  template <class Dev, class T>
  bool fused(Dev& dev, SeqShape s) const {
    return unit().fusable() && fused_attention<Dev, T>(dev, unit().fused_shape(s));
  }
  Unit& unit() { return static_cast<Unit&>(*this); }
  const Unit& unit() const { return static_cast<const Unit&>(*this); }
};

}  // namespace detail

struct AttentionOptions {
  float init_std = 0.02f;  // projection weights ~ N(0, init_std); biases 0
  bool trainable = true;
  // LoRA adapters on the fused q|k|v projection (GPT-2's c_attn) and on the
  // output projection (c_proj): nn/lora.hpp.
  LoraOptions qkv_lora{};
  LoraOptions proj_lora{};
  // false: the batch's "attention_mask" and "position_ids" are not read
  // (they describe another sequence than this unit's rows)
  bool batch_masks = true;
};

// nn::CausalSelfAttention: the family's FusedQkv member (nn/attention_policies.hpp).
template <>
class AttentionUnit<Causal, NoPositions, FusedQkv, SelfInput>
    : public detail::AttentionPaths<AttentionUnit<Causal, NoPositions, FusedQkv, SelfInput>> {
 public:
  DTRAIN_DECL AttentionUnit(std::int64_t dim, std::int64_t heads, AttentionOptions options = {});

  std::int64_t dim() const { return dim_; }
  std::int64_t heads() const { return heads_; }

  DTRAIN_DECL std::vector<ParamSpec> params() const;
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::CausalSelfAttention", in, dim_); }

  // (the adapters' rows after the attention's own activations; saved_size_on,
  // forward and backward: detail::AttentionPaths)
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    return 4 * s.rows() * dim_ + s.batch * heads_ * s.time * s.time + lora_.saved_size(s.rows());
  }

 private:
  friend class detail::AttentionPaths<AttentionUnit>;

  static constexpr bool fusable() { return true; }

  // Generation with a key-value cache (nn/kv_cache.hpp): q | k | v of the
  // new rows, their keys and values into the cache, each query against its
  // sequence's cached keys.
  template <class Dev, class T>
  void cached_forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    constexpr const char* name = "nn::CausalSelfAttention";
    detail::check_shape(name, "output", y, x.rows, dim_);
    const std::int64_t C = dim_, N = x.rows, hd = head_dim();
    const detail::CacheShape cs{ctx.shape.batch, ctx.shape.time, heads_, heads_, hd, ctx.kv->capacity};
    const DeviceTensor& pos = detail::cached_positions(name, ctx, cs);
    // workspace: q|k|v rows [N, 3C] | merged [N, C] | the adapters' rows
    T* qkv = dev.template workspace<T>(static_cast<std::size_t>(4 * N * C + lora_.saved_size(N)));
    T* merged = qkv + 3 * N * C;
    T* lora = merged + N * C;
    detail::project(dev, x, p[0].data, p[1].data, qkv, 3 * C);
    lora_.forward(dev, 0, p, x, qkv, lora, lora_draw(ctx));
    detail::cached_attention(dev, name, ctx, cs, qkv, 3 * C, qkv + C, qkv + 2 * C, 3 * C, pos.data<std::int64_t>(),
                             1.f / std::sqrt(static_cast<float>(hd)), 0, merged);
    detail::output_projection(dev, lora_, 1, p, MatView<const T>{merged, N, C}, p[2].data, p[3].data, y, lora,
                              lora_draw(ctx));
  }

  template <class Dev, class T>
  void own_forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, ctx);
    detail::check_shape("nn::CausalSelfAttention", "output", y, x.rows, dim_);
    if constexpr (Dev::host_accessible) {
      const std::int64_t T_ = s.time, hd = head_dim(), tt = T_ * T_;
      const float scale = 1.f / std::sqrt(static_cast<float>(hd));
      // q | k | v stay in the projection's rows: each (batch, head) is a
      // [time, head_dim] block with leading dimension 3 dim, read in place
      const std::int64_t C = dim_, ld = 3 * C;
      detail::project(dev, x, p[0].data, p[1].data, s.q, 3 * C);
      lora_.forward(dev, 0, p, x, s.q, s.lora, lora_draw(ctx));
      for (std::int64_t b = 0; b < s.batch; ++b) {
        const T* q = s.q + b * T_ * ld;
        detail::causal_gemm_batched(dev, detail::causal_product::scores, T_, hd, scale, q, ld, hd, q + C, ld, hd,
                                    s.att + b * heads_ * tt, T_, tt, heads_);
      }
      detail::attention_softmax(dev, "nn::CausalSelfAttention", s.att, heads_, ctx);
      for (std::int64_t b = 0; b < s.batch; ++b)
        detail::causal_gemm_batched(dev, detail::causal_product::apply, T_, hd, 1.f, s.att + b * heads_ * tt, T_, tt,
                                    s.q + b * T_ * ld + 2 * C, ld, hd, s.merged + b * T_ * C, C, hd, heads_);
    } else {
      T* qkv = dev.template workspace<T>(static_cast<std::size_t>(4 * s.rows * dim_));
      T* o = qkv + 3 * s.rows * dim_;
      detail::project(dev, x, p[0].data, p[1].data, qkv, 3 * dim_);
      lora_.forward(dev, 0, p, x, qkv, s.lora, lora_draw(ctx));
      detail::permute_heads(dev, s.layout(3), qkv, s.q, true);
      detail::heads_attention(dev, "nn::CausalSelfAttention", s.layout(1), s.q, s.k, s.v, s.att, o, s.merged, ctx);
    }
    detail::output_projection(dev, lora_, 1, p, MatView<const T>{s.merged, s.rows, dim_}, p[2].data, p[3].data, y,
                              s.lora, lora_draw(ctx));
  }

  template <class Dev, class T>
  void own_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> dy,
                    MatView<T> dx, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::CausalSelfAttention", "gradients", grad.size(), p.size());
    detail::check_shape("nn::CausalSelfAttention", "output gradient", dy, x.rows, dim_);
    const std::int64_t N = s.rows, C = dim_, T_ = s.time, hd = head_dim(), tt = T_ * T_;
    // workspace: d_merged [N, C] | d_att | d_qkv [N, 3C] | (GPU) d_o, d_q d_k d_v in the head layout
    T* ws = dev.template workspace<T>(static_cast<std::size_t>((Dev::host_accessible ? 4 : 8) * N * C + s.bh * tt));
    T* d_merged = ws;
    T* d_att = d_merged + N * C;
    T* d_qkv = d_att + s.bh * tt;
    detail::output_projection_backward(dev, lora_, 1, p, grad, MatView<const T>{s.merged, N, C}, dy, p[2].data, grad[2],
                                       grad[3], d_merged, s.lora, lora_draw(ctx));
    if constexpr (Dev::host_accessible) {
      // the saved q | k | v and d_merged, d_qkv are read and written in their
      // rows, as in forward
      const std::int64_t ld = 3 * C;
      const float scale = 1.f / std::sqrt(static_cast<float>(hd));
      for (std::int64_t b = 0; b < s.batch; ++b) {
        const T* qkv = s.q + b * T_ * ld;
        const T* d_o = d_merged + b * T_ * C;
        T* da = d_att + b * heads_ * tt;
        detail::causal_gemm_batched(dev, detail::causal_product::scores, T_, hd, 1.f, d_o, C, hd, qkv + 2 * C, ld, hd,
                                    da, T_, tt, heads_);
        detail::causal_gemm_batched(dev, detail::causal_product::apply_transposed, T_, hd, 1.f, s.att + b * heads_ * tt,
                                    T_, tt, d_o, C, hd, d_qkv + b * T_ * ld + 2 * C, ld, hd, heads_);
      }
      dev.for_each(static_cast<std::size_t>(s.bh * T_),
                   CausalSoftmaxBackward<T>{s.att, d_att, T_, scale, detail::causal_block_on<Dev>});
      for (std::int64_t b = 0; b < s.batch; ++b) {
        const T* qkv = s.q + b * T_ * ld;
        const T* da = d_att + b * heads_ * tt;
        T* dq = d_qkv + b * T_ * ld;
        detail::causal_gemm_batched(dev, detail::causal_product::apply, T_, hd, 1.f, da, T_, tt, qkv + C, ld, hd, dq,
                                    ld, hd, heads_);
        detail::causal_gemm_batched(dev, detail::causal_product::apply_transposed, T_, hd, 1.f, da, T_, tt, qkv, ld, hd,
                                    dq + C, ld, hd, heads_);
      }
    } else {
      T* d_o = d_qkv + 3 * N * C;
      T* d_q = d_o + N * C;
      T* d_k = d_q + N * C;
      T* d_v = d_k + N * C;
      detail::heads_attention_backward(dev, s.layout(1), s.q, s.k, s.v, s.att, d_merged, d_o, d_att, d_q, d_k, d_v);
      detail::permute_heads(dev, s.layout(3), d_q, d_qkv, false);
    }
    qkv_backward(dev, p, grad, x, d_qkv, s.lora, dx, lora_draw(ctx));
  }

  // The fused path: q | k | v stay in the projection's rows [N, 3 dim], the
  // attention writes the merged heads [N, dim] directly; kept: those two and
  // the statistics (float-aligned after them).
  FusedAttentionShape fused_shape(SeqShape s) const {
    const std::int64_t C = dim_, hd = head_dim();
    const AttentionStrides qkv{s.time * 3 * C, hd, 3 * C}, o{s.time * C, hd, C};
    return {s.batch, heads_, heads_, s.time, hd, qkv, qkv, qkv, o, false};
  }

  template <class T>
  struct Fused {
    T* qkv;
    T* merged;
    float* stats;
    T* lora;  // the adapters' saved rows
  };

  // The fused path's own saved elements.
  template <class T>
  std::int64_t fused_saved(SeqShape s) const {
    return detail::float_aligned<T>(4 * s.rows() * dim_) + attention_stats_size<T>(s.batch, heads_, s.time);
  }

  // The q|k|v projection's gradients from d_qkv [N, 3 dim], and the input's.
  template <class Dev, class T>
  void qkv_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, const T* d_qkv, T* lora,
                    MatView<T> dx, LoraDraw draw) const {
    const std::int64_t N = x.rows, C = dim_;
    detail::projection_grads(dev, x, MatView<const T>{d_qkv, N, 3 * C}, grad[0], grad[1]);
    if (!dx.empty()) {
      detail::check_shape("nn::CausalSelfAttention", "input gradient", dx, N, C);
      dev.gemm(false, false, N, C, 3 * C, 1.f, d_qkv, 3 * C, p[0].data, C, 0.f, dx.data, C);
    }
    lora_.backward(dev, 0, p, grad, x, d_qkv, lora, dx, draw);
  }

  template <class Dev, class T>
  Fused<T> fused_parts(Dev& dev, UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::CausalSelfAttention", "parameters", p.size(), 4 + lora_.param_count());
    detail::check_shape("nn::CausalSelfAttention", "input", x, ctx.shape.rows(), dim_);
    detail::check_saved("nn::CausalSelfAttention", ctx.saved.size(), saved_size_on<Dev, T>(dev, ctx.shape, dim_),
                        "size the saved view with saved_size_of<T>(unit, device, shape, in)");
    const std::int64_t n = x.rows * dim_;
    return {ctx.saved.data, ctx.saved.data + 3 * n,
            reinterpret_cast<float*>(ctx.saved.data + detail::float_aligned<T>(4 * n)),
            ctx.saved.data + fused_saved<T>(ctx.shape)};
  }

  template <class Dev, class T>
  void fused_forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const Fused<T> s = fused_parts(dev, p, x, ctx);
    detail::check_shape("nn::CausalSelfAttention", "output", y, x.rows, dim_);
    const std::int64_t C = dim_;
    T* bias_ws = dev.template workspace<T>(
        static_cast<std::size_t>(std::max<std::int64_t>(1, detail::key_bias_size("nn::CausalSelfAttention", ctx))));
    const T* bias = detail::key_bias(dev, "nn::CausalSelfAttention", ctx, bias_ws);
    detail::project(dev, x, p[0].data, p[1].data, s.qkv, 3 * C);
    lora_.forward(dev, 0, p, x, s.qkv, s.lora, lora_draw(ctx));
    detail::fused_heads(dev, fused_shape(ctx.shape), bias, s.qkv, s.qkv + C, s.qkv + 2 * C, s.merged, s.stats);
    detail::output_projection(dev, lora_, 1, p, MatView<const T>{s.merged, x.rows, C}, p[2].data, p[3].data, y, s.lora,
                              lora_draw(ctx));
  }

  template <class Dev, class T>
  void fused_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> dy,
                      MatView<T> dx, const UnitContext<T>& ctx) {
    const Fused<T> s = fused_parts(dev, p, x, ctx);
    detail::check_count("nn::CausalSelfAttention", "gradients", grad.size(), p.size());
    detail::check_shape("nn::CausalSelfAttention", "output gradient", dy, x.rows, dim_);
    const std::int64_t N = x.rows, C = dim_, bt = detail::key_bias_size("nn::CausalSelfAttention", ctx);
    // workspace: key bias [B, 1, T, T] (with padding) | d_merged [N, C] | d_qkv [N, 3C]
    T* bias_ws = dev.template workspace<T>(static_cast<std::size_t>(bt + 4 * N * C));
    T* d_merged = bias_ws + bt;
    T* d_qkv = d_merged + N * C;
    const T* bias = detail::key_bias(dev, "nn::CausalSelfAttention", ctx, bias_ws);
    detail::output_projection_backward(dev, lora_, 1, p, grad, MatView<const T>{s.merged, N, C}, dy, p[2].data, grad[2],
                                       grad[3], d_merged, s.lora, lora_draw(ctx));
    detail::fused_heads_backward(dev, fused_shape(ctx.shape), bias, s.qkv, s.qkv + C, s.qkv + 2 * C, s.merged, d_merged,
                                 s.stats, d_qkv, d_qkv + C, d_qkv + 2 * C);
    qkv_backward(dev, p, grad, x, d_qkv, s.lora, dx, lora_draw(ctx));
  }

  // The saved activations of one call, carved out of UnitContext::saved.
  template <class T>
  struct Parts {
    T* q;
    T* k;
    T* v;
    T* att;
    T* merged;
    T* lora;  // the adapters' saved rows
    std::int64_t rows, batch, time, heads, head_dim, bh;
    HeadLayout layout(std::int64_t count) const { return {batch, time, heads, head_dim, count}; }
  };

  std::int64_t head_dim() const { return dim_ / heads_; }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::CausalSelfAttention", "parameters", p.size(), 4 + lora_.param_count());
    detail::check_shape("nn::CausalSelfAttention", "input", x, ctx.shape.rows(), dim_);
    detail::check_saved("nn::CausalSelfAttention", ctx.saved.size(), saved_size(ctx.shape, dim_),
                        "pass the unit a UnitContext whose saved view holds saved_size(shape) elements");
    const std::int64_t n = x.rows * dim_;
    T* q = ctx.saved.data;
    T* att = q + 3 * n;
    const std::int64_t bh = ctx.shape.batch * heads_;
    T* merged = att + bh * ctx.shape.time * ctx.shape.time;
    return {q,      q + n,           q + 2 * n,      att,    merged,     merged + n,
            x.rows, ctx.shape.batch, ctx.shape.time, heads_, head_dim(), bh};
  }

  std::int64_t dim_;
  std::int64_t heads_;
  AttentionOptions options_;
  detail::LoraSet lora_;
};

using CausalSelfAttention = Attention<FusedQkv>;

}  // namespace dtrain::nn

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_ATTENTION_FUNCTORS(EACH, SUM, T)        \
  EACH(::dtrain::nn::detail::KeyBias<T, std::int32_t>) \
  EACH(::dtrain::nn::detail::KeyBias<T, std::int64_t>)

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/attention.ipp"
#endif
