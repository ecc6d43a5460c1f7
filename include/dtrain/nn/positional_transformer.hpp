#pragma once
// Transformer layers whose queries and keys carry a position embedding added
// at every layer, as DETR and LeRobot's ACT build them (the values do not):
//
// nn::MultiheadAttention(dim, heads, dropout): torch.nn.MultiheadAttention's
//   parameters and arithmetic with separate query, key and value inputs:
//     q, k, v = q_in Wq^T + bq, k_in Wk^T + bk, v_in Wv^T + bv
//     (Wq | Wk | Wv = in_proj_weight [3 dim, dim], in_proj_bias [3 dim])
//     per (batch, head): A = softmax(q k^T / sqrt(head_dim)) over the keys
//     the key mask keeps, then dropout on A in training, o = A v
//     out = concat_heads(o) out_proj.weight^T + out_proj.bias
//   A part of the layers below, not a unit: the callers give it their
//   queries' and keys' lengths, its saved view and its backward scratch.
//   It runs on the attention family's kernels (kernels/sequence.hpp: the
//   head permutations, MaskedSoftmax, SoftmaxRowsBackward) and the device's
//   batched GEMM.
//
// nn::PositionalEncoderLayer (LeRobot's ACTEncoderLayer, DETR's encoder layer)
//   post-norm:  h = norm1(x + drop(attn(x + pos, x + pos, x)))
//               y = norm2(h + drop(ffn(h)))
//   pre-norm:   r = x + drop(attn(n + pos, n + pos, n)), n = norm1(x)
//               y = r + drop(ffn(norm2(r)))
//   ffn(h) = linear2(drop(act(linear1(h)))), act ReLU or GELU (erf).
//   Parameters (PyTorch's names and order): self_attn.in_proj_weight,
//   self_attn.in_proj_bias, self_attn.out_proj.weight, self_attn.out_proj.bias,
//   linear1.weight, linear1.bias, linear2.weight, linear2.bias, norm1.weight,
//   norm1.bias, norm2.weight, norm2.bias.
//
// nn::PositionalDecoderLayer (ACTDecoderLayer): self-attention over the
//   decoder's tokens x (queries and keys x + query_pos), cross-attention
//   from them (queries + query_pos) to the memory (keys memory + memory_pos,
//   values memory), then the feed-forward block; norm1..norm3 after each
//   (post-norm) or before (pre-norm). Parameters: self_attn.*,
//   multihead_attn.*, linear1.*, linear2.*, norm1.*, norm2.*, norm3.*.
//
// Like nn::MultiheadAttention the layers are parts: the units that hold them
// (models/act.hpp) lay out their inputs as [batch * time, dim] rows and give
// them a saved view of saved_size(...) elements, which must outlive forward
// until backward, and a scratch view of scratch_size(...) for backward.
// Backward overwrites every gradient it is given (parameter gradients whose
// data is null are skipped: frozen) and returns the input's and the
// positions' gradients separately.
//
// Dropout draws from the layer's random stream and the element index
// (nn::Dropout's rule), so backward and a recomputed forward see the same
// mask; it is the identity outside training.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/matrix.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/dropout.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::nn {

namespace detail {

// dst[i] += src[i], in fp32 and rounded once.
template <Dtype T>
struct AccumulateElements {
  const T* src;
  T* dst;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    dst[i] = dtype_cast<T>(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
  }
};

// out[i] = a[i] + b[i] + c[i] (c may be null).
template <Dtype T>
struct AddThree {
  const T* a;
  const T* b;
  const T* c;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    float v = static_cast<float>(a[i]) + static_cast<float>(b[i]);
    if (c != nullptr) v += static_cast<float>(c[i]);
    out[i] = dtype_cast<T>(v);
  }
};

// out[i] = skip[i] + dropped(branch)[i]: a residual connection after dropout
// (p == 0: no dropout).
template <Dtype T>
struct DropoutResidual {
  const T* skip;
  const T* branch;
  T* out;
  std::uint64_t stream;
  float p, scale;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    float b = static_cast<float>(branch[i]);
    if (p > 0.f) b = dtrain::detail::uniform01(stream, i) >= p ? b * scale : 0.f;
    out[i] = dtype_cast<T>(static_cast<float>(skip[i]) + b);
  }
};

// out = dropout(in) with the mask of `stream` (in place allowed); p == 0 copies.
template <class Dev, class T>
void drop(Dev& dev, const T* in, T* out, std::int64_t n, std::uint64_t stream, float p) {
  if (p > 0.f)
    dev.for_each(static_cast<std::size_t>(n), DropoutApply<T>{in, out, stream, p, 1.f / (1.f - p)});
  else if (in != out)
    dev.for_each(static_cast<std::size_t>(n), detail::CopyElements<T>{in, out});
}

template <class Dev, class T>
void add(Dev& dev, const T* a, const T* b, T* out, std::int64_t n) {
  dev.for_each(static_cast<std::size_t>(n), AddElements<T>{a, b, out});
}

template <class Dev, class T>
void accumulate(Dev& dev, const T* src, T* dst, std::int64_t n) {
  dev.for_each(static_cast<std::size_t>(n), AccumulateElements<T>{src, dst});
}

