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

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/matrix.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/checks.hpp"

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
    const auto inv_freq = static_cast<float>(1.0 / ::pow(static_cast<double>(theta),
                                                         static_cast<double>(2 * i) / static_cast<double>(2 * half)));
    const double angle = static_cast<double>(static_cast<float>(t) * inv_freq);
    cos_out[n] = static_cast<float>(::cos(angle));
    sin_out[n] = static_cast<float>(::sin(angle));
  }
};

// The shapes of one call: q has `heads`, k and v `kv_heads`, all head_dim wide.
struct GqaShape {
  std::int64_t batch, time, heads, kv_heads, head_dim;
  bool rope;
  DTRAIN_HOST_DEVICE std::int64_t rows() const { return batch * time; }
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
    const T* row = (part == 0 ? q_rows : part == 1 ? k_rows : v_rows) + (b * s.time + t) * width + src_head * s.head_dim;
    float out = static_cast<float>(row[d]);
    if (s.rope && part < 2) {
      const std::int64_t half = s.head_dim / 2, f = d % half;
      const float c = cos_t[t * half + f], sn = sin_t[t * half + f];
      out = d < half ? out * c - static_cast<float>(row[d + half]) * sn : out * c + static_cast<float>(row[d - half]) * sn;
    }
    q[n] = dtype_cast<T>(out);
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
    const float c = cos_t[t * half + f], sn = sin_t[t * half + f];
    // forward: a' = a c - b s, b' = b c + a s  =>  da = da' c + db' s, db = db' c - da' s
    return d < half ? static_cast<float>(head_row[d]) * c + static_cast<float>(head_row[d + half]) * sn
                    : static_cast<float>(head_row[d]) * c - static_cast<float>(head_row[d - half]) * sn;
  }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t q_cols = s.heads * s.head_dim, kv_cols = s.kv_heads * s.head_dim;
    const std::int64_t cols = q_cols + 2 * kv_cols, row = n / cols, col = n % cols;
    const std::int64_t b = row / s.time, t = row % s.time;
    const auto head_row = [&](const T* base, std::int64_t h) {
      return base + ((b * s.heads + h) * s.time + t) * s.head_dim;
    };
    if (col < q_cols) {
      dq_rows[row * q_cols + col] = dtype_cast<T>(unrotate(head_row(dq, col / s.head_dim), t, col % s.head_dim));
      return;
    }
    const bool is_k = col < q_cols + kv_cols;
    const std::int64_t c = col - q_cols - (is_k ? 0 : kv_cols), kvh = c / s.head_dim, d = c % s.head_dim;
    const T* base = dq + (is_k ? 1 : 2) * s.head_elems();
    float sum = 0.f;
    for (std::int64_t h = kvh * s.group(); h < (kvh + 1) * s.group(); ++h)
      sum += is_k ? unrotate(head_row(base, h), t, d) : static_cast<float>(head_row(base, h)[d]);
    (is_k ? dk_rows : dv_rows)[row * kv_cols + c] = dtype_cast<T>(sum);
  }
};

}  // namespace detail

struct RotaryAttentionOptions {
  std::int64_t kv_heads = 0;  // 0: as many as query heads (multi-head attention); 1: multi-query
  float rope_theta = 10000.f; // 0: no rotary embedding
  bool qkv_bias = false;      // Qwen2-style biases on q, k and v
  bool out_bias = false;
  float init_std = 0.02f;     // weights ~ N(0, init_std); biases 0
  std::int64_t max_positions = 0;  // > 0: longer sequences are an error (max_position_embeddings)
  bool trainable = true;
};

