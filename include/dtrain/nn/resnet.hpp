#pragma once
// ResNet's stem and basic block as composite units, and a ResNet-18 (or -34)
// trunk of them, with torchvision's layout and parameter names: the backbone
// of LeRobot's ACT policy (torchvision.models.resnet18 with
// norm_layer=FrozenBatchNorm2d, IntermediateLayerGetter returning layer4's
// feature map; no avgpool, no fc).
//
// Like nn::Conv2d every unit is built for one image size and reads one image
// per row: x [batch, channels * height * width], NCHW flattened.
//
// nn::ResNetStem(image, options): 3 -> 64 channels, image -> out_extent()
//   y = maxpool(relu(bn1(conv1(x))))
//   conv1 7x7, stride 2, padding 3, no bias; maxpool 3x3, stride 2, padding 1
//   params conv1.weight, bn1.weight, bn1.bias, bn1.running_mean, bn1.running_var
//   saved  4 * rows * 64 * conv_h * conv_w (conv_h, conv_w: conv1's output):
//          conv1's output, the ReLU's, and two buffers for the gradients
//          that flow between the parts in backward
//
// nn::BasicBlock(in_channels, out_channels, stride, image, options):
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
//   conv1 3x3 stride `stride` padding 1, conv2 3x3 stride 1 padding 1, no
//   biases; shortcut = x when stride == 1 and in_channels == out_channels,
//   else downsample = bn(conv 1x1 stride `stride`, no bias)
//   params conv1.weight, bn1.{weight,bias,running_mean,running_var},
//          conv2.weight, bn2.*, then downsample.0.weight, downsample.1.*
//   saved  rows * (6 * out + (downsample ? in : 0)), out = out_channels *
//          out_h * out_w, in = in_channels * h * w: conv1's output, the
//          first ReLU's, conv2's output, two gradient buffers, then the
//          identity block's third gradient buffer, or the downsample's
//          convolution output and the input gradient of the downsample
//          path (input-sized)
//
// ResNetOptions:
//   norm       ResNetNorm::frozen (nn::FrozenBatchNorm2d: LeRobot's ACT) or
//              ResNetNorm::batch (nn::BatchNorm2d: the batch's statistics
//              per rank in a training forward, the running ones otherwise;
//              running statistics never updated, see nn/batch_norm.hpp)
//   trainable  false freezes the convolutions (and the batch norms'
//              weight and bias); the running statistics are always frozen
//   eps        the norms' (torchvision's 1e-5)
//
// Backward is exact: every part's backward runs on the activations kept in
// ctx.saved; it overwrites the gradients of the trainable parameters and
// skips the frozen ones (empty views). A unit with no trainable parameter
// and no input gradient to give returns at once.
//
// nn::ResNetTrunk: the stem and the blocks as units (units() ties them, a
// model's units() may hold `stem` and `blocks`), resnet18_units(image,
// options) (layers 2, 2, 2, 2) and resnet34_units (3, 4, 6, 3);
// prefix(i) is unit i's torchvision prefix ("" for the stem, "layer2.0" for
// the third block of resnet18), torchvision_name(i, "bn1.weight") the
// state-dict key ("bn1.weight", "layer2.0.bn1.weight"); LeRobot's ACT keys
// are "model.backbone." + that. out_channels() = 512, out_extent() = layer4's
// feature map (3 x 3 for 96 x 96 images, 2 x 2 for 64 x 64).
//
// On a GPU the units run only with DTRAIN_GPU_VISION=on (nn/convolution.hpp).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/batch_norm.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/pooling.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::nn {

enum class ResNetNorm {
  frozen,  // nn::FrozenBatchNorm2d (torchvision.ops.FrozenBatchNorm2d)
  batch,   // nn::BatchNorm2d, per-rank batch statistics in training
};

struct ResNetOptions {
  ResNetNorm norm = ResNetNorm::frozen;
  bool trainable = true;  // false freezes the convolutions and the norms' weight and bias
  float eps = 1e-5f;
};

