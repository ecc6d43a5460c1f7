#pragma once
// Functors for sequence models, applied with dev.for_each like every other
// kernel, so the host and the GPU run the same code. Activations are
// [rows = batch * time, width] row-major (row b * time + t); attention works on
// heads laid out [batch, heads, time, head_dim] so each (batch, head) is one
// contiguous [time, head_dim] matrix for a strided batched GEMM.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/math.hpp"

namespace dtrain {

// The shape of a head permutation: `parts` blocks of `heads` x `head_dim`
// columns (3 for a fused q|k|v projection, 1 otherwise).
struct HeadLayout {
  std::int64_t batch, time, heads, head_dim, parts;
  DTRAIN_HOST_DEVICE std::int64_t width() const { return heads * head_dim; }
  DTRAIN_HOST_DEVICE std::int64_t rows() const { return batch * time; }
  // Element (row, column) of the [rows, parts * width] matrix, in the head
  // layout: part p is a [batch, heads, time, head_dim] block.
  DTRAIN_HOST_DEVICE std::int64_t head_index(std::int64_t row, std::int64_t col) const {
    const std::int64_t p = col / width(), h = (col % width()) / head_dim, d = col % head_dim;
    const std::int64_t b = row / time, t = row % time;
    return p * rows() * width() + ((b * heads + h) * time + t) * head_dim + d;
  }
};

// rows -> heads (to_heads) or heads -> rows; run over rows * parts * width.
template <Dtype T>
struct HeadPermute {
  HeadLayout l;
  const T* src;
  T* dst;
  bool to_heads;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i), cols = l.parts * l.width();
    const std::int64_t h = l.head_index(n / cols, n % cols);
    if (to_heads)
      dst[h] = src[n];
    else
      dst[n] = src[h];
  }
};

// The same permutation one contiguous run of head_dim elements per index (a
// row's head within one part is contiguous on both sides): run over
// rows * parts * heads. For the host, where the per-element index arithmetic
// of HeadPermute costs more than the copy; the GPU keeps HeadPermute, whose
// neighbouring threads touch neighbouring elements.
template <Dtype T>
struct HeadPermuteRuns {
  HeadLayout l;
  const T* src;
  T* dst;
  bool to_heads;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(l.head_dim); }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i), per_row = l.parts * l.heads;
    const std::int64_t row = n / per_row, col = (n % per_row) * l.head_dim;
    const std::int64_t at_rows = row * l.parts * l.width() + col, at_heads = l.head_index(row, col);
    const T* from = src + (to_heads ? at_rows : at_heads);
    T* to = dst + (to_heads ? at_heads : at_rows);
    for (std::int64_t d = 0; d < l.head_dim; ++d) to[d] = from[d];
  }
};

// The columns row t of a causal [time, time] matrix is written to: the end
// of its block of `block` rows, or all of them for block 0. (Attention's
// host products run over row blocks and read no further: nn/attention.hpp.)
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE std::int64_t causal_written(std::int64_t t, std::int64_t time,
                                                                    std::int64_t block) {
  return block > 0 ? math::min_i64(time, (t / block + 1) * block) : time;
}

// Softmax in place over the columns of row's first `span` that on(j)
// keeps, writing columns [0, written): the probabilities below span, 0 at
// and past it. The reductions run in math's lanes (the same bits on every
// device), and a column left out takes exp of a large negative number,
// exactly 0: a select on the argument, not a branch around the exp, so every
// loop over the row vectorises. A row with no column kept becomes all 0.
template <class T, class On, class Row>
DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void softmax_kept(T* row, std::int64_t span, std::int64_t written, On on,
                                                          const Row& lanes) {
  constexpr float lowest = -3.0e38f, left_out = -1.0e30f;
  const float mx = lanes.max(span, lowest, [&](std::int64_t j) { return on(j) ? static_cast<float>(row[j]) : lowest; });
  const auto e = [&](std::int64_t j) { return math::exp(on(j) ? static_cast<float>(row[j]) - mx : left_out); };
  float sum = 0.f;
  if constexpr (std::is_same_v<T, float>)  // fp32 keeps the exponentials in the row: one exp per column
    sum = lanes.sum(span, [&](std::int64_t j) { return row[j] = e(j); });
  else  // half types round once: the exponentials are recomputed in fp32 below
    sum = lanes.sum(span, e);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  lanes.each(written, [&](std::int64_t j) {
    float p = 0.f;
    if constexpr (std::is_same_v<T, float>)
      p = j < span ? row[j] * inv : 0.f;
    else
      p = j < span ? e(j) * inv : 0.f;
    row[j] = dtype_cast<T>(p);
  });
}

