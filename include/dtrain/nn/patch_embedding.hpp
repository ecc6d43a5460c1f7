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
// It reads one NCHW image per row, x [batch, channels * height * width], and
// writes `tokens` rows per image, y [batch * tokens, dim]: the row count
// changes, so it is called by a unit that owns the token rows (a vision
// tower), not placed between units of equal rows. The position table is
// built for one image size: other sizes are refused (no interpolation).
//
// On a GPU the unit runs only with DTRAIN_GPU_VISION=on (nn/convolution.hpp).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/convolution.hpp"
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

  // in: the values per image (checked); the width of each token row.
  std::int64_t out_features(std::int64_t in) const {
    if (in != image_size()) wrong_image(in);
    return dim_;
  }

  // An image tensor's shape, [batch, channels, height, width]: throws when it
  // is not what the unit was built for (naming both sizes).
  DTRAIN_DECL void check_images(std::span<const std::int64_t> nchw) const;

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