namespace detail {

// A ResNet norm: FrozenBatchNorm2d's or BatchNorm2d's computation, chosen by
// ResNetOptions::norm, with their parameters and messages.
class ResNetNormPart {
 public:
  ResNetNormPart(std::int64_t channels, Extent2 image, const ResNetOptions& o)
      : norm_(o.norm == ResNetNorm::batch ? "nn::BatchNorm2d" : "nn::FrozenBatchNorm2d", channels, image, o.eps),
        batch_(o.norm == ResNetNorm::batch),
        trainable_(batch_ && o.trainable) {}

  std::vector<ParamSpec> params() const { return norm_.params(trainable_); }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, bool training) const {
    norm_.forward(dev, p, x, y, batch_ && training);
  }
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> dy,
                MatView<T> dx, bool training) const {
    norm_.backward(dev, p, grad, x, dy, dx, batch_ && training);
  }

 private:
  ChannelNorm norm_;
  bool batch_, trainable_;
};

// Whether any gradient view is non-empty (a trainable parameter).
template <class T>
bool any_gradient(UnitParams<T> grad) {
  for (const auto& g : grad)
    if (!g.empty()) return true;
  return false;
}

inline constexpr std::size_t norm_params = 4;  // weight, bias, running_mean, running_var

}  // namespace detail

class ResNetStem {
 public:
  static constexpr std::int64_t in_channels = 3, channels = 64;

  // `image`: the height and width of the input images.
  explicit ResNetStem(Extent2 image, ResNetOptions options = {})
      : image_(image),
        conv1_(in_channels, channels, {7, 7}, image,
               {.stride = {2, 2}, .padding = {3, 3}, .bias = false, .trainable = options.trainable}),
        bn1_(channels, {conv1_.out_h(), conv1_.out_w()}, options),
        pool_(channels, {3, 3}, {conv1_.out_h(), conv1_.out_w()}, {.stride = Extent2{2, 2}, .padding = {1, 1}}) {}

  std::int64_t out_channels() const noexcept { return channels; }
  Extent2 out_extent() const noexcept { return {pool_.out_h(), pool_.out_w()}; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "conv1", conv1_.params());
    detail::append_params(out, "bn1", bn1_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const { return pool_.out_features(conv1_.out_features(in)); }
  std::int64_t saved_size(SeqShape s, std::int64_t) const { return 4 * s.rows() * conv_size(); }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::ResNetStem");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_shape("nn::ResNetStem", "output", y, x.rows, channels * pool_.out_h() * pool_.out_w());
    conv1_.template forward<Dev, T>(dev, p.subspan(0, 1), x, s.a);
    bn1_.forward<Dev, T>(dev, p.subspan(1, detail::norm_params), s.a, s.g1, ctx.training);
    relu_.template forward<Dev, T>(dev, {}, s.g1, s.r);
    pool_.template forward<Dev, T>(dev, {}, s.r, y);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::ResNetStem");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::ResNetStem", "gradients", grad.size(), p.size());
    detail::check_shape("nn::ResNetStem", "output gradient", dy, x.rows, channels * pool_.out_h() * pool_.out_w());
    if (dx.empty() && !detail::any_gradient(grad)) return;  // a frozen first unit
    pool_.template backward<Dev, T>(dev, {}, {}, s.r, {}, dy, s.g1);
    relu_.template backward<Dev, T>(dev, {}, {}, s.r, s.r, s.g1, s.g2);
    bn1_.backward<Dev, T>(dev, p.subspan(1, detail::norm_params), grad.subspan(1, detail::norm_params), s.a, s.g2, s.g1,
                          ctx.training);
    conv1_.template backward<Dev, T>(dev, p.subspan(0, 1), grad.subspan(0, 1), x, {}, s.g1, dx);
  }

 private:
  template <class T>
  struct Parts {
    MatView<T> a, r, g1, g2;  // conv1's output, the ReLU's, gradient scratch
  };

  std::int64_t conv_size() const { return channels * conv1_.out_h() * conv1_.out_w(); }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::ResNetStem", "parameters", p.size(), 1 + detail::norm_params);
    detail::check_shape("nn::ResNetStem", "input", x, x.rows, in_channels * image_.h * image_.w);
    detail::check_saved("nn::ResNetStem", ctx.saved.size(), saved_size(SeqShape{x.rows, 1}, x.cols),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    detail::Carve<T> c(ctx.saved.data);
    const std::int64_t n = conv_size();
    Parts<T> s;
    s.a = {c.take(x.rows * n), x.rows, n};
    s.r = {c.take(x.rows * n), x.rows, n};
    s.g1 = {c.take(x.rows * n), x.rows, n};
    s.g2 = {c.take(x.rows * n), x.rows, n};
    return s;
  }

  Extent2 image_;
  Conv2d conv1_;
  detail::ResNetNormPart bn1_;
  ReLU relu_;
  MaxPool2d pool_;
};

