#pragma once
// nn::RotaryAttention: causal self-attention as Llama-family models compute
// it, over activations [rows = B * T, dim]:
//   q = x Wq^T (+ bq)   [heads x head_dim]      k, v = x Wk^T, x Wv^T (+ b)
//                                                [kv_heads x head_dim]
//   rotary position embedding on q and k (transformers' half-split layout:
//   element d pairs with d + head_dim/2, rotated by t * rope_theta^(-2i/head_dim))
//   grouped-query attention: query head h reads key/value head h / (heads / kv_heads)
//   per (batch, head): A = softmax_causal(q k^T / sqrt(head_dim)), o = A v
//   y = concat_heads(o) Wo^T (+ bo)
// Parameters (transformers' names and shapes): q.weight [heads hd, dim],
// k.weight [kv_heads hd, dim], v.weight [kv_heads hd, dim], o.weight
// [dim, heads hd], then q/k/v.bias with qkv_bias (Qwen2) and o.bias with
// out_bias. Padding: the batch's "attention_mask" as for
// nn::CausalSelfAttention (positions stay 0..T-1, as transformers numbers
// them in a forward pass; rotary scores depend only on t - j, so left
// padding does not change what the tokens compute).
//
// Kept for backward (UnitContext::saved): the rotated q, the key and value
// heads repeated to `heads` (so every product is one strided batched GEMM,
// as transformers' repeat_kv), the probabilities and the merged heads:
// 4 * rows * heads * hd + B * heads * T * T elements. The repeated key and
// value gradients are summed back per group, in a fixed order (no atomics).
// On a GPU with DTRAIN_ATTENTION=cudnn, in bf16 or fp16, cuDNN's fused
// attention takes grouped key/value heads as they are, in the projections'
// rows (device/fused_attention.hpp): kept are the rotated q, k and v rows,
// the merged heads and the softmax statistics (saved_size_on).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
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
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/lora.hpp"

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
  DTRAIN_HOST_DEVICE void operator()(std::size_t n) const {
    const auto t = static_cast<std::int64_t>(n) / half, i = static_cast<std::int64_t>(n) % half;
    const auto inv_freq = static_cast<float>(
        1.0 / ::pow(static_cast<double>(theta), static_cast<double>(2 * i) / static_cast<double>(2 * half)));
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

}  // namespace detail

struct RotaryAttentionOptions {
  std::int64_t kv_heads = 0;   // 0: as many as query heads (multi-head attention); 1: multi-query
  float rope_theta = 10000.f;  // 0: no rotary embedding
  bool qkv_bias = false;       // Qwen2-style biases on q, k and v
  bool out_bias = false;
  float init_std = 0.02f;          // weights ~ N(0, init_std); biases 0
  std::int64_t max_positions = 0;  // > 0: longer sequences are an error (max_position_embeddings)
  bool trainable = true;
  // LoRA adapters on the q, k, v and o projections (PEFT's q_proj, k_proj,
  // v_proj, o_proj): nn/lora.hpp.
  LoraOptions q_lora{};
  LoraOptions k_lora{};
  LoraOptions v_lora{};
  LoraOptions o_lora{};
};

class RotaryAttention : public detail::AttentionPaths<RotaryAttention> {
 public:
  DTRAIN_DECL RotaryAttention(std::int64_t dim, std::int64_t heads, RotaryAttentionOptions options = {});

  std::int64_t dim() const { return dim_; }
  std::int64_t heads() const { return heads_; }
  std::int64_t kv_heads() const { return kv_heads_; }
  std::int64_t head_dim() const { return dim_ / heads_; }

  DTRAIN_DECL std::vector<ParamSpec> params() const;
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::RotaryAttention", in, dim_); }

  // (the adapters' rows after the attention's own activations; saved_size_on,
  // forward and backward: detail::AttentionPaths)
  std::int64_t saved_size(SeqShape s, std::int64_t) const { return own_saved(s) + lora_.saved_size(s.rows()); }

 private:
  friend class detail::AttentionPaths<RotaryAttention>;

