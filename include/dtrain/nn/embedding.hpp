#pragma once
// nn::Embedding: token ids -> vectors, the input unit of a language model.
// It reads the batch's integer ids (int32 or int64, [B, T], batch tensor "x"
// by default) and writes rows = B * T vectors of width `dim`:
//   y[r] = weight[ids[r]] (* scale: Gemma's sqrt(dim), rounded to the dtype first)
// Its gradient sums the rows of dy that share an id, per table row, in row
// order: deterministic on every device (no atomics). The rows of each id
// are bucketed on the host, where the batch's ids already are.
//
// nn::PositionalEmbedding: adds a learned vector per position t < max_len:
//   y[b * T + t] = x[b * T + t] + weight[t]

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

namespace detail {

// dtable[k] = the sum of the rows of dy [n, dim] whose key is k, for the
// keys [0, table_rows) (EmbeddingScatter: in row order, deterministic). The
// rows are bucketed by key on the host, where the keys are, and the buckets
// uploaded: offsets[k]..offsets[k + 1] index the rows of key k, in
// increasing row order. The rows of key `skip` (PyTorch's padding_idx) are
// left out: its table row's gradient is 0.
template <class Dev, class T, class Key>
void scatter_rows(Dev& dev, const Key* keys, std::size_t n, std::int64_t table_rows, const T* dy, T* dtable,
                  std::int64_t dim, float scale = 1.f, std::int64_t skip = -1) {
  std::vector<std::int64_t> index(static_cast<std::size_t>(table_rows) + 1 + n, 0);
  std::int64_t* offsets = index.data();
  std::int64_t* rows = offsets + table_rows + 1;
  const auto kept = [&](std::size_t r) { return static_cast<std::int64_t>(keys[r]) != skip; };
  for (std::size_t r = 0; r < n; ++r)
    if (kept(r)) ++offsets[static_cast<std::int64_t>(keys[r]) + 1];
  for (std::int64_t v = 0; v < table_rows; ++v) offsets[v + 1] += offsets[v];
  std::vector<std::int64_t> next(offsets, offsets + table_rows);
  for (std::size_t r = 0; r < n; ++r)
    if (kept(r)) rows[next[static_cast<std::size_t>(keys[r])]++] = static_cast<std::int64_t>(r);
  auto* on_device = dev.template workspace<std::int64_t>(index.size());
  dev.copy_from_host(on_device, index.data(), index.size());
  constexpr bool by_rows = Dev::host_accessible;
  dev.for_each(static_cast<std::size_t>(by_rows ? table_rows : table_rows * dim),
               EmbeddingScatter<T>{on_device, on_device + table_rows + 1, dy, dtable, dim, by_rows, scale});
}

}  // namespace detail

struct EmbeddingOptions {
  std::string input = "x";  // the batch tensor of ids
  float init_std = 0.02f;   // weight ~ N(0, init_std), as GPT-2
  bool trainable = true;
  // The rows are multiplied by this (Gemma: sqrt(dim)), itself first rounded
  // to the compute dtype, as transformers rounds its normaliser.
  float scale = 1.f;
  // >= 0: this id's row gets no gradient from the lookup (PyTorch's
  // padding_idx; transformers' Gemma passes pad_token_id). A tied head's
  // use of the row still reaches it.
  std::int64_t padding_idx = -1;
};

class Embedding {
 public:
  DTRAIN_DECL Embedding(std::int64_t vocab, std::int64_t dim, EmbeddingOptions options = {});

  std::int64_t vocab() const { return vocab_; }
  std::vector<ParamSpec> params() const {
    return {{"weight", {vocab_, dim_}, Init::normal(0.f, options_.init_std), options_.trainable, {}, {"embedding"}}};
  }
  // The input is ids, whatever width the caller reports.
  std::int64_t out_features(std::int64_t) const { return dim_; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, const DeviceBatch& batch, MatView<T> y, const UnitContext<T>&) {
    detail::check_count("nn::Embedding", "parameters", p.size(), 1);
    const DeviceTensor& ids = checked_ids(batch, y.rows);
    dispatch(ids, [&]<class Id>() {
      dev.for_each(static_cast<std::size_t>(y.size()),
                   EmbeddingGather<T, Id>{ids.data<Id>(), p[0].data, y.data, dim_, scale<T>()});
    });
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T> grad, const DeviceBatch& batch, MatView<const T> y,
                MatView<const T> dy, const UnitContext<T>&) {
    if (grad[0].empty()) return;  // frozen
    const DeviceTensor& ids = checked_ids(batch, y.rows);
    dispatch(ids, [&]<class Id>() {
      detail::scatter_rows(dev, ids.host_data<Id>(), static_cast<std::size_t>(ids.numel()), vocab_, dy.data,
                           grad[0].data, dim_, scale<T>(), options_.padding_idx);
    });
  }

