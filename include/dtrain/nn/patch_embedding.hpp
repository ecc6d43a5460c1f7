#pragma once
// nn::PatchEmbedding: a vision transformer's input (ViT, CLIP's vision
// tower): each image cut into patch x patch squares, each square projected
// to `dim` (a convolution with stride = kernel = patch and no padding,
// flattened to [patches, dim] in row-major patch order), an optional learned
// class token put first, and a learned position vector added to every
// token:
//   y[n * tokens + t] = (t == 0 ? class_embedding : proj(patch t - 1 of image n)) + position_embedding[t]
// tokens = patches (+ 1 with the class token). Parameters: weight
// [dim, channels, patch, patch] (+ bias [dim]), class_embedding [dim],
// position_embedding [tokens, dim].
//
// In a model it is the first unit, an input unit: it reads the batch's
// images, float32 [batch, channels, height, width] (tensor "pixel_values"
// unless PatchEmbeddingOptions::input says otherwise), and writes `tokens`
// rows per image, y [batch * tokens, dim] (out_shape: {batch, tokens}).
// An input unit, not a unit over x, because a model that also reads text
// (LLaVA) has its token ids in x and its images beside them; a model of
// images alone names x as the input. The images stay float32 in the batch
// and are converted to a lower compute dtype in the unit's saved view.
// Called by hand (a loop of one's own) it also takes the images as x, one
// flattened NCHW image per row, [batch, channels * height * width]. The
// position table is built for one image size: other sizes are refused (no
// interpolation).
//
// On a GPU the unit runs only with DTRAIN_GPU_VISION=on (nn/convolution.hpp).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/convolution.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/convolution.hpp"

namespace dtrain::nn {

struct PatchEmbeddingOptions {
  bool bias = true;  // CLIP's projection has none
  bool class_token = true;
  float init_std = 0.02f;  // class token and positions ~ N(0, init_std)
  bool trainable = true;
  std::string input = "pixel_values";  // the batch tensor of images (as an input unit)
};

class PatchEmbedding {
 public:
  // `image`: the height and width every image has, multiples of `patch`.
  DTRAIN_DECL PatchEmbedding(std::int64_t channels, std::int64_t dim, std::int64_t patch, Extent2 image,
                             PatchEmbeddingOptions options = {});

  std::int64_t dim() const noexcept { return dim_; }
  std::int64_t patches() const noexcept { return (image_.h / patch_) * (image_.w / patch_); }
  std::int64_t tokens() const noexcept { return patches() + (options_.class_token ? 1 : 0); }
  // The values of one image, channels * height * width.
  std::int64_t image_size() const noexcept { return channels_ * image_.h * image_.w; }

  DTRAIN_DECL std::vector<ParamSpec> params() const;

  // in: the values per image (checked; 0 as an input unit, which reads the
  // batch); the width of each token row.
  std::int64_t out_features(std::int64_t in) const {
    if (in != 0 && in != image_size()) wrong_image(in);
    return dim_;
  }

  // An image tensor's shape, [batch, channels, height, width]: throws when it
  // is not what the unit was built for (naming both sizes).
  DTRAIN_DECL void check_images(std::span<const std::int64_t> nchw) const;

  // `tokens` rows per image: out_shape {images, tokens}.
  SeqShape out_shape(SeqShape in, SeqShape) const { return {in.batch, tokens()}; }

  // As an input unit the images are converted into the saved view when the
  // compute dtype is not float32 (saved_size: the most it needs).
  std::int64_t saved_size(SeqShape in, std::int64_t) const { return in.batch * image_size(); }
  template <class Dev, class T>
  std::int64_t saved_size_on(Dev&, SeqShape in, std::int64_t in_width) const {
    return std::is_same_v<T, float> ? 0 : saved_size(in, in_width);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, const DeviceBatch& batch, MatView<T> y, const UnitContext<T>& ctx) {
    forward<Dev, T>(dev, p, images<Dev, T>(dev, batch, y.rows, ctx), y);
  }
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, const DeviceBatch& batch, MatView<const T> y,
                MatView<const T> dy, const UnitContext<T>& ctx) {
    // The saved view still holds forward's converted images (or activation
    // checkpointing has just recomputed them).
    backward<Dev, T>(dev, p, grad, images<Dev, T>(dev, batch, y.rows, ctx, false), y, dy, MatView<T>{});
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    detail::check_vision_device<Dev>("nn::PatchEmbedding");
    check(p, x);
    detail::check_shape("nn::PatchEmbedding", "output", y, x.rows * tokens(), dim_);
    const ConvShape s = shape(x.rows);
    const T* cls = options_.class_token ? p[cls_index()].data : nullptr;
    detail::conv_forward(dev, s, p[0].data, options_.bias ? p[1].data : nullptr, x.data, [&](const T* proj) {
      dev.for_each(static_cast<std::size_t>(y.size()),
                   PatchTokens<T>{proj, cls, p[pos_index()].data, y.data, x.rows, patches(), dim_});
    });
  }