class BasicBlock {
 public:
  // `image`: the height and width of the input images.
  BasicBlock(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride, Extent2 image,
             ResNetOptions options = {})
      : in_(in_channels),
        out_(out_channels),
        image_(image),
        down_(stride != 1 || in_channels != out_channels),
        conv1_(in_channels, out_channels, {3, 3}, image,
               {.stride = {stride, stride}, .padding = {1, 1}, .bias = false, .trainable = options.trainable}),
        bn1_(out_channels, {conv1_.out_h(), conv1_.out_w()}, options),
        conv2_(out_channels, out_channels, {3, 3}, {conv1_.out_h(), conv1_.out_w()},
               {.padding = {1, 1}, .bias = false, .trainable = options.trainable}),
        bn2_(out_channels, {conv1_.out_h(), conv1_.out_w()}, options),
        convd_(in_channels, out_channels, {1, 1}, image,
               {.stride = {stride, stride}, .bias = false, .trainable = options.trainable}),
        bnd_(out_channels, {convd_.out_h(), convd_.out_w()}, options) {
    if (stride < 1)
      throw config_error("nn::BasicBlock: stride " + std::to_string(stride) + " must be >= 1",
                         "give a positive stride (torchvision's are 1 and 2)");
  }

  std::int64_t in_channels() const noexcept { return in_; }
  std::int64_t out_channels() const noexcept { return out_; }
  Extent2 out_extent() const noexcept { return {conv1_.out_h(), conv1_.out_w()}; }
  bool has_downsample() const noexcept { return down_; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "conv1", conv1_.params());
    detail::append_params(out, "bn1", bn1_.params());
    detail::append_params(out, "conv2", conv2_.params());
    detail::append_params(out, "bn2", bn2_.params());
    if (down_) {
      detail::append_params(out, "downsample.0", convd_.params());
      detail::append_params(out, "downsample.1", bnd_.params());
    }
    return out;
  }
  std::int64_t out_features(std::int64_t in) const { return conv1_.out_features(in); }
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    return s.rows() * (6 * out_size() + (down_ ? in_size() : 0));
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::BasicBlock");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_shape("nn::BasicBlock", "output", y, x.rows, out_size());
    const auto n = static_cast<std::size_t>(x.rows * out_size());
    conv1_.template forward<Dev, T>(dev, p.subspan(conv1, 1), x, s.a1);
    bn1_.forward<Dev, T>(dev, p.subspan(bn1, detail::norm_params), s.a1, s.g1, ctx.training);
    relu_.template forward<Dev, T>(dev, {}, s.g1, s.r1);
    conv2_.template forward<Dev, T>(dev, p.subspan(conv2, 1), s.r1, s.a2);
    bn2_.forward<Dev, T>(dev, p.subspan(bn2, detail::norm_params), s.a2, s.g1, ctx.training);
    if (down_) {
      convd_.template forward<Dev, T>(dev, p.subspan(convd, 1), x, s.d);
      bnd_.forward<Dev, T>(dev, p.subspan(bnd, detail::norm_params), s.d, s.g2, ctx.training);
      dev.for_each(n, AddElements<T>{s.g1.data, s.g2.data, s.g1.data});
    } else {
      dev.for_each(n, AddElements<T>{s.g1.data, x.data, s.g1.data});
    }
    relu_.template forward<Dev, T>(dev, {}, s.g1, y);
  }

  // z = bn2(...) + shortcut, y = relu(z): dz flows into both paths; dx is
  // the main path's input gradient plus the shortcut's.
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    detail::check_vision_device<Dev>("nn::BasicBlock");
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::BasicBlock", "gradients", grad.size(), p.size());
    detail::check_shape("nn::BasicBlock", "output", y, x.rows, out_size());
    detail::check_shape("nn::BasicBlock", "output gradient", dy, x.rows, out_size());
    if (!dx.empty()) detail::check_shape("nn::BasicBlock", "input gradient", dx, x.rows, x.cols);
    if (dx.empty() && !detail::any_gradient(grad)) return;         // a frozen first unit
    relu_.template backward<Dev, T>(dev, {}, {}, y, y, dy, s.g1);  // dz
    if (down_) {
      bnd_.backward<Dev, T>(dev, p.subspan(bnd, detail::norm_params), grad.subspan(bnd, detail::norm_params), s.d, s.g1,
                            s.g2, ctx.training);
      convd_.template backward<Dev, T>(dev, p.subspan(convd, 1), grad.subspan(convd, 1), x, {}, s.g2,
                                       dx.empty() ? MatView<T>{} : s.dx_short);
    }
    bn2_.backward<Dev, T>(dev, p.subspan(bn2, detail::norm_params), grad.subspan(bn2, detail::norm_params), s.a2, s.g1,
                          s.g2, ctx.training);
    // dz is still needed at the end by the identity shortcut, not by the downsample's
    const MatView<T> g3 = down_ ? s.g1 : s.g3;
    conv2_.template backward<Dev, T>(dev, p.subspan(conv2, 1), grad.subspan(conv2, 1), s.r1, {}, s.g2, g3);
    relu_.template backward<Dev, T>(dev, {}, {}, s.r1, s.r1, g3, s.g2);
    bn1_.backward<Dev, T>(dev, p.subspan(bn1, detail::norm_params), grad.subspan(bn1, detail::norm_params), s.a1, s.g2,
                          g3, ctx.training);
    conv1_.template backward<Dev, T>(dev, p.subspan(conv1, 1), grad.subspan(conv1, 1), x, {}, g3, dx);
    if (!dx.empty())
      dev.for_each(static_cast<std::size_t>(dx.size()),
                   AddElements<T>{dx.data, down_ ? s.dx_short.data : s.g1.data, dx.data});
  }

 private:
  // The parts' first parameters.
  static constexpr std::size_t conv1 = 0, bn1 = 1, conv2 = bn1 + detail::norm_params, bn2 = conv2 + 1,
                               convd = bn2 + detail::norm_params, bnd = convd + 1;

  template <class T>
  struct Parts {
    MatView<T> a1, r1, a2;  // conv1's output, the first ReLU's, conv2's output
    MatView<T> g1, g2, g3;  // gradient scratch (g3 only without a downsample)
    MatView<T> d;           // the downsample convolution's output
    MatView<T> dx_short;    // the downsample path's input gradient
  };

  std::int64_t out_size() const { return out_ * conv1_.out_h() * conv1_.out_w(); }
  std::int64_t in_size() const { return in_ * image_.h * image_.w; }

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::BasicBlock", "parameters", p.size(), down_ ? bnd + detail::norm_params : convd);
    out_features(x.cols);
    detail::check_saved("nn::BasicBlock", ctx.saved.size(), saved_size(SeqShape{x.rows, 1}, x.cols),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    detail::Carve<T> c(ctx.saved.data);
    const std::int64_t n = out_size();
    auto mat = [&](std::int64_t cols) { return MatView<T>{c.take(x.rows * cols), x.rows, cols}; };
    Parts<T> s;
    s.a1 = mat(n);
    s.r1 = mat(n);
    s.a2 = mat(n);
    s.g1 = mat(n);
    s.g2 = mat(n);
    if (down_) {
      s.d = mat(n);
      s.dx_short = mat(in_size());
    } else {
      s.g3 = mat(n);
    }
    return s;
  }

  std::int64_t in_, out_;
  Extent2 image_;
  bool down_;
  Conv2d conv1_;
  detail::ResNetNormPart bn1_;
  Conv2d conv2_;
  detail::ResNetNormPart bn2_;
  Conv2d convd_;  // the downsample's, unused without one
  detail::ResNetNormPart bnd_;
  ReLU relu_;
};