 private:
  template <class T>
  float scale() const {
    return static_cast<float>(dtype_cast<T>(options_.scale));
  }

  template <class F>
  void dispatch(const DeviceTensor& ids, F&& f) const {
    if (ids.type == element_type::i32) return f.template operator()<std::int32_t>();
    if (ids.type == element_type::i64) return f.template operator()<std::int64_t>();
    throw config_error("nn::Embedding: ids '" + options_.input + "' hold " + std::string(element_name(ids.type)),
                       "give token ids as int32 or int64");
  }

  // One id per output row, each in [0, vocab): checked on the host copy so a
  // bad id never reaches a kernel.
  DTRAIN_DECL const DeviceTensor& checked_ids(const DeviceBatch& batch, std::int64_t rows) const;

  std::int64_t vocab_;
  std::int64_t dim_;
  EmbeddingOptions options_;
};

class PositionalEmbedding {
 public:
  DTRAIN_DECL PositionalEmbedding(std::int64_t max_len, std::int64_t dim, float init_std = 0.02f,
                                  bool trainable = true);

  std::vector<ParamSpec> params() const {
    return {{"weight", {max_len_, dim_}, Init::normal(0.f, init_std_), trainable_, {}, {"embedding"}}};
  }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::PositionalEmbedding", in, dim_); }

  // With the batch's "position_ids" (packed records, [B, T] int64) each
  // token takes its record's position's row.
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    check(x, ctx);
    detail::check_shape("nn::PositionalEmbedding", "output", y, x.rows, dim_);
    const DeviceTensor* pos = positions(ctx);
    constexpr bool by_rows = Dev::host_accessible;
    dev.for_each(static_cast<std::size_t>(by_rows ? x.rows : x.size()),
                 AddPositions<T>{x.data, p[0].data, y.data, ctx.shape.time, dim_,
                                 pos != nullptr ? pos->data<std::int64_t>() : nullptr, by_rows});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    check(x, ctx);
    if (!dx.empty()) dev.copy(dx.data, dy.data, static_cast<std::size_t>(dy.size()));
    if (grad[0].empty()) return;
    const DeviceTensor* pos = positions(ctx);
    if (pos == nullptr) {
      constexpr bool by_rows = Dev::host_accessible;
      return dev.for_each(static_cast<std::size_t>(by_rows ? max_len_ : max_len_ * dim_),
                          PositionGrad<T>{dy.data, grad[0].data, ctx.shape.batch, ctx.shape.time, dim_, by_rows});
    }
    // Packed: each position's rows summed per table element as nn::Embedding's.
    detail::scatter_rows(dev, pos->host_data<std::int64_t>(), static_cast<std::size_t>(x.rows), max_len_, dy.data,
                         grad[0].data, dim_);
  }

 private:
  // The batch's "position_ids", checked (each in [0, max_len)), or null.
  template <class T>
  const DeviceTensor* positions(const UnitContext<T>& ctx) const {
    const DeviceTensor* pos = ctx.batch != nullptr ? ctx.batch->find("position_ids") : nullptr;
    if (pos == nullptr) return nullptr;
    if (pos->shape != std::vector<std::int64_t>{ctx.shape.batch, ctx.shape.time} || pos->type != element_type::i64)
      throw config_error("nn::PositionalEmbedding: the batch's position_ids are " + shape_text(pos->shape) + " " +
                             std::string(element_name(pos->type)),
                         "give position_ids [B, T] int64 like the ids");
    const std::int64_t* host = pos->host_data<std::int64_t>();
    for (std::int64_t r = 0; r < ctx.shape.rows(); ++r)
      if (host[r] < 0 || host[r] >= max_len_)
        throw config_error("nn::PositionalEmbedding: position id " + std::to_string(host[r]) + " at row " +
                               std::to_string(r) + " is outside the table's " + std::to_string(max_len_),
                           "number each packed record's tokens 0, 1, ... (shorter than the model's positions)");
    return pos;
  }

  template <class T>
  void check(MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_shape("nn::PositionalEmbedding", "input", x, ctx.shape.rows(), dim_);
    if (ctx.shape.time > max_len_)
      throw config_error("nn::PositionalEmbedding: sequences of " + std::to_string(ctx.shape.time) +
                             " positions, but the table holds " + std::to_string(max_len_),
                         "shorten the sequences (block_size) or build the model with a longer max_len");
  }

  std::int64_t max_len_;
  std::int64_t dim_;
  float init_std_;
  bool trainable_;
};

}  // namespace dtrain::nn

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/embedding.ipp"
#endif