  template <class Dev, class T>
  void own_forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, ctx);
    detail::check_shape("nn::RotaryAttention", "output", y, x.rows, dim_);
    const std::int64_t N = x.rows, kv = kv_heads_ * head_dim();
    // workspace: q k v rows [N, dim + 2 kv] | o [heads layout] | rope cos, sin
    T* q_rows = dev.template workspace<T>(static_cast<std::size_t>(N * (2 * dim_ + 2 * kv)) + rope_elems<T>(s.g));
    T* k_rows = q_rows + N * dim_;
    T* v_rows = k_rows + N * kv;
    T* o = v_rows + N * kv;
    const Rope rope = rope_table(dev, s.g, reinterpret_cast<float*>(o + N * dim_));
    detail::project(dev, x, p[0].data, bias(p, 0).data, q_rows, dim_);
    detail::project(dev, x, p[1].data, bias(p, 1).data, k_rows, kv);
    detail::project(dev, x, p[2].data, bias(p, 2).data, v_rows, kv);
    T* lora = ctx.saved.data + own_saved(ctx.shape);
    for (std::size_t i = 0; i < 3; ++i)
      lora_.forward(dev, i, p, x, i == 0 ? q_rows : i == 1 ? k_rows : v_rows, lora, lora_draw(ctx));
    dev.for_each(static_cast<std::size_t>(3 * s.g.head_elems()),
                 detail::ToRotatedHeads<T>{s.g, q_rows, k_rows, v_rows, rope.cos_t, rope.sin_t, s.q});
    detail::heads_attention(dev, "nn::RotaryAttention", s.heads_layout(), s.q, s.k, s.v, s.att, o, s.merged, ctx);
    detail::output_projection(dev, lora_, 3, p, MatView<const T>{s.merged, N, dim_}, p[3].data, bias(p, 3).data, y,
                              lora, lora_draw(ctx));
  }

  template <class Dev, class T>
  void own_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> dy,
                    MatView<T> dx, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::RotaryAttention", "gradients", grad.size(), p.size());
    detail::check_shape("nn::RotaryAttention", "output gradient", dy, x.rows, dim_);
    const std::int64_t N = x.rows, C = dim_, kv = kv_heads_ * head_dim(), T_ = s.g.time;
    const std::int64_t tt = T_ * T_, bh = s.g.batch * heads_;
    // workspace: d_merged [N, C] | d_o | d_att | d_q d_k d_v (heads layout) | dq dk dv rows | rope
    const std::size_t n_ws = static_cast<std::size_t>(5 * N * C + bh * tt + N * (C + 2 * kv)) + rope_elems<T>(s.g);
    T* d_merged = dev.template workspace<T>(n_ws);
    T* d_o = d_merged + N * C;
    T* d_att = d_o + N * C;
    T* d_q = d_att + bh * tt;
    T* d_k = d_q + N * C;
    T* d_v = d_k + N * C;
    T* dq_rows = d_v + N * C;
    T* dk_rows = dq_rows + N * C;
    T* dv_rows = dk_rows + N * kv;
    const Rope rope = rope_table(dev, s.g, reinterpret_cast<float*>(dv_rows + N * kv));

    T* lora = ctx.saved.data + own_saved(ctx.shape);
    detail::output_projection_backward(dev, lora_, 3, p, grad, MatView<const T>{s.merged, N, C}, dy, p[3].data, grad[3],
                                       bias(grad, 3), d_merged, lora, lora_draw(ctx));
    detail::heads_attention_backward(dev, s.heads_layout(), s.q, s.k, s.v, s.att, d_merged, d_o, d_att, d_q, d_k, d_v);
    dev.for_each(static_cast<std::size_t>(N * (C + 2 * kv)),
                 detail::FromRotatedHeads<T>{s.g, d_q, rope.cos_t, rope.sin_t, dq_rows, dk_rows, dv_rows});
    projections_backward(dev, p, grad, x, dq_rows, dk_rows, dv_rows, lora, dx, lora_draw(ctx));
  }

  std::size_t base_count() const { return 4 + (options_.qkv_bias ? 3 : 0) + (options_.out_bias ? 1 : 0); }
  std::int64_t own_saved(SeqShape s) const { return 4 * s.rows() * dim_ + s.batch * heads_ * s.time * s.time; }
  template <class T>
  std::int64_t fused_saved(SeqShape s) const {
    const std::int64_t kv = kv_heads_ * head_dim();
    return detail::float_aligned<T>(s.rows() * (2 * dim_ + 2 * kv)) + attention_stats_size<T>(s.batch, heads_, s.time);
  }

  struct Rope {
    const float* cos_t;
    const float* sin_t;
  };

  // From the gradients of the q, k, v projections' outputs (rows): their
  // parameters' gradients and the input's.
  template <class Dev, class T>
  void projections_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, const T* dq_rows,
                            const T* dk_rows, const T* dv_rows, T* lora, MatView<T> dx, LoraDraw draw) const {
    const std::int64_t N = x.rows, C = dim_, kv = kv_heads_ * head_dim();
    detail::projection_grads(dev, x, MatView<const T>{dq_rows, N, C}, grad[0], bias(grad, 0));
    detail::projection_grads(dev, x, MatView<const T>{dk_rows, N, kv}, grad[1], bias(grad, 1));
    detail::projection_grads(dev, x, MatView<const T>{dv_rows, N, kv}, grad[2], bias(grad, 2));
    if (!dx.empty()) {
      detail::check_shape("nn::RotaryAttention", "input gradient", dx, N, C);
      dev.gemm(false, false, N, C, C, 1.f, dq_rows, C, p[0].data, C, 0.f, dx.data, C);
      dev.gemm(false, false, N, C, kv, 1.f, dk_rows, kv, p[1].data, C, 1.f, dx.data, C);
      dev.gemm(false, false, N, C, kv, 1.f, dv_rows, kv, p[2].data, C, 1.f, dx.data, C);
    }
    lora_.backward(dev, 0, p, grad, x, dq_rows, lora, dx, draw);
    lora_.backward(dev, 1, p, grad, x, dk_rows, lora, dx, draw);
    lora_.backward(dev, 2, p, grad, x, dv_rows, lora, dx, draw);
  }

  // The fused path (device/fused_attention.hpp): q [N, dim] and k, v
  // [N, kv_heads hd] in the projections' rows, rotated in place; the
  // attention writes the merged heads [N, dim]. Kept: q, k, v, merged, and
  // the statistics (16-byte aligned after them).
  FusedAttentionShape fused_shape(SeqShape s) const {
    const std::int64_t hd = head_dim(), kv = kv_heads_ * hd;
    const AttentionStrides q{s.time * dim_, hd, dim_}, k{s.time * kv, hd, kv};
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
    check_call(p, x, ctx, saved_size_on<Dev, T>(dev, ctx.shape, dim_));
    const std::int64_t N = x.rows, kv = kv_heads_ * head_dim();
    T* q = ctx.saved.data;
    T* k = q + N * dim_;
    T* v = k + N * kv;
    T* merged = v + N * kv;
    return {q,
            k,
            v,
            merged,
            reinterpret_cast<float*>(q + detail::float_aligned<T>(N * (2 * dim_ + 2 * kv))),
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
    detail::check_shape("nn::RotaryAttention", "output", y, x.rows, dim_);
    const std::int64_t N = x.rows, kv = kv_heads_ * head_dim(), bt = detail::key_bias_size("nn::RotaryAttention", ctx);
    // workspace: key bias [B, 1, T, T] (with padding) | rope cos, sin
    T* bias_ws = dev.template workspace<T>(static_cast<std::size_t>(bt) + rope_elems<T>(s.g));
    const Rope rope = rope_table(dev, s.g, reinterpret_cast<float*>(bias_ws + bt));
    const T* kb = detail::key_bias(dev, "nn::RotaryAttention", ctx, bias_ws);
    detail::project(dev, x, p[0].data, bias(p, 0).data, s.q, dim_);
    detail::project(dev, x, p[1].data, bias(p, 1).data, s.k, kv);
    detail::project(dev, x, p[2].data, bias(p, 2).data, s.v, kv);
    for (std::size_t i = 0; i < 3; ++i)
      lora_.forward(dev, i, p, x, i == 0 ? s.q : i == 1 ? s.k : s.v, s.lora, lora_draw(ctx));
    rotate_rows(dev, s.g, rope, s.q, s.k, false);
    detail::fused_heads(dev, fused_shape(ctx.shape), kb, s.q, s.k, s.v, s.merged, s.stats);
    detail::output_projection(dev, lora_, 3, p, MatView<const T>{s.merged, N, dim_}, p[3].data, bias(p, 3).data, y,
                              s.lora, lora_draw(ctx));
  }

  template <class Dev, class T>
  void fused_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> dy,
                      MatView<T> dx, const UnitContext<T>& ctx) {
    const Fused<T> s = fused_parts(dev, p, x, ctx);
    detail::check_count("nn::RotaryAttention", "gradients", grad.size(), p.size());
    detail::check_shape("nn::RotaryAttention", "output gradient", dy, x.rows, dim_);
    const std::int64_t N = x.rows, C = dim_, kv = kv_heads_ * head_dim();
    const std::int64_t bt = detail::key_bias_size("nn::RotaryAttention", ctx);
    // workspace: key bias [B, 1, T, T] (with padding) | d_merged [N, C] | dq [N, C] | dk, dv [N, kv] | rope
    T* bias_ws = dev.template workspace<T>(static_cast<std::size_t>(bt + N * (2 * C + 2 * kv)) + rope_elems<T>(s.g));
    T* d_merged = bias_ws + bt;
    T* dq = d_merged + N * C;
    T* dk = dq + N * C;
    T* dv = dk + N * kv;
    const Rope rope = rope_table(dev, s.g, reinterpret_cast<float*>(dv + N * kv));
    const T* kb = detail::key_bias(dev, "nn::RotaryAttention", ctx, bias_ws);
    detail::output_projection_backward(dev, lora_, 3, p, grad, MatView<const T>{s.merged, N, C}, dy, p[3].data, grad[3],
                                       bias(grad, 3), d_merged, s.lora, lora_draw(ctx));
    detail::fused_heads_backward(dev, fused_shape(ctx.shape), kb, s.q, s.k, s.v, s.merged, d_merged, s.stats, dq, dk,
                                 dv);
    rotate_rows(dev, s.g, rope, dq, dk, true);  // the gradients of the projections' (unrotated) outputs
    projections_backward(dev, p, grad, x, dq, dk, dv, s.lora, dx, lora_draw(ctx));
  }

  template <class T>
  struct Parts {
    T* q;  // rotated queries, then k and v repeated to `heads`, in the head layout
    T* k;
    T* v;
    T* att;
    T* merged;
    detail::GqaShape g;
    HeadLayout heads_layout() const { return {g.batch, g.time, g.heads, g.head_dim, 1}; }
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
    auto addr = reinterpret_cast<std::uintptr_t>(at);
    addr = (addr + alignof(float) - 1) / alignof(float) * alignof(float);
    float* cos_t = reinterpret_cast<float*>(addr);
    const std::int64_t half = g.head_dim / 2;
    float* sin_t = cos_t + g.time * half;
    dev.for_each(static_cast<std::size_t>(g.time * half), detail::RopeTable{cos_t, sin_t, half, options_.rope_theta});
    return {cos_t, sin_t};
  }

  // The bias of projection `which` (q, k, v, o), or an empty view.
  template <class T>
  MatView<T> bias(UnitParams<T> p, int which) const {
    if (which < 3) return options_.qkv_bias ? p[static_cast<std::size_t>(4 + which)] : MatView<T>{};
    return options_.out_bias ? p[options_.qkv_bias ? 7u : 4u] : MatView<T>{};
  }

  // The checks every call makes; `want`: the saved elements the path needs.
  template <class T>
  void check_call(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx, std::int64_t want) const {
    detail::check_count("nn::RotaryAttention", "parameters", p.size(), base_count() + lora_.param_count());
    detail::check_shape("nn::RotaryAttention", "input", x, ctx.shape.rows(), dim_);
    detail::check_saved("nn::RotaryAttention", ctx.saved.size(), want,
                        "size the saved view with saved_size_of<T>(unit, device, shape, in)");
    if (options_.max_positions > 0 && ctx.shape.time > options_.max_positions)
      throw config_error("nn::RotaryAttention: a sequence of " + std::to_string(ctx.shape.time) +
                             " positions is longer than the model's " + std::to_string(options_.max_positions) +
                             " (max_position_embeddings)",
                         "cut the data into blocks of at most " + std::to_string(options_.max_positions) + " tokens");
  }

  template <class T>
  detail::GqaShape call_shape(const UnitContext<T>& ctx) const {
    const DeviceTensor* pos = detail::position_ids("nn::RotaryAttention", ctx);
    return {ctx.shape.batch,
            ctx.shape.time,
            heads_,
            kv_heads_,
            head_dim(),
            options_.rope_theta > 0.f,
            pos != nullptr ? pos->data<std::int64_t>() : nullptr};
  }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    check_call(p, x, ctx, saved_size(ctx.shape, dim_));
    const detail::GqaShape g = call_shape(ctx);
    const std::int64_t n = g.head_elems();
    T* q = ctx.saved.data;
    T* att = q + 3 * n;
    return {q, q + n, q + 2 * n, att, att + g.batch * heads_ * g.time * g.time, g};
  }

  std::int64_t dim_;
  std::int64_t heads_;
  std::int64_t kv_heads_;
  RotaryAttentionOptions options_;
  detail::LoraSet lora_;
};

}  // namespace dtrain::nn

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_ROTARY_ATTENTION_FUNCTORS(EACH, SUM, T) \
  EACH(::dtrain::nn::detail::ToRotatedHeads<T>)        \
  EACH(::dtrain::nn::detail::FromRotatedHeads<T>)      \
  EACH(::dtrain::nn::detail::RotatePairs<T>)

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/rotary_attention.ipp"
#endif