// The dropout streams of one layer: site k of stream s.
inline std::uint64_t site(std::uint64_t stream, std::uint64_t k) { return dtrain::detail::derive_stream(stream, k); }

}  // namespace detail

// The lengths of one attention: batch sequences of q_time queries against
// k_time keys.
struct AttentionDims {
  std::int64_t batch = 1;
  std::int64_t q_time = 1;
  std::int64_t k_time = 1;
};

class MultiheadAttention {
 public:
  MultiheadAttention(std::int64_t dim, std::int64_t heads, float dropout = 0.f)
      : dim_(dim), heads_(heads), dropout_(dropout) {
    if (dim <= 0 || heads <= 0 || dim % heads != 0)
      throw config_error(
          "nn::MultiheadAttention: dim " + std::to_string(dim) + " is not a multiple of heads " + std::to_string(heads),
          "choose a dim that the head count divides (dim_model % n_heads == 0)");
    if (!(dropout >= 0.f && dropout < 1.f))
      throw config_error("nn::MultiheadAttention: dropout " + std::to_string(dropout) + " is not in [0, 1)",
                         "give a dropout probability below 1");
  }

  std::int64_t dim() const { return dim_; }
  std::int64_t heads() const { return heads_; }

  // torch's init, then ACT's xavier_uniform on every matrix.
  std::vector<ParamSpec> params() const {
    const float in_bound = std::sqrt(6.f / static_cast<float>(4 * dim_));
    const float out_bound = std::sqrt(6.f / static_cast<float>(2 * dim_));
    return {{"in_proj_weight", {3 * dim_, dim_}, Init::uniform(-in_bound, in_bound)},
            {"in_proj_bias", {3 * dim_}, Init::zeros(), true, {}, {"bias"}},
            {"out_proj.weight", {dim_, dim_}, Init::uniform(-out_bound, out_bound)},
            {"out_proj.bias", {dim_}, Init::zeros(), true, {}, {"bias"}}};
  }

  // q, k, v in the head layout, the probabilities (and their dropped copy in
  // training with dropout), the merged heads, and a rows buffer.
  std::int64_t saved_size(AttentionDims d) const {
    const std::int64_t q = d.batch * d.q_time * dim_, k = d.batch * d.k_time * dim_;
    const std::int64_t att = d.batch * heads_ * d.q_time * d.k_time;
    return 2 * q + 2 * k + att * (dropout_ > 0.f ? 2 : 1) + std::max(q, k);
  }
  std::int64_t scratch_size(AttentionDims d) const {
    const std::int64_t q = d.batch * d.q_time * dim_, k = d.batch * d.k_time * dim_;
    return 3 * q + 4 * k + d.batch * heads_ * d.q_time * d.k_time;
  }