// In place on the [time, time] score matrices of every (batch, head): row t
// becomes softmax over columns 0..t (the past and present), 0 beyond (up to
// its block's end with `block`, past it left as it was). Run
// over batch * heads * time rows. With a key mask ([batch, time], 0 = a
// padding position) the columns it zeroes are left out as well; a row left
// with no column (a padding query before the first token) becomes all 0.
// With position ids ([batch, time], restarting at 0 where a packed record
// starts) a query sees only its own record: columns t - pos[t] .. t.
// With a window w > 0 (sliding-window attention) a key w or more positions
// before the query is left out too: columns t - w + 1 .. t.
// The reductions run over whole groups of math::lanes columns where the row
// has them (columns past t count as left out), so they vectorise without a
// scalar tail.
template <Dtype T, class M = std::int32_t>
struct CausalSoftmax {
  static constexpr unsigned row_lanes = math::lanes;  // a row functor (math::SerialRow)
  T* att;
  std::int64_t time;
  const M* key_mask = nullptr;              // on the device, or null: no padding
  std::int64_t heads = 1;                   // rows of one sequence = heads * time
  const std::int64_t* positions = nullptr;  // on the device, or null: one record per sequence
  // > 0: row t is written only to the end of its block of `block` rows
  // (causal_written), as far as products over row blocks read it
  std::int64_t block = 0;
  std::int64_t window = 0;  // > 0: keys at t - window or before are left out
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i), t = r % time;
    T* row = att + r * time;
    if (key_mask == nullptr && positions == nullptr && window == 0)
      return softmax_row(
          row, t, [t](std::int64_t j) { return j <= t; }, lanes);
    const std::int64_t seq = r / (heads * time);
    const M* keep = key_mask != nullptr ? key_mask + seq * time : nullptr;
    const std::int64_t record = positions != nullptr ? t - positions[seq * time + t] : 0;
    const std::int64_t first = window > 0 && t - window + 1 > record ? t - window + 1 : record;
    softmax_row(
        row, t, [t, keep, first](std::int64_t j) { return j <= t && j >= first && (keep == nullptr || keep[j] != 0); },
        lanes);
  }
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(time); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }

 private:
  // Softmax of row over the columns on(j) keeps (all of them at or before t).
  template <class On, class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void softmax_row(T* row, std::int64_t t, On on, const Row& lanes) const {
    softmax_kept(row, math::min_i64(time, (t + math::lanes) / math::lanes * math::lanes),
                 causal_written(t, time, block), on, lanes);
  }
};

// Softmax backward, in place on the probabilities' gradient:
// ds_j = p_j * (dp_j - sum_k p_k dp_k) * scale over the unmasked columns
// (a padded key has p_j = 0, so its ds_j is 0 without reading the mask).
template <Dtype T>
struct CausalSoftmaxBackward {
  static constexpr unsigned row_lanes = math::lanes;
  const T* att;
  T* datt;
  std::int64_t time;
  float scale;
  std::int64_t block = 0;  // as CausalSoftmax's
  template <class Row>
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void row(std::size_t i, const Row& lanes) const {
    const auto r = static_cast<std::int64_t>(i), t = r % time;
    const T* p = att + r * time;
    T* d = datt + r * time;
    // p is 0 past t, so whole lane groups up to `span` add nothing more
    const std::int64_t span = math::min_i64(time, (t + math::lanes) / math::lanes * math::lanes);
    const float dot =
        lanes.sum(span, [&](std::int64_t j) { return static_cast<float>(p[j]) * static_cast<float>(d[j]); });
    lanes.each(causal_written(t, time, block), [&](std::int64_t j) {
      d[j] = dtype_cast<T>(j <= t ? static_cast<float>(p[j]) * (static_cast<float>(d[j]) - dot) * scale : 0.f);
    });
  }
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(time); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const { row(i, math::SerialRow{}); }
};

// In place on the [q_time, k_time] score matrices of every (batch, head):
// row t becomes softmax over the keys the masks keep, 0 elsewhere, without a
// causal limit (bidirectional and cross attention). Run over
// batch * heads * q_time rows. With a key mask ([batch, k_time], 0 = a
// padding key) its zeros are left out; with position ids ([batch, time],
// self-attention, q_time == k_time) a query keeps only the keys of its own
// packed record (the same first position, j - pos[j] == t - pos[t]): the
// block-diagonal mask. A row left with no key becomes all 0.
template <Dtype T, class M = std::int32_t>
struct MaskedSoftmax {
  T* att;
  std::int64_t q_time, k_time;
  const M* key_mask = nullptr;  // on the device, or null: no padding
  std::int64_t heads = 1;       // rows of one sequence = heads * q_time
  const std::int64_t* positions = nullptr;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE bool kept(std::int64_t seq, std::int64_t t, std::int64_t j) const {
    if (key_mask != nullptr && key_mask[seq * k_time + j] == 0) return false;
    if (positions == nullptr) return true;
    const std::int64_t* p = positions + seq * q_time;
    return j - p[j] == t - p[t];
  }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i), t = r % q_time, seq = r / (heads * q_time);
    T* row = att + r * k_time;
    if (key_mask == nullptr && positions == nullptr)
      return softmax_kept(
          row, k_time, k_time, [](std::int64_t) { return true; }, math::SerialRow{});
    softmax_kept(
        row, k_time, k_time, [this, seq, t](std::int64_t j) { return kept(seq, t, j); }, math::SerialRow{});
  }
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(k_time); }
};

