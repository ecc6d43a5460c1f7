// The definitions convolution.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <string>

#include "dtrain/nn/convolution.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::nn {
  namespace detail {
  DTRAIN_DECL void require_gpu_vision(std::string_view unit) { require_gpu_switch(unit, "DTRAIN_GPU_VISION"); }

  DTRAIN_DECL std::string extent_text(Extent2 e) { return std::to_string(e.h) + " x " + std::to_string(e.w); }
  }  // namespace detail

  DTRAIN_DECL Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, Extent2 kernel, Extent2 image,
                             Conv2dOptions options)
      : in_(in_channels), out_(out_channels), kernel_(kernel), image_(image), options_(options) {
    const std::string name = "nn::Conv2d(" + std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                             ", kernel " + detail::extent_text(kernel) + ")";
    if (in_channels < 1 || out_channels < 1 || kernel.h < 1 || kernel.w < 1 || image.h < 1 || image.w < 1)
      throw config_error(
          name + " for " + detail::extent_text(image) + " images: channels, kernel and image extents must be >= 1",
          "give positive channel counts, kernel size and image size");
    if (options.stride.h < 1 || options.stride.w < 1 || options.padding.h < 0 || options.padding.w < 0)
      throw config_error(name + ": stride " + detail::extent_text(options.stride) + ", padding " +
                             detail::extent_text(options.padding) + ": strides must be >= 1, paddings >= 0",
                         "give a positive stride and a non-negative padding");
    if (options.groups < 1 || in_channels % options.groups != 0 || out_channels % options.groups != 0)
      throw config_error(
          name + ": " + std::to_string(options.groups) + " groups do not divide the input and output channels",
          "choose groups that divide both channel counts (groups = in_channels = out_channels for "
          "a depthwise convolution)");
    const Extent2 padded{image.h + 2 * options.padding.h, image.w + 2 * options.padding.w};
    if (kernel.h > padded.h || kernel.w > padded.w)
      throw config_error(name + ": the kernel is larger than the padded input " + detail::extent_text(padded) + " (" +
                             detail::extent_text(image) + " images, padding " + detail::extent_text(options.padding) +
                             ")",
                         "use a smaller kernel, more padding or larger images");
  }

  DTRAIN_DECL ConvShape Conv2d::shape(std::int64_t batch) const noexcept {
    return {batch,
            in_,
            image_.h,
            image_.w,
            out_,
            kernel_.h,
            kernel_.w,
            options_.stride.h,
            options_.stride.w,
            options_.padding.h,
            options_.padding.w,
            options_.groups};
  }

  DTRAIN_DECL std::vector<ParamSpec> Conv2d::params() const {
    const std::int64_t fan_in = in_ / options_.groups * kernel_.h * kernel_.w;
    std::vector<ParamSpec> specs{{"weight",
                                  {out_, in_ / options_.groups, kernel_.h, kernel_.w},
                                  Init::fan_in_uniform(fan_in),
                                  options_.trainable}};
    if (options_.bias)
      specs.push_back({"bias", {out_}, Init::fan_in_uniform(fan_in), options_.trainable, {}, {"bias"}});
    return specs;
  }

  DTRAIN_DECL void Conv2d::input_mismatch(std::int64_t in) const {
    throw config_error("nn::Conv2d expects " + std::to_string(in_) + " channels of " + detail::extent_text(image_) +
                           " images, " + std::to_string(in_ * image_.h * image_.w) +
                           " values per row (NCHW), got rows of " + std::to_string(in),
                       "give one flattened [channels, height, width] image per row, or build the Conv2d for the "
                       "images' size");
  }

}  // namespace dtrain::nn

DTRAIN_IMPL_END