  // dx (the images' gradient) may be empty: a vision tower's first unit.
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    detail::check_vision_device<Dev>("nn::PatchEmbedding");
    check(p, x);
    detail::check_count("nn::PatchEmbedding", "gradients", grad.size(), p.size());
    detail::check_shape("nn::PatchEmbedding", "output gradient", dy, x.rows * tokens(), dim_);
    if (!dx.empty()) detail::check_shape("nn::PatchEmbedding", "input gradient", dx, x.rows, x.cols);
    for (std::size_t i = 0; i < grad.size(); ++i)
      if (!grad[i].empty())
        detail::check_shape("nn::PatchEmbedding", "parameter gradient", grad[i], p[i].rows, p[i].cols);
    const ConvShape s = shape(x.rows);
    const std::int64_t first = options_.class_token ? 1 : 0;
    detail::conv_backward(
        dev, s, p[0].data, x.data,
        [&](T* dproj) {
          dev.for_each(static_cast<std::size_t>(s.output_size()),
                       PatchTokensGrad<T>{dy.data, dproj, x.rows, patches(), dim_, first});
        },
        grad[0].data, options_.bias ? grad[1].data : nullptr, dx.empty() ? nullptr : dx.data);
    // The class token's gradient is the position gradient's row 0: sums over images.
    constexpr bool by_rows = Dev::host_accessible;
    const auto table_grad = [&](T* out, std::int64_t rows) {
      if (out != nullptr)
        dev.for_each(static_cast<std::size_t>(by_rows ? rows : rows * dim_),
                     PositionGrad<T>{dy.data, out, x.rows, tokens(), dim_, by_rows});
    };
    if (options_.class_token) table_grad(grad[cls_index()].data, 1);
    table_grad(grad[pos_index()].data, tokens());
  }

 private:
  std::size_t cls_index() const { return options_.bias ? 2 : 1; }
  std::size_t pos_index() const { return cls_index() + (options_.class_token ? 1 : 0); }
  DTRAIN_DECL ConvShape shape(std::int64_t batch) const noexcept;
  [[noreturn]] DTRAIN_DECL void wrong_image(std::int64_t values) const;
  // The batch's image tensor, checked: float32 [rows / tokens, channels, height, width].
  DTRAIN_DECL const DeviceTensor& image_tensor(const DeviceBatch& batch, std::int64_t rows) const;

  // The images as [count, image_size] in T: the batch's own in float32,
  // else converted into ctx.saved (`convert`: false when forward did it).
  template <class Dev, class T>
  MatView<const T> images(Dev& dev, const DeviceBatch& batch, std::int64_t rows, const UnitContext<T>& ctx,
                          bool convert = true) const {
    const DeviceTensor& t = image_tensor(batch, rows);
    const std::int64_t count = t.dim(0), n = count * image_size();
    if constexpr (std::is_same_v<T, float>) {
      return {t.data<float>(), count, image_size()};
    } else {
      detail::check_count("nn::PatchEmbedding", "saved elements", static_cast<std::size_t>(ctx.saved.size()),
                          static_cast<std::size_t>(n));
      if (convert) dev.for_each(static_cast<std::size_t>(n), Cast<float, T>{t.data<float>(), ctx.saved.data});
      return {ctx.saved.data, count, image_size()};
    }
  }

  template <class T>
  void check(UnitParams<const T> p, MatView<const T> x) const {
    detail::check_count("nn::PatchEmbedding", "parameters", p.size(), pos_index() + 1);
    detail::check_shape("nn::PatchEmbedding", "weight", p[0], dim_, channels_ * patch_ * patch_);
    if (options_.bias) detail::check_shape("nn::PatchEmbedding", "bias", p[1], dim_, 1);
    if (options_.class_token) detail::check_shape("nn::PatchEmbedding", "class_embedding", p[cls_index()], dim_, 1);
    detail::check_shape("nn::PatchEmbedding", "position_embedding", p[pos_index()], tokens(), dim_);
    if (x.cols != image_size()) wrong_image(x.cols);
  }

  std::int64_t channels_;
  std::int64_t dim_;
  std::int64_t patch_;
  Extent2 image_;
  PatchEmbeddingOptions options_;
};

}  // namespace dtrain::nn

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/patch_embedding.ipp"
#endif