  // key_keep: [batch, k_time] int32, 0 leaves a key out; null keeps all.
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, AttentionDims d, const T* q_in, const T* k_in, const T* v_in,
               const std::int32_t* key_keep, T* out, T* saved, bool training, std::uint64_t stream) const {
    const Saved<T> s = carve(saved, d);
    const std::int64_t rq = d.batch * d.q_time, rk = d.batch * d.k_time, hd = dim_ / heads_;
    const T* w = p[0].data;
    const T* b = p[1].data;
    project(dev, q_in, rq, w, b, s.rows);
    heads(dev, d.batch, d.q_time, s.rows, s.q, true);
    project(dev, k_in, rk, w + dim_ * dim_, b + dim_, s.rows);
    heads(dev, d.batch, d.k_time, s.rows, s.k, true);
    project(dev, v_in, rk, w + 2 * dim_ * dim_, b + 2 * dim_, s.rows);
    heads(dev, d.batch, d.k_time, s.rows, s.v, true);
    const std::int64_t bh = d.batch * heads_, a = d.q_time * d.k_time;
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    dev.gemm_batched(false, true, d.q_time, d.k_time, hd, scale, s.q, hd, d.q_time * hd, s.k, hd, d.k_time * hd, 0.f,
                     s.att, d.k_time, a, bh);
    dev.for_each(static_cast<std::size_t>(bh * d.q_time),
                 MaskedSoftmax<T, std::int32_t>{s.att, d.q_time, d.k_time, key_keep, heads_, nullptr});
    const T* probs = s.att;
    if (training && dropout_ > 0.f) {
      detail::drop(dev, s.att, s.dropped, bh * a, stream, dropout_);
      probs = s.dropped;
    }
    // o (head layout) in the rows buffer, then merged into rows
    dev.gemm_batched(false, false, d.q_time, hd, d.k_time, 1.f, probs, d.k_time, a, s.v, hd, d.k_time * hd, 0.f, s.rows,
                     hd, d.q_time * hd, bh);
    heads(dev, d.batch, d.q_time, s.rows, s.merged, false);
    broadcast_row(dev, p[3].data, MatView<T>{out, rq, dim_});
    dev.gemm(false, true, rq, dim_, dim_, 1.f, s.merged, dim_, p[2].data, dim_, 1.f, out, dim_);
  }

  // d_q_in, d_k_in, d_v_in [rows, dim] are overwritten (each may be null).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, AttentionDims d, const T* q_in, const T* k_in,
                const T* v_in, const T* d_out, T* d_q_in, T* d_k_in, T* d_v_in, const T* saved, T* scratch,
                bool training, std::uint64_t stream) const {
    const Saved<const T> s = carve(saved, d);
    const std::int64_t rq = d.batch * d.q_time, rk = d.batch * d.k_time, hd = dim_ / heads_;
    const std::int64_t bh = d.batch * heads_, a = d.q_time * d.k_time, qt = d.q_time * hd, kt = d.k_time * hd;
    detail::Carve<T> c(scratch);
    T* rows_q = c.take(rq * dim_);
    T* d_o = c.take(rq * dim_);
    T* dq = c.take(rq * dim_);
    T* dk = c.take(rk * dim_);
    T* dv = c.take(rk * dim_);
    T* rows_k = c.take(rk * dim_);
    T* rows_v = c.take(rk * dim_);
    T* d_att = c.take(bh * a);
    // out = merged Wo^T + bo
    if (!grad[2].empty())
      dev.gemm(true, false, dim_, dim_, rq, 1.f, d_out, dim_, s.merged, dim_, 0.f, grad[2].data, dim_);
    if (!grad[3].empty()) column_sum(dev, MatView<const T>{d_out, rq, dim_}, grad[3].data);
    dev.gemm(false, false, rq, dim_, dim_, 1.f, d_out, dim_, p[2].data, dim_, 0.f, rows_q, dim_);
    heads(dev, d.batch, d.q_time, rows_q, d_o, true);
    const bool dropped = training && dropout_ > 0.f;
    const T* probs = dropped ? s.dropped : s.att;
    dev.gemm_batched(false, true, d.q_time, d.k_time, hd, 1.f, d_o, hd, qt, s.v, hd, kt, 0.f, d_att, d.k_time, a, bh);
    dev.gemm_batched(true, false, d.k_time, hd, d.q_time, 1.f, probs, d.k_time, a, d_o, hd, qt, 0.f, dv, hd, kt, bh);
    if (dropped) detail::drop(dev, d_att, d_att, bh * a, stream, dropout_);
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    dev.for_each(static_cast<std::size_t>(bh * d.q_time), SoftmaxRowsBackward<T>{s.att, d_att, d.k_time, scale});
    dev.gemm_batched(false, false, d.q_time, hd, d.k_time, 1.f, d_att, d.k_time, a, s.k, hd, kt, 0.f, dq, hd, qt, bh);
    dev.gemm_batched(true, false, d.k_time, hd, d.q_time, 1.f, d_att, d.k_time, a, s.q, hd, qt, 0.f, dk, hd, kt, bh);
    heads(dev, d.batch, d.q_time, dq, rows_q, false);
    heads(dev, d.batch, d.k_time, dk, rows_k, false);
    heads(dev, d.batch, d.k_time, dv, rows_v, false);
    const T* w = p[0].data;
    const T* ins[3] = {q_in, k_in, v_in};
    const T* drows[3] = {rows_q, rows_k, rows_v};
    T* dins[3] = {d_q_in, d_k_in, d_v_in};
    const std::int64_t counts[3] = {rq, rk, rk};
    for (int i = 0; i < 3; ++i) {
      if (!grad[0].empty())
        dev.gemm(true, false, dim_, dim_, counts[i], 1.f, drows[i], dim_, ins[i], dim_, 0.f,
                 grad[0].data + i * dim_ * dim_, dim_);
      if (!grad[1].empty()) column_sum(dev, MatView<const T>{drows[i], counts[i], dim_}, grad[1].data + i * dim_);
      if (dins[i] != nullptr)
        dev.gemm(false, false, counts[i], dim_, dim_, 1.f, drows[i], dim_, w + i * dim_ * dim_, dim_, 0.f, dins[i],
                 dim_);
    }
  }

 private:
  template <class T>
  struct Saved {
    T* q;
    T* k;
    T* v;
    T* att;
    T* dropped;
    T* merged;
    T* rows;
  };
  template <class T>
  Saved<T> carve(T* at, AttentionDims d) const {
    const std::int64_t q = d.batch * d.q_time * dim_, k = d.batch * d.k_time * dim_;
    const std::int64_t att = d.batch * heads_ * d.q_time * d.k_time;
    Saved<T> s{};
    s.q = at;
    s.k = s.q + q;
    s.v = s.k + k;
    s.att = s.v + k;
    s.dropped = s.att + att;
    s.merged = s.dropped + (dropout_ > 0.f ? att : 0);
    s.rows = s.merged + q;
    return s;
  }

  // out [rows, dim] = in W^T + b, W [dim, dim] a slice of in_proj_weight.
  template <class Dev, class T>
  void project(Dev& dev, const T* in, std::int64_t rows, const T* w, const T* b, T* out) const {
    broadcast_row(dev, b, MatView<T>{out, rows, dim_});
    dev.gemm(false, true, rows, dim_, dim_, 1.f, in, dim_, w, dim_, 1.f, out, dim_);
  }
  template <class Dev, class T>
  void heads(Dev& dev, std::int64_t batch, std::int64_t time, const T* src, T* dst, bool to_heads) const {
    detail::permute_heads(dev, HeadLayout{batch, time, heads_, dim_ / heads_, 1}, src, dst, to_heads);
  }

  std::int64_t dim_;
  std::int64_t heads_;
  float dropout_;
};