// A ResNet trunk of basic blocks: the stem, then four layers of
// blocks_per_layer[i] blocks of 64, 128, 256 and 512 channels, the first
// block of layers 2-4 with stride 2. Unit 0 is the stem, unit 1 + j the
// j-th block (layer1.0, layer1.1, layer2.0, ... for resnet18).
class ResNetTrunk {
 public:
  ResNetTrunk(Extent2 image, std::array<std::int64_t, 4> blocks_per_layer, ResNetOptions options = {})
      : stem(image, options), layers_(blocks_per_layer) {
    std::int64_t channels = ResNetStem::channels;
    Extent2 extent = stem.out_extent();
    for (std::size_t l = 0; l < 4; ++l) {
      if (blocks_per_layer[l] < 1)
        throw config_error("nn::ResNetTrunk: layer" + std::to_string(l + 1) + " has " +
                               std::to_string(blocks_per_layer[l]) + " blocks",
                           "give every layer at least one block (resnet18: 2, 2, 2, 2)");
      const std::int64_t width = ResNetStem::channels << l;
      for (std::int64_t b = 0; b < blocks_per_layer[l]; ++b) {
        blocks.emplace_back(channels, width, b == 0 && l > 0 ? 2 : 1, extent, options);
        channels = width;
        extent = blocks.back().out_extent();
      }
    }
  }

