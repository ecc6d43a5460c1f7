#pragma once
// nn::ImageTokenMerge: where a vision-language model (LLaVA) puts its images
// into the text. It owns the language model's token embedding (an
// nn::Embedding: its table "weight" [vocab, dim], its options, its
// gradient), reads the batch's ids (int32 or int64 [B, T], tensor "x"),
// takes the projected image features as its input rows [B * F, dim] (one
// image per sequence, F features each, in order) and writes the text's rows
// [B * T, dim] (out_shape: the batch's {B, T}):
//   y[b, t] = features[b, k]    where ids[b, t] is the image token, the k-th of sequence b
//           = weight[ids[b, t]] elsewhere
// as transformers' masked_scatter of the features into the embeddings, the
// features times `feature_scale` (1, or the sqrt(dim) that transformers 4's
// Gemma multiplies its whole input by, rounded to the compute dtype first).
// A sequence whose image tokens are not F is a config_error naming both
// counts. The image token must be an id of the table (< vocab).
// Backward: the features' gradient is dy's rows at the image tokens (times
// the scale); the table's is nn::Embedding's (deterministic), its
// image-token row 0: those positions took the features, not the row.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/embedding.hpp"

namespace dtrain::nn {

namespace detail {
// Feature row f [dim] <-> text row rows[f]: forward writes y's row from the
// features, backward reads dy's row into the features' gradient, each times
// `scale` (rounded once; times 1 is a copy).
template <class T>
struct ImageRows {
  const std::int64_t* rows;
  const T* src;
  T* dst;
  std::int64_t dim;
  bool forward;
  float scale = 1.f;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i), text = rows[n / dim] * dim + n % dim;
    const T v = forward ? src[n] : src[text];
    (forward ? dst[text] : dst[n]) = scale == 1.f ? v : dtype_cast<T>(static_cast<float>(v) * scale);
  }
};
}  // namespace detail

class ImageTokenMerge {
 public:
  DTRAIN_DECL ImageTokenMerge(std::int64_t vocab, std::int64_t dim, std::int64_t image_token,
                              EmbeddingOptions options = {}, float feature_scale = 1.f);

  std::int64_t vocab() const { return embed_.vocab(); }
  std::int64_t dim() const { return dim_; }
  std::int64_t image_token() const { return image_token_; }

  std::vector<ParamSpec> params() const { return embed_.params(); }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::ImageTokenMerge", in, dim_); }
  // The text's rows: the micro-batch's shape (its ids').
  SeqShape out_shape(SeqShape, SeqShape batch) const { return batch; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const DeviceBatch& batch = checked_batch(ctx.batch);
    const std::int64_t* rows = image_rows(dev, batch, x, y.rows, ctx.shape);
    embed_.forward<Dev, T>(dev, p, batch, y, ctx);
    dev.for_each(static_cast<std::size_t>(x.size()),
                 detail::ImageRows<T>{rows, x.data, y.data, dim_, true, feature_scale<T>()});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const DeviceBatch& batch = checked_batch(ctx.batch);
    if (!dx.empty()) {
      detail::check_shape("nn::ImageTokenMerge", "input gradient", dx, x.rows, dim_);
      const std::int64_t* rows = image_rows(dev, batch, x, y.rows, ctx.shape);
      dev.for_each(static_cast<std::size_t>(dx.size()),
                   detail::ImageRows<T>{rows, dy.data, dx.data, dim_, false, feature_scale<T>()});
    }
    if (grad[0].empty()) return;  // frozen
    embed_.backward<Dev, T>(dev, p, grad, batch, y, dy, ctx);
    dev.zero(grad[0].data + image_token_ * dim_, static_cast<std::size_t>(dim_));
  }

 private:
  // As transformers rounds its normaliser to the dtype.
  template <class T>
  float feature_scale() const {
    return static_cast<float>(dtype_cast<T>(feature_scale_));
  }

  DTRAIN_DECL const DeviceBatch& checked_batch(const DeviceBatch* batch) const;

  // The text row of every feature row, on the host: sequence b's k-th image
  // token takes feature row b * F + k (F = in.time); checked against the
  // features' shape `in` and the output's `text_rows`.
  DTRAIN_DECL std::vector<std::int64_t> host_rows(const DeviceBatch& batch, std::int64_t feature_rows,
                                                  std::int64_t text_rows, SeqShape in) const;

  // The same, uploaded to the device's workspace.
  template <class Dev, class T>
  const std::int64_t* image_rows(Dev& dev, const DeviceBatch& batch, MatView<const T> x, std::int64_t text_rows,
                                 SeqShape in) const {
    detail::check_shape("nn::ImageTokenMerge", "input", x, in.rows(), dim_);
    const std::vector<std::int64_t> rows = host_rows(batch, x.rows, text_rows, in);
    auto* on_device = dev.template workspace<std::int64_t>(std::max<std::size_t>(rows.size(), 1));
    dev.copy_from_host(on_device, rows.data(), rows.size());
    return on_device;
  }

  Embedding embed_;
  std::int64_t dim_;
  std::int64_t image_token_;
  EmbeddingOptions options_;
  float feature_scale_;
};

}  // namespace dtrain::nn

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/image_merge.ipp"
#endif