// The feed-forward activation of the positional layers.
enum class ffn_activation { relu, gelu };

struct PositionalLayerOptions {
  std::int64_t dim = 512;
  std::int64_t heads = 8;
  std::int64_t feedforward = 2048;
  float dropout = 0.f;
  bool pre_norm = false;
  ffn_activation activation = ffn_activation::relu;
};

namespace detail {

// linear2(drop(act(linear1(h)))) with its own saved rows; shared by both layers.
class PositionalFfn {
 public:
  explicit PositionalFfn(const PositionalLayerOptions& o)
      : o_(o), l1_(o.dim, o.feedforward), l2_(o.feedforward, o.dim) {
    const float b1 = std::sqrt(6.f / static_cast<float>(o.dim + o.feedforward));
    l1_spec_ = l1_.params();
    l2_spec_ = l2_.params();
    l1_spec_[0].init = Init::uniform(-b1, b1);
    l2_spec_[0].init = Init::uniform(-b1, b1);
  }
  void append(std::vector<ParamSpec>& out) const {
    append_params(out, "linear1", l1_spec_);
    append_params(out, "linear2", l2_spec_);
  }
  // f1 = linear1(h), g = act(f1), gd = drop(g)
  std::int64_t saved_size(std::int64_t rows) const { return rows * o_.feedforward * (o_.dropout > 0.f ? 3 : 2); }
  std::int64_t scratch_size(std::int64_t rows) const { return 2 * rows * o_.feedforward; }

  // p: linear1.weight, linear1.bias, linear2.weight, linear2.bias
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, const T* h, std::int64_t rows, T* out, T* saved, bool training,
               std::uint64_t stream) {
    const std::int64_t n = rows * o_.feedforward;
    T* f1 = saved;
    T* g = f1 + n;
    T* gd = o_.dropout > 0.f ? g + n : g;
    l1_.forward<Dev, T>(dev, p.subspan(0, 2), {h, rows, o_.dim}, {f1, rows, o_.feedforward});
    activate(dev, f1, g, n);
    if (training && o_.dropout > 0.f)
      drop(dev, g, gd, n, stream, o_.dropout);
    else if (gd != g)
      dev.for_each(static_cast<std::size_t>(n), detail::CopyElements<T>{g, gd});
    l2_.forward<Dev, T>(dev, p.subspan(2, 2), {gd, rows, o_.feedforward}, {out, rows, o_.dim});
  }

  // d_h overwritten.
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, const T* h, std::int64_t rows, const T* d_out,
                T* d_h, const T* saved, T* scratch, bool training, std::uint64_t stream) {
    const std::int64_t n = rows * o_.feedforward;
    const T* f1 = saved;
    const T* g = f1 + n;
    const T* gd = o_.dropout > 0.f ? g + n : g;
    T* d_g = scratch;
    T* d_f1 = scratch + n;
    l2_.backward<Dev, T>(dev, p.subspan(2, 2), grad.subspan(2, 2), {gd, rows, o_.feedforward}, {},
                         {d_out, rows, o_.dim}, {d_g, rows, o_.feedforward});
    if (training && o_.dropout > 0.f) drop(dev, d_g, d_g, n, stream, o_.dropout);
    if (o_.activation == ffn_activation::relu)
      ReLU{}.backward<Dev, T>(dev, {}, {}, MatView<const T>{f1, rows, o_.feedforward},
                              MatView<const T>{g, rows, o_.feedforward}, MatView<const T>{d_g, rows, o_.feedforward},
                              MatView<T>{d_f1, rows, o_.feedforward});
    else
      GELU{}.backward<Dev, T>(dev, {}, {}, MatView<const T>{f1, rows, o_.feedforward},
                              MatView<const T>{g, rows, o_.feedforward}, MatView<const T>{d_g, rows, o_.feedforward},
                              MatView<T>{d_f1, rows, o_.feedforward});
    l1_.backward<Dev, T>(dev, p.subspan(0, 2), grad.subspan(0, 2), {h, rows, o_.dim}, {}, {d_f1, rows, o_.feedforward},
                         {d_h, rows, o_.dim});
  }

 private:
  template <class Dev, class T>
  void activate(Dev& dev, const T* in, T* out, std::int64_t n) {
    const MatView<const T> x{in, n, 1};
    if (o_.activation == ffn_activation::relu)
      ReLU{}.forward<Dev, T>(dev, {}, x, MatView<T>{out, n, 1});
    else
      GELU{}.forward<Dev, T>(dev, {}, x, MatView<T>{out, n, 1});
  }

  PositionalLayerOptions o_;
  Linear l1_;
  Linear l2_;
  std::vector<ParamSpec> l1_spec_;
  std::vector<ParamSpec> l2_spec_;
};

inline void check_layer_options(const char* unit, const PositionalLayerOptions& o) {
  if (o.feedforward <= 0)
    throw config_error(std::string(unit) + ": feed-forward size " + std::to_string(o.feedforward) + " is not positive",
                       "give dim_feedforward > 0");
}

}  // namespace detail

class PositionalEncoderLayer {
 public:
  explicit PositionalEncoderLayer(PositionalLayerOptions o)
      : o_(o), attn_(o.dim, o.heads, o.dropout), ffn_(o), norm1_(o.dim), norm2_(o.dim) {
    detail::check_layer_options("nn::PositionalEncoderLayer", o);
  }