class RotaryAttention {
 public:
  RotaryAttention(std::int64_t dim, std::int64_t heads, RotaryAttentionOptions options = {})
      : dim_(dim), heads_(heads), kv_heads_(options.kv_heads == 0 ? heads : options.kv_heads), options_(options) {
    const std::string what = "nn::RotaryAttention(" + std::to_string(dim) + ", " + std::to_string(heads) + ")";
    if (dim < 1 || heads < 1 || dim % heads != 0)
      throw config_error(what + ": the width must be a positive multiple of the head count",
                         "choose dim = heads x head_dim, e.g. 128 with 4 heads");
    if (kv_heads_ < 1 || heads % kv_heads_ != 0)
      throw config_error(what + ": kv_heads " + std::to_string(options.kv_heads) + " does not divide the heads",
                         "give num_key_value_heads dividing num_attention_heads (1 for multi-query)");
    if (options.rope_theta < 0.f || (options.rope_theta > 0.f && head_dim() % 2 != 0))
      throw config_error(what + ": rotary embedding needs an even head_dim and rope_theta >= 0",
                         "use an even head_dim, or rope_theta = 0 for no rotary embedding");
  }

  std::int64_t dim() const { return dim_; }
  std::int64_t heads() const { return heads_; }
  std::int64_t kv_heads() const { return kv_heads_; }
  std::int64_t head_dim() const { return dim_ / heads_; }

  std::vector<ParamSpec> params() const {
    const Init w = Init::normal(0.f, options_.init_std);
    const std::int64_t hd = head_dim(), kv = kv_heads_ * hd;
    std::vector<ParamSpec> p{{"q.weight", {dim_, dim_}, w, options_.trainable},
                             {"k.weight", {kv, dim_}, w, options_.trainable},
                             {"v.weight", {kv, dim_}, w, options_.trainable},
                             {"o.weight", {dim_, dim_}, w, options_.trainable}};
    if (options_.qkv_bias) {
      p.push_back({"q.bias", {dim_}, Init::zeros(), options_.trainable, {}, {"bias"}});
      p.push_back({"k.bias", {kv}, Init::zeros(), options_.trainable, {}, {"bias"}});
      p.push_back({"v.bias", {kv}, Init::zeros(), options_.trainable, {}, {"bias"}});
    }
    if (options_.out_bias) p.push_back({"o.bias", {dim_}, Init::zeros(), options_.trainable, {}, {"bias"}});
    return p;
  }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::RotaryAttention", in, dim_); }