  ResNetStem stem;
  std::vector<BasicBlock> blocks;

  // The units in order, for a model's units() (or tie stem and blocks there
  // beside the model's other units).
  auto units() { return std::tie(stem, blocks); }
  std::size_t size() const noexcept { return 1 + blocks.size(); }

  // Unit i's torchvision prefix: "" for the stem (conv1, bn1), "layer<l>.<b>"
  // for a block.
  std::string prefix(std::size_t unit) const {
    if (unit >= size())
      throw config_error("nn::ResNetTrunk::prefix: unit " + std::to_string(unit) + " of " + std::to_string(size()),
                         "number the units from 0 (the stem) to size() - 1");
    if (unit == 0) return "";
    auto j = static_cast<std::int64_t>(unit - 1);
    std::size_t l = 0;
    while (j >= layers_[l]) j -= layers_[l++];
    return "layer" + std::to_string(l + 1) + "." + std::to_string(j);
  }
  // The torchvision state-dict key of unit i's parameter `param` (a name
  // its params() declares): "conv1.weight", "layer2.0.downsample.1.running_var".
  std::string torchvision_name(std::size_t unit, std::string_view param) const {
    const std::string p = prefix(unit);
    return p.empty() ? std::string(param) : p + "." + std::string(param);
  }

  std::int64_t out_channels() const noexcept { return blocks.back().out_channels(); }
  // layer4's feature map: h x w of out_channels() values per image.
  Extent2 out_extent() const noexcept { return blocks.back().out_extent(); }
  std::int64_t out_features() const noexcept { return out_channels() * out_extent().h * out_extent().w; }

 private:
  std::array<std::int64_t, 4> layers_;
};

// torchvision's resnet18 and resnet34 trunks (layer4's output, no avgpool or fc).
inline ResNetTrunk resnet18_units(Extent2 image, ResNetOptions options = {}) {
  return ResNetTrunk(image, {2, 2, 2, 2}, options);
}
inline ResNetTrunk resnet34_units(Extent2 image, ResNetOptions options = {}) {
  return ResNetTrunk(image, {3, 4, 6, 3}, options);
}

// The feature map's extent a ResNet trunk gives images of `image`: the stem
// and three stride-2 layers each take h to (h - 1) / 2 + 1.
inline Extent2 resnet_out_extent(Extent2 image) {
  for (int i = 0; i < 5; ++i) image = {(image.h - 1) / 2 + 1, (image.w - 1) / 2 + 1};
  return image;
}

}  // namespace dtrain::nn