  const PositionalLayerOptions& options() const { return o_; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "self_attn", attn_.params());
    ffn_.append(out);
    detail::append_params(out, "norm1", norm1_.params());
    detail::append_params(out, "norm2", norm2_.params());
    return out;
  }

  // qk = (pre-norm: n1) + pos, the attention's, r1, h (post: norm1(r1);
  // pre: norm2(r1)), the FFN's, r2 (post) and n1 (pre), f2.
  std::int64_t saved_size(std::int64_t batch, std::int64_t time) const {
    const std::int64_t rows = batch * time, n = rows * o_.dim;
    return 5 * n + attn_.saved_size({batch, time, time}) + ffn_.saved_size(rows);
  }
  std::int64_t scratch_size(std::int64_t batch, std::int64_t time) const {
    const std::int64_t rows = batch * time, n = rows * o_.dim;
    return 4 * n + std::max(n + attn_.scratch_size({batch, time, time}), ffn_.scratch_size(rows));
  }

  // x, pos, y [batch * time, dim]; key_keep [batch, time] or null.
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, std::int64_t batch, std::int64_t time, const T* x, const T* pos,
               const std::int32_t* key_keep, T* y, T* saved, bool training, std::uint64_t stream) {
    const std::int64_t rows = batch * time, n = rows * o_.dim;
    const Saved<T> s = carve(saved, batch, time);
    const auto pa = p.subspan(0, 4), pf = p.subspan(4, 4), pn1 = p.subspan(8, 2), pn2 = p.subspan(10, 2);
    const float drop = training ? o_.dropout : 0.f;
    const T* attn_in = x;
    if (o_.pre_norm) {
      norm1_.forward<Dev, T>(dev, pn1, {x, rows, o_.dim}, {s.n1, rows, o_.dim});
      attn_in = s.n1;
    }
    detail::add(dev, attn_in, pos, s.qk, n);
    attn_.forward<Dev, T>(dev, pa, {batch, time, time}, s.qk, s.qk, attn_in, key_keep, s.f2, s.attn, training,
                          detail::site(stream, 0));
    dev.for_each(static_cast<std::size_t>(n),
                 detail::DropoutResidual<T>{x, s.f2, s.r1, detail::site(stream, 1), drop, 1.f / (1.f - drop)});
    if (o_.pre_norm)
      norm2_.forward<Dev, T>(dev, pn2, {s.r1, rows, o_.dim}, {s.h, rows, o_.dim});
    else
      norm1_.forward<Dev, T>(dev, pn1, {s.r1, rows, o_.dim}, {s.h, rows, o_.dim});
    ffn_.forward<Dev, T>(dev, pf, s.h, rows, s.f2, s.ffn, training, detail::site(stream, 2));
    const T* skip = o_.pre_norm ? s.r1 : s.h;
    T* r2 = o_.pre_norm ? y : s.r2;
    dev.for_each(static_cast<std::size_t>(n),
                 detail::DropoutResidual<T>{skip, s.f2, r2, detail::site(stream, 3), drop, 1.f / (1.f - drop)});
    if (!o_.pre_norm) norm2_.forward<Dev, T>(dev, pn2, {s.r2, rows, o_.dim}, {y, rows, o_.dim});
  }

  // dx and d_pos [rows, dim] overwritten (d_pos may be null).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, std::int64_t batch, std::int64_t time, const T* x,
                const T* pos, const std::int32_t* key_keep, const T* y, const T* dy, T* dx, T* d_pos, T* saved,
                T* scratch, bool training, std::uint64_t stream) {
    (void)pos;
    (void)key_keep;
    const std::int64_t rows = batch * time, n = rows * o_.dim;
    const Saved<T> s = carve(saved, batch, time);
    const auto pa = p.subspan(0, 4), pf = p.subspan(4, 4), pn1 = p.subspan(8, 2), pn2 = p.subspan(10, 2);
    const auto ga = grad.subspan(0, 4), gf = grad.subspan(4, 4), gn1 = grad.subspan(8, 2), gn2 = grad.subspan(10, 2);
    const float drop = training ? o_.dropout : 0.f;
    detail::Carve<T> c(scratch);
    T* d_r2 = c.take(n);  // the gradient at the second residual's output
    T* d_h = c.take(n);
    T* d_r1 = c.take(n);
    T* d_q = c.take(n);
    T* rest = c.take(0);
    // second residual and its norm
    if (o_.pre_norm) {
      dev.for_each(static_cast<std::size_t>(n), detail::CopyElements<T>{dy, d_r2});
    } else {
      norm2_.backward<Dev, T>(dev, pn2, gn2, {s.r2, rows, o_.dim}, {y, rows, o_.dim}, {dy, rows, o_.dim},
                              {d_r2, rows, o_.dim});
    }
    // branch: f2 = ffn(h), dropped
    detail::drop(dev, d_r2, d_q, n, detail::site(stream, 3), drop);
    ffn_.backward<Dev, T>(dev, pf, gf, s.h, rows, d_q, d_h, s.ffn, rest, training, detail::site(stream, 2));
    if (o_.pre_norm) {
      // h = norm2(r1): d_r1 = dy + norm2'(d_h)
      norm2_.backward<Dev, T>(dev, pn2, gn2, {s.r1, rows, o_.dim}, {s.h, rows, o_.dim}, {d_h, rows, o_.dim},
                              {d_r1, rows, o_.dim});
      detail::accumulate(dev, static_cast<const T*>(d_r2), d_r1, n);
    } else {
      // h = norm1(r1) feeds the FFN and the skip: d_h += d_r2
      detail::accumulate(dev, static_cast<const T*>(d_r2), d_h, n);
      norm1_.backward<Dev, T>(dev, pn1, gn1, {s.r1, rows, o_.dim}, {s.h, rows, o_.dim}, {d_h, rows, o_.dim},
                              {d_r1, rows, o_.dim});
    }
    // first residual: r1 = x + drop(attn(qk, qk, v_in))
    detail::drop(dev, d_r1, d_r2, n, detail::site(stream, 1), drop);  // d_r2 now holds d_attn_out
    const T* attn_in = o_.pre_norm ? s.n1 : x;
    T* d_k = d_h;  // free again
    T* d_v = rest;
    attn_.backward<Dev, T>(dev, pa, ga, {batch, time, time}, s.qk, s.qk, attn_in, d_r2, d_q, d_k, d_v, s.attn, rest + n,
                           training, detail::site(stream, 0));
    // d_qk = d_q + d_k is the positions' gradient and part of attn_in's
    detail::accumulate(dev, static_cast<const T*>(d_k), d_q, n);
    if (d_pos != nullptr) dev.for_each(static_cast<std::size_t>(n), detail::CopyElements<T>{d_q, d_pos});
    detail::accumulate(dev, static_cast<const T*>(d_v), d_q, n);  // d_attn_in
    if (o_.pre_norm) {
      norm1_.backward<Dev, T>(dev, pn1, gn1, {x, rows, o_.dim}, {s.n1, rows, o_.dim}, {d_q, rows, o_.dim},
                              {dx, rows, o_.dim});
      detail::accumulate(dev, static_cast<const T*>(d_r1), dx, n);
    } else {
      detail::add(dev, static_cast<const T*>(d_r1), static_cast<const T*>(d_q), dx, n);
    }
  }

 private:
  template <class T>
  struct Saved {
    T* qk;
    T* r1;
    T* h;
    T* r2;
    T* n1;
    T* f2;
    T* attn;
    T* ffn;
  };
  template <class T>
  Saved<T> carve(T* at, std::int64_t batch, std::int64_t time) const {
    const std::int64_t n = batch * time * o_.dim;
    detail::Carve<T> c(at);
    Saved<T> s{};
    s.qk = c.take(n);
    s.r1 = c.take(n);
    s.h = c.take(n);
    s.r2 = o_.pre_norm ? nullptr : c.take(n);
    s.n1 = o_.pre_norm ? c.take(n) : nullptr;
    s.f2 = c.take(n);
    s.attn = c.take(attn_.saved_size({batch, time, time}));
    s.ffn = c.take(0);
    return s;
  }

  PositionalLayerOptions o_;
  MultiheadAttention attn_;
  detail::PositionalFfn ffn_;
  LayerNorm norm1_;
  LayerNorm norm2_;
};

