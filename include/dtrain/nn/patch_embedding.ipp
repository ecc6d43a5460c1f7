// The definitions patch_embedding.hpp declares with DTRAIN_DECL: included at
// the end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they
// are compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <string>

#include "dtrain/core/error.hpp"
#include "dtrain/nn/patch_embedding.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  DTRAIN_DECL PatchEmbedding::PatchEmbedding(std::int64_t channels, std::int64_t dim, std::int64_t patch, Extent2 image,
                                             PatchEmbeddingOptions options)
      : channels_(channels), dim_(dim), patch_(patch), image_(image), options_(options) {
    const std::string name = "nn::PatchEmbedding(" + std::to_string(channels) + ", " + std::to_string(dim) +
                             ", patch " + std::to_string(patch) + ")";
    if (channels < 1 || dim < 1 || patch < 1 || image.h < 1 || image.w < 1)
      throw config_error(name + " for " + detail::extent_text(image) +
                             " images: channels, width, patch and image extents must be >= 1",
                         "give positive channel count, width, patch size and image size");
    if (image.h % patch != 0 || image.w % patch != 0)
      throw config_error(name + ": " + detail::extent_text(image) + " images do not divide into " +
                             std::to_string(patch) + " x " + std::to_string(patch) + " patches",
                         "give an image size that is a multiple of the patch size (resize or crop the images)");
  }

  DTRAIN_DECL std::vector<ParamSpec> PatchEmbedding::params() const {
    const std::int64_t fan_in = channels_ * patch_ * patch_;
    const Init tokens_init = Init::normal(0.f, options_.init_std);
    std::vector<ParamSpec> specs{
        {"weight", {dim_, channels_, patch_, patch_}, Init::fan_in_uniform(fan_in), options_.trainable}};
    if (options_.bias)
      specs.push_back({"bias", {dim_}, Init::fan_in_uniform(fan_in), options_.trainable, {}, {"bias"}});
    if (options_.class_token)
      specs.push_back({"class_embedding", {dim_}, tokens_init, options_.trainable, {}, {"embedding"}});
    specs.push_back({"position_embedding", {tokens(), dim_}, tokens_init, options_.trainable, {}, {"embedding"}});
    return specs;
  }

  DTRAIN_DECL ConvShape PatchEmbedding::shape(std::int64_t batch) const noexcept {
    return {batch, channels_, image_.h, image_.w, dim_, patch_, patch_, patch_, patch_, 0, 0, 1};
  }

  DTRAIN_DECL void PatchEmbedding::check_images(std::span<const std::int64_t> nchw) const {
    std::string got;
    for (const std::int64_t e : nchw) got += (got.empty() ? "[" : ", ") + std::to_string(e);
    got += "]";
    const std::string want = "[batch, " + std::to_string(channels_) + ", " + std::to_string(image_.h) + ", " +
                             std::to_string(image_.w) + "]";
    if (nchw.size() != 4 || nchw[0] < 0 || nchw[1] != channels_)
      throw config_error("nn::PatchEmbedding: images " + got + ", expected " + want + " (NCHW)",
                         "give images as [batch, channels, height, width]");
    if (nchw[2] != image_.h || nchw[3] != image_.w)
      throw config_error(
          "nn::PatchEmbedding: images of " + std::to_string(nchw[2]) + " x " + std::to_string(nchw[3]) +
              ", but the position table is for " + detail::extent_text(image_) +
              " images: position interpolation is not supported",
          "resize the images to " + detail::extent_text(image_) + " (the image processor's size for this model)");
  }

  DTRAIN_DECL void PatchEmbedding::wrong_image(std::int64_t values) const {
    throw config_error("nn::PatchEmbedding: images of " + std::to_string(values) + " values, expected " +
                           std::to_string(channels_) + " x " + detail::extent_text(image_) + " = " +
                           std::to_string(image_size()) +
                           ": other image sizes need position interpolation, which "
                           "is not supported",
                       "resize the images to " + detail::extent_text(image_) +
                           " and give one flattened NCHW image "
                           "per row");
  }

  DTRAIN_DECL const DeviceTensor& PatchEmbedding::image_tensor(const DeviceBatch& batch, std::int64_t rows) const {
    if (!batch.contains(options_.input))
      throw config_error("nn::PatchEmbedding: the batch has no images '" + options_.input + "'",
                         "give the images as batch tensor '" + options_.input +
                             "', float32 [batch, channels, height, width] (or set PatchEmbeddingOptions::input)");
    const DeviceTensor& t = batch.at(options_.input);
    if (t.type != element_type::f32)
      throw config_error("nn::PatchEmbedding: images '" + options_.input + "' " + shape_text(t.shape) + " hold " +
                             std::string(element_name(t.type)),
                         "give the images as float32 (the unit converts them to the compute dtype)");
    check_images(t.shape);
    if (t.dim(0) * tokens() != rows)
      throw config_error("nn::PatchEmbedding: " + std::to_string(t.dim(0)) + " images '" + options_.input +
                             "' in a micro-batch of " + std::to_string(rows / tokens()) + " samples",
                         "give one image per sample: the images' first extent is x's");
    return t;
  }

}  // namespace dtrain::nn

DTRAIN_IMPL_END