// Its backward, in place on the probabilities' gradient of rows `width`
// wide: ds_j = p_j * (dp_j - sum_k p_k dp_k) * scale (a left-out key has
// p_j = 0, so its ds_j is 0).
template <Dtype T>
struct SoftmaxRowsBackward {
  const T* att;
  T* datt;
  std::int64_t width;
  float scale;
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    const T* p = att + static_cast<std::int64_t>(i) * width;
    T* d = datt + static_cast<std::int64_t>(i) * width;
    const math::SerialRow lanes;
    const float dot =
        lanes.sum(width, [&](std::int64_t j) { return static_cast<float>(p[j]) * static_cast<float>(d[j]); });
    lanes.each(width, [&](std::int64_t j) {
      d[j] = dtype_cast<T>(static_cast<float>(p[j]) * (static_cast<float>(d[j]) - dot) * scale);
    });
  }
  std::size_t work_per_index() const { return static_cast<std::size_t>(width); }
};

// out[i] = a[i] + b[i], in fp32 and rounded once (residual connections).
template <Dtype T>
struct AddElements {
  const T* a;
  const T* b;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    out[i] = dtype_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
  }
#if defined(__CUDACC__)
  // Four elements per access (DTRAIN_ELEMENTWISE=wide), the same sums.
  static constexpr std::size_t vector_width = 4;
  static constexpr bool wide_path = true;
  bool vector_ok() const noexcept {
    return aligned_for_vec4(a, sizeof(T)) && aligned_for_vec4(b, sizeof(T)) && aligned_for_vec4(out, sizeof(T));
  }
  __device__ void apply_vector(std::size_t first) const {
    const Vec4<T> x = *reinterpret_cast<const Vec4<T>*>(a + first), y = *reinterpret_cast<const Vec4<T>*>(b + first);
    Vec4<T> r;
    for (int l = 0; l < 4; ++l) r.v[l] = dtype_cast<T>(static_cast<float>(x.v[l]) + static_cast<float>(y.v[l]));
    *reinterpret_cast<Vec4<T>*>(out + first) = r;
  }
#endif
};

// y[r, c] = table[ids[r], c] (times `scale`, rounded once, unless it is 1);
// run over rows * dim.
template <Dtype T, class Id>
struct EmbeddingGather {
  const Id* ids;
  const T* table;
  T* y;
  std::int64_t dim;
  float scale = 1.f;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const T w = table[static_cast<std::int64_t>(ids[n / dim]) * dim + n % dim];
    y[n] = scale == 1.f ? w : dtype_cast<T>(static_cast<float>(w) * scale);
  }
};

// dtable[v, c] = sum of dy[r, c] over the rows r holding id v, in row order:
// rows[offsets[v] .. offsets[v + 1]) lists them (built on the host). One
// index per table element, so no two threads write the same element and the
// sum is deterministic; run over vocab * dim, or over vocab `by_rows` (the
// host's form: a table row per index, its columns in math::column_sums'
// vectorised groups, the same sums in the same order, no division per
// element). With `scale` each row of dy is scaled before the sum (the
// gradient of EmbeddingGather's scaled rows; times 1 is exact).
template <Dtype T>
struct EmbeddingScatter {
  const std::int64_t* offsets;
  const std::int64_t* rows;
  const T* dy;
  T* dtable;
  std::int64_t dim;
  bool by_rows = false;
  float scale = 1.f;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return by_rows ? static_cast<std::size_t>(dim) : 1; }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    if (by_rows) {  // each element summed as below: from 0.f, in row order, rounded once
      const auto v = static_cast<std::int64_t>(i);
      const std::int64_t first = offsets[v];
      const auto f = [&](std::int64_t k, std::int64_t c)
                         DTRAIN_LAMBDA_INLINE { return static_cast<float>(dy[rows[first + k] * dim + c]) * scale; };
      const auto put = [&](std::int64_t c, float sum)
                           DTRAIN_LAMBDA_INLINE { dtable[v * dim + c] = dtype_cast<T>(sum); };
      for (std::int64_t c0 = 0; c0 < dim; c0 += math::lanes)
        math::column_sums<math::lanes>(offsets[v + 1] - first, c0, math::min_i64(math::lanes, dim - c0), f, put);
      return;
    }
    const auto n = static_cast<std::int64_t>(i), v = n / dim, c = n % dim;
    float acc = 0.f;
    for (std::int64_t k = offsets[v]; k < offsets[v + 1]; ++k) acc += static_cast<float>(dy[rows[k] * dim + c]) * scale;
    dtable[n] = dtype_cast<T>(acc);
  }
};