class PositionalDecoderLayer {
 public:
  explicit PositionalDecoderLayer(PositionalLayerOptions o)
      : o_(o),
        self_(o.dim, o.heads, o.dropout),
        cross_(o.dim, o.heads, o.dropout),
        ffn_(o),
        norm1_(o.dim),
        norm2_(o.dim),
        norm3_(o.dim) {
    detail::check_layer_options("nn::PositionalDecoderLayer", o);
  }

  const PositionalLayerOptions& options() const { return o_; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "self_attn", self_.params());
    detail::append_params(out, "multihead_attn", cross_.params());
    ffn_.append(out);
    detail::append_params(out, "norm1", norm1_.params());
    detail::append_params(out, "norm2", norm2_.params());
    detail::append_params(out, "norm3", norm3_.params());
    return out;
  }

  std::int64_t saved_size(std::int64_t batch, std::int64_t time, std::int64_t mem_time) const {
    const std::int64_t n = batch * time * o_.dim, m = batch * mem_time * o_.dim;
    return 10 * n + m + self_.saved_size({batch, time, time}) + cross_.saved_size({batch, time, mem_time}) +
           ffn_.saved_size(batch * time);
  }
  std::int64_t scratch_size(std::int64_t batch, std::int64_t time, std::int64_t mem_time) const {
    const std::int64_t n = batch * time * o_.dim, m = batch * mem_time * o_.dim;
    return 5 * n + 2 * m +
           std::max({n + self_.scratch_size({batch, time, time}), cross_.scratch_size({batch, time, mem_time}),
                     ffn_.scratch_size(batch * time)});
  }

  // x, query_pos, y [batch * time, dim]; memory, memory_pos [batch * mem_time, dim].
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, std::int64_t batch, std::int64_t time, std::int64_t mem_time,
               const T* x, const T* query_pos, const T* memory, const T* memory_pos, T* y, T* saved, bool training,
               std::uint64_t stream) {
    const std::int64_t rows = batch * time, n = rows * o_.dim, m = batch * mem_time * o_.dim;
    const Saved<T> s = carve(saved, batch, time, mem_time);
    const auto ps = p.subspan(0, 4), pc = p.subspan(4, 4), pf = p.subspan(8, 4);
    const auto pn1 = p.subspan(12, 2), pn2 = p.subspan(14, 2), pn3 = p.subspan(16, 2);
    const float drop = training ? o_.dropout : 0.f, scale = 1.f / (1.f - drop);
    // self-attention
    const T* sa_in = x;
    if (o_.pre_norm) {
      norm1_.forward<Dev, T>(dev, pn1, {x, rows, o_.dim}, {s.n1, rows, o_.dim});
      sa_in = s.n1;
    }
    detail::add(dev, sa_in, query_pos, s.qk, n);
    self_.forward<Dev, T>(dev, ps, {batch, time, time}, s.qk, s.qk, sa_in, nullptr, s.out, s.sa, training,
                          detail::site(stream, 0));
    dev.for_each(static_cast<std::size_t>(n),
                 detail::DropoutResidual<T>{x, s.out, s.r1, detail::site(stream, 1), drop, scale});
    // cross-attention
    if (o_.pre_norm)
      norm2_.forward<Dev, T>(dev, pn2, {s.r1, rows, o_.dim}, {s.h1, rows, o_.dim});
    else
      norm1_.forward<Dev, T>(dev, pn1, {s.r1, rows, o_.dim}, {s.h1, rows, o_.dim});
    detail::add(dev, static_cast<const T*>(s.h1), query_pos, s.cq, n);
    detail::add(dev, memory, memory_pos, s.ck, m);
    cross_.forward<Dev, T>(dev, pc, {batch, time, mem_time}, s.cq, s.ck, memory, nullptr, s.out, s.ca, training,
                           detail::site(stream, 2));
    const T* skip2 = o_.pre_norm ? s.r1 : s.h1;
    dev.for_each(static_cast<std::size_t>(n),
                 detail::DropoutResidual<T>{skip2, s.out, s.r2, detail::site(stream, 3), drop, scale});
    // feed-forward
    if (o_.pre_norm)
      norm3_.forward<Dev, T>(dev, pn3, {s.r2, rows, o_.dim}, {s.h2, rows, o_.dim});
    else
      norm2_.forward<Dev, T>(dev, pn2, {s.r2, rows, o_.dim}, {s.h2, rows, o_.dim});
    ffn_.forward<Dev, T>(dev, pf, s.h2, rows, s.out, s.ffn, training, detail::site(stream, 4));
    const T* skip3 = o_.pre_norm ? s.r2 : s.h2;
    T* r3 = o_.pre_norm ? y : s.r3;
    dev.for_each(static_cast<std::size_t>(n),
                 detail::DropoutResidual<T>{skip3, s.out, r3, detail::site(stream, 5), drop, scale});
    if (!o_.pre_norm) norm3_.forward<Dev, T>(dev, pn3, {s.r3, rows, o_.dim}, {y, rows, o_.dim});
  }

  // dx, d_query_pos [rows, dim], d_memory, d_memory_pos [mem rows, dim]
  // overwritten (d_query_pos and d_memory_pos may be null).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, std::int64_t batch, std::int64_t time,
                std::int64_t mem_time, const T* x, const T* memory, const T* y, const T* dy, T* dx, T* d_query_pos,
                T* d_memory, T* d_memory_pos, T* saved, T* scratch, bool training, std::uint64_t stream) {
    const std::int64_t rows = batch * time, n = rows * o_.dim, mrows = batch * mem_time, m = mrows * o_.dim;
    const Saved<T> s = carve(saved, batch, time, mem_time);
    const auto ps = p.subspan(0, 4), pc = p.subspan(4, 4), pf = p.subspan(8, 4);
    const auto pn1 = p.subspan(12, 2), pn2 = p.subspan(14, 2), pn3 = p.subspan(16, 2);
    const auto gs = grad.subspan(0, 4), gc = grad.subspan(4, 4), gf = grad.subspan(8, 4);
    const auto gn1 = grad.subspan(12, 2), gn2 = grad.subspan(14, 2), gn3 = grad.subspan(16, 2);
    const float drop = training ? o_.dropout : 0.f;
    detail::Carve<T> c(scratch);
    T* d_r = c.take(n);  // the gradient at the current residual's output
    T* d_h = c.take(n);
    T* d_q = c.take(n);
    T* d_k = c.take(n);
    T* d_pos = c.take(n);
    T* d_ck = c.take(m);
    T* d_mv = c.take(m);
    T* rest = c.take(0);
    // third residual
    if (o_.pre_norm)
      dev.for_each(static_cast<std::size_t>(n), detail::CopyElements<T>{dy, d_r});
    else
      norm3_.backward<Dev, T>(dev, pn3, gn3, {s.r3, rows, o_.dim}, {y, rows, o_.dim}, {dy, rows, o_.dim},
                              {d_r, rows, o_.dim});
    detail::drop(dev, d_r, d_q, n, detail::site(stream, 5), drop);
    ffn_.backward<Dev, T>(dev, pf, gf, s.h2, rows, d_q, d_h, s.ffn, rest, training, detail::site(stream, 4));
    // d at r2
    if (o_.pre_norm) {
      norm3_.backward<Dev, T>(dev, pn3, gn3, {s.r2, rows, o_.dim}, {s.h2, rows, o_.dim}, {d_h, rows, o_.dim},
                              {d_q, rows, o_.dim});
      detail::accumulate(dev, static_cast<const T*>(d_q), d_r, n);
    } else {
      detail::accumulate(dev, static_cast<const T*>(d_r), d_h, n);
      norm2_.backward<Dev, T>(dev, pn2, gn2, {s.r2, rows, o_.dim}, {s.h2, rows, o_.dim}, {d_h, rows, o_.dim},
                              {d_r, rows, o_.dim});
    }
    // cross-attention branch: r2 = skip2 + drop(cross(h1 + qpos, mem + mpos, mem))
    detail::drop(dev, d_r, d_k, n, detail::site(stream, 3), drop);  // d_k holds d_cross_out
    cross_.backward<Dev, T>(dev, pc, gc, {batch, time, mem_time}, s.cq, s.ck, memory, d_k, d_q, d_ck, d_mv, s.ca, rest,
                            training, detail::site(stream, 2));
    // memory: keys mem + mpos, values mem
    if (d_memory_pos != nullptr) dev.for_each(static_cast<std::size_t>(m), detail::CopyElements<T>{d_ck, d_memory_pos});
    detail::add(dev, static_cast<const T*>(d_ck), static_cast<const T*>(d_mv), d_memory, m);
    // queries h1 + qpos: d_pos starts with d_q
    dev.for_each(static_cast<std::size_t>(n), detail::CopyElements<T>{d_q, d_pos});
    // d at h1 = d_q (+ d_r, the skip, post-norm); then through its norm to r1
    if (o_.pre_norm) {
      norm2_.backward<Dev, T>(dev, pn2, gn2, {s.r1, rows, o_.dim}, {s.h1, rows, o_.dim}, {d_q, rows, o_.dim},
                              {d_h, rows, o_.dim});
      detail::accumulate(dev, static_cast<const T*>(d_h), d_r, n);  // d_r = d at r1
    } else {
      detail::accumulate(dev, static_cast<const T*>(d_q), d_r, n);
      norm1_.backward<Dev, T>(dev, pn1, gn1, {s.r1, rows, o_.dim}, {s.h1, rows, o_.dim}, {d_r, rows, o_.dim},
                              {d_h, rows, o_.dim});
      dev.for_each(static_cast<std::size_t>(n), detail::CopyElements<T>{d_h, d_r});  // d_r = d at r1
    }
    // self-attention branch: r1 = x + drop(self(sa_in + qpos, sa_in + qpos, sa_in))
    detail::drop(dev, d_r, d_h, n, detail::site(stream, 1), drop);
    const T* sa_in = o_.pre_norm ? s.n1 : x;
    T* d_v = rest;
    self_.backward<Dev, T>(dev, ps, gs, {batch, time, time}, s.qk, s.qk, sa_in, d_h, d_q, d_k, d_v, s.sa, rest + n,
                           training, detail::site(stream, 0));
    detail::accumulate(dev, static_cast<const T*>(d_k), d_q, n);  // d_qk
    detail::accumulate(dev, static_cast<const T*>(d_q), d_pos, n);
    if (d_query_pos != nullptr) dev.for_each(static_cast<std::size_t>(n), detail::CopyElements<T>{d_pos, d_query_pos});
    detail::accumulate(dev, static_cast<const T*>(d_v), d_q, n);  // d at sa_in
    if (o_.pre_norm) {
      norm1_.backward<Dev, T>(dev, pn1, gn1, {x, rows, o_.dim}, {s.n1, rows, o_.dim}, {d_q, rows, o_.dim},
                              {dx, rows, o_.dim});
      detail::accumulate(dev, static_cast<const T*>(d_r), dx, n);
    } else {
      detail::add(dev, static_cast<const T*>(d_r), static_cast<const T*>(d_q), dx, n);
    }
  }

 private:
  template <class T>
  struct Saved {
    T* qk;
    T* n1;
    T* r1;
    T* h1;
    T* cq;
    T* ck;
    T* r2;
    T* h2;
    T* r3;
    T* out;
    T* sa;
    T* ca;
    T* ffn;
  };
  template <class T>
  Saved<T> carve(T* at, std::int64_t batch, std::int64_t time, std::int64_t mem_time) const {
    const std::int64_t n = batch * time * o_.dim, m = batch * mem_time * o_.dim;
    detail::Carve<T> c(at);
    Saved<T> s{};
    s.qk = c.take(n);
    s.n1 = c.take(n);
    s.r1 = c.take(n);
    s.h1 = c.take(n);
    s.cq = c.take(n);
    s.ck = c.take(m);
    s.r2 = c.take(n);
    s.h2 = c.take(n);
    s.r3 = c.take(n);
    s.out = c.take(n);
    s.sa = c.take(self_.saved_size({batch, time, time}));
    s.ca = c.take(cross_.saved_size({batch, time, mem_time}));
    s.ffn = c.take(0);
    return s;
  }

  PositionalLayerOptions o_;
  MultiheadAttention self_;
  MultiheadAttention cross_;
  detail::PositionalFfn ffn_;
  LayerNorm norm1_;
  LayerNorm norm2_;
  LayerNorm norm3_;
};

}  // namespace dtrain::nn