  std::int64_t saved_size(SeqShape s, std::int64_t) const { return 4 * s.rows() * dim_ + s.batch * heads_ * s.time * s.time; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
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
    dev.for_each(static_cast<std::size_t>(3 * s.g.head_elems()),
                 detail::ToRotatedHeads<T>{s.g, q_rows, k_rows, v_rows, rope.cos_t, rope.sin_t, s.q});
    const std::int64_t T_ = s.g.time, hd = head_dim(), tt = T_ * T_, th = T_ * hd, bh = s.g.batch * heads_;
    dev.gemm_batched(false, true, T_, T_, hd, 1.f / std::sqrt(static_cast<float>(hd)), s.q, hd, th, s.k, hd, th, 0.f,
                     s.att, T_, tt, bh);
    detail::attention_softmax(dev, "nn::RotaryAttention", s.att, heads_, ctx);
    dev.gemm_batched(false, false, T_, hd, T_, 1.f, s.att, T_, tt, s.v, hd, th, 0.f, o, hd, th, bh);
    detail::permute_heads(dev, s.heads_layout(), o, s.merged, false);
    detail::project(dev, MatView<const T>{s.merged, N, dim_}, p[3].data, bias(p, 3).data, y.data, dim_);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::RotaryAttention", "gradients", grad.size(), p.size());
    detail::check_shape("nn::RotaryAttention", "output gradient", dy, x.rows, dim_);
    const std::int64_t N = x.rows, C = dim_, kv = kv_heads_ * head_dim(), T_ = s.g.time, hd = head_dim();
    const std::int64_t tt = T_ * T_, th = T_ * hd, bh = s.g.batch * heads_;
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

    dev.gemm(false, false, N, C, C, 1.f, dy.data, C, p[3].data, C, 0.f, d_merged, C);
    detail::projection_grads(dev, MatView<const T>{s.merged, N, C}, dy, grad[3], bias(grad, 3));
    detail::permute_heads(dev, s.heads_layout(), d_merged, d_o, true);
    dev.gemm_batched(false, true, T_, T_, hd, 1.f, d_o, hd, th, s.v, hd, th, 0.f, d_att, T_, tt, bh);
    dev.gemm_batched(true, false, T_, hd, T_, 1.f, s.att, T_, tt, d_o, hd, th, 0.f, d_v, hd, th, bh);
    dev.for_each(static_cast<std::size_t>(bh * T_),
                 CausalSoftmaxBackward<T>{s.att, d_att, T_, 1.f / std::sqrt(static_cast<float>(hd))});
    dev.gemm_batched(false, false, T_, hd, T_, 1.f, d_att, T_, tt, s.k, hd, th, 0.f, d_q, hd, th, bh);
    dev.gemm_batched(true, false, T_, hd, T_, 1.f, d_att, T_, tt, s.q, hd, th, 0.f, d_k, hd, th, bh);
    dev.for_each(static_cast<std::size_t>(N * (C + 2 * kv)),
                 detail::FromRotatedHeads<T>{s.g, d_q, rope.cos_t, rope.sin_t, dq_rows, dk_rows, dv_rows});
    detail::projection_grads(dev, x, MatView<const T>{dq_rows, N, C}, grad[0], bias(grad, 0));
    detail::projection_grads(dev, x, MatView<const T>{dk_rows, N, kv}, grad[1], bias(grad, 1));
    detail::projection_grads(dev, x, MatView<const T>{dv_rows, N, kv}, grad[2], bias(grad, 2));
    if (!dx.empty()) {
      detail::check_shape("nn::RotaryAttention", "input gradient", dx, N, C);
      dev.gemm(false, false, N, C, C, 1.f, dq_rows, C, p[0].data, C, 0.f, dx.data, C);
      dev.gemm(false, false, N, C, kv, 1.f, dk_rows, kv, p[1].data, C, 1.f, dx.data, C);
      dev.gemm(false, false, N, C, kv, 1.f, dv_rows, kv, p[2].data, C, 1.f, dx.data, C);
    }
  }

 private:
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

  struct Rope {
    const float* cos_t;
    const float* sin_t;
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

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    const std::size_t want = 4 + (options_.qkv_bias ? 3 : 0) + (options_.out_bias ? 1 : 0);
    detail::check_count("nn::RotaryAttention", "parameters", p.size(), want);
    detail::check_shape("nn::RotaryAttention", "input", x, ctx.shape.rows(), dim_);
    if (ctx.saved.size() < saved_size(ctx.shape, dim_))
      throw config_error("nn::RotaryAttention: " + std::to_string(ctx.saved.size()) + " saved elements for " +
                             std::to_string(saved_size(ctx.shape, dim_)),
                         "pass the unit a UnitContext whose saved view holds saved_size(shape) elements");
    if (options_.max_positions > 0 && ctx.shape.time > options_.max_positions)
      throw config_error("nn::RotaryAttention: a sequence of " + std::to_string(ctx.shape.time) +
                             " positions is longer than the model's " + std::to_string(options_.max_positions) +
                             " (max_position_embeddings)",
                         "cut the data into blocks of at most " + std::to_string(options_.max_positions) + " tokens");
    const detail::GqaShape g{ctx.shape.batch, ctx.shape.time, heads_, kv_heads_, head_dim(), options_.rope_theta > 0.f};
    const std::int64_t n = g.head_elems();
    T* q = ctx.saved.data;
    T* att = q + 3 * n;
    return {q, q + n, q + 2 * n, att, att + g.batch * heads_ * g.time * g.time, g};
  }

  std::int64_t dim_;
  std::int64_t heads_;
  std::int64_t kv_heads_;
  RotaryAttentionOptions options_;
};

}  // namespace dtrain::nn