// y[r, c] = x[r, c] + table[r % time, c], or table[positions[r], c] for
// packed records; run over rows * dim, or over rows `by_rows` (the host's
// form: a row per index, its loop vectorised, no division per element).
template <Dtype T>
struct AddPositions {
  const T* x;
  const T* table;
  T* y;
  std::int64_t time, dim;
  const std::int64_t* positions = nullptr;
  bool by_rows = false;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return by_rows ? static_cast<std::size_t>(dim) : 1; }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE std::int64_t position(std::int64_t r) const {
    return positions != nullptr ? positions[r] : r % time;
  }
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    if (by_rows) {
      const auto r = static_cast<std::int64_t>(i);
      const T* xr = x + r * dim;
      const T* tr = table + position(r) * dim;
      T* yr = y + r * dim;
      for (std::int64_t c = 0; c < dim; ++c)
        yr[c] = dtype_cast<T>(static_cast<float>(xr[c]) + static_cast<float>(tr[c]));
    } else {
      const auto n = static_cast<std::int64_t>(i), r = n / dim, c = n % dim;
      y[n] = dtype_cast<T>(static_cast<float>(x[n]) + static_cast<float>(table[position(r) * dim + c]));
    }
  }
};

// dtable[t, c] = sum over the batch of dy[b * time + t, c] (0 for t >= time);
// run over max_len * dim, or over max_len `by_rows` (the host's form: a
// table row per index, the same sums in the same order, vectorised).
template <Dtype T>
struct PositionGrad {
  const T* dy;
  T* dtable;
  std::int64_t batch, time, dim;
  bool by_rows = false;
  // for Host::for_each's split (index_work)
  std::size_t work_per_index() const { return static_cast<std::size_t>(by_rows ? batch * dim : batch); }
  DTRAIN_HOST_DEVICE DTRAIN_ALWAYS_INLINE void operator()(std::size_t i) const {
    if (by_rows) {  // each element summed as below: from 0.f, in batch order, rounded once
      const auto t = static_cast<std::int64_t>(i);
      const auto f = [&](std::int64_t b, std::int64_t c)
                         DTRAIN_LAMBDA_INLINE { return static_cast<float>(dy[(b * time + t) * dim + c]); };
      const auto put = [&](std::int64_t c, float sum)
                           DTRAIN_LAMBDA_INLINE { dtable[t * dim + c] = dtype_cast<T>(sum); };
      for (std::int64_t c0 = 0; c0 < dim; c0 += math::lanes)
        math::column_sums<math::lanes>(t < time ? batch : 0, c0, math::min_i64(math::lanes, dim - c0), f, put);
      return;
    }
    const auto n = static_cast<std::int64_t>(i), t = n / dim, c = n % dim;
    float acc = 0.f;
    if (t < time)
      for (std::int64_t b = 0; b < batch; ++b) acc += static_cast<float>(dy[(b * time + t) * dim + c]);
    dtable[n] = dtype_cast<T>(acc);
  }
};

}  // namespace dtrain

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_SEQUENCE_FUNCTORS(EACH, SUM, T)     \
  EACH(::dtrain::CausalSoftmax<T, std::int32_t>)   \
  EACH(::dtrain::CausalSoftmax<T, std::int64_t>)   \
  EACH(::dtrain::CausalSoftmaxBackward<T>)         \
  EACH(::dtrain::MaskedSoftmax<T, std::int32_t>)   \
  EACH(::dtrain::MaskedSoftmax<T, std::int64_t>)   \
  EACH(::dtrain::SoftmaxRowsBackward<T>)           \
  EACH(::dtrain::HeadPermuteRuns<T>)               \
  EACH(::dtrain::EmbeddingScatter<T>)              \
  EACH(::dtrain::EmbeddingGather<T, std::int32_t>) \
  EACH(::dtrain::EmbeddingGather<T, std::int64_t>) \
  EACH(::dtrain::PositionGrad<T>)                  \
  EACH(::dtrain::AddPositions<T>)                  \
  EACH(::dtrain::AddElements<T>)
