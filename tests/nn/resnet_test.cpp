// nn::ResNetStem, nn::BasicBlock and nn::ResNetTrunk (nn/resnet.hpp) on
// dtrain::Host in fp32 against float64 references written here from the
// textbook loops (tests/nn/vision_reference.hpp's direct convolution and its
// adjoint, the batch norm formula and its analytic gradient, ReLU, max
// pooling with the first maximum), over random non-zero inputs and
// parameters, running statistics included (running_var positive):
//  - a block with a downsample (stride 2, 3 -> 4 channels), one with a
//    downsample at stride 1 (3 -> 5 channels), one without (4 -> 4), and the
//    stem, each with frozen norms (nn::FrozenBatchNorm2d) and with batch
//    norms (nn::BatchNorm2d, the batch's statistics in training): forward,
//    the input gradient and every trainable parameter's gradient;
//    tolerances relative to the largest reference element: 2e-5 forward,
//    1e-4 gradients (fp32 against float64 through several parts);
//  - frozen blocks (trainable = false) give no parameter gradients, the
//    input gradient still exact; a frozen first unit without dx returns;
//  - torchvision's parameter names and LeRobot's keys, the trunk's prefixes,
//    channels and feature-map extents, resnet18's parameter count;
//  - the whole resnet18 trunk over 2 x 3 x 64 x 64 images in fp32: a
//    512 x 2 x 2 feature map, finite values and gradients, frozen parameters
//    without gradients.
#define BOOST_TEST_MODULE resnet
#include "dtrain/nn/resnet.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include "nn/unit_harness.hpp"
#include "nn/vision_reference.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"

namespace {

namespace t = dtrain::testing;
using dtrain::nn::BasicBlock;
using dtrain::nn::Extent2;
using dtrain::nn::ResNetNorm;
using dtrain::nn::ResNetOptions;
using dtrain::nn::ResNetStem;
using dtrain::nn::ResNetTrunk;
using V = std::vector<double>;
using Params = std::vector<V>;

static_assert(dtrain::Unit<BasicBlock, dtrain::Host, float> && dtrain::Unit<BasicBlock, dtrain::Host, dtrain::bf16>);
static_assert(dtrain::Unit<ResNetStem, dtrain::Host, float> && dtrain::Unit<ResNetStem, dtrain::Host, dtrain::fp16>);

constexpr double forward_tol = 2e-5, grad_tol = 1e-4;
constexpr double eps = 1e-5;

// ---- float64 references ----------------------------------------------------

// Images: batch x channels x h x w.
struct Dims {
  std::int64_t batch, channels, h, w;
  std::int64_t plane() const { return h * w; }
};

t::ConvCase conv_case(Dims in, std::int64_t out, std::int64_t kernel, std::int64_t stride, std::int64_t pad) {
  return {in.batch, in.channels, in.h, in.w, out, kernel, kernel, stride, stride, pad, pad, 1, false};
}

// p: weight, bias, running_mean, running_var (from `first` in `params`).
struct Norm {
  Dims d;
  bool batch_stats;
  std::vector<double> mean, rstd;  // per channel, filled by forward

  V forward(const Params& params, std::size_t first, const V& x) {
    const V &w = params[first], &b = params[first + 1], &rm = params[first + 2], &rv = params[first + 3];
    mean.assign(static_cast<std::size_t>(d.channels), 0.0);
    rstd.assign(mean.size(), 0.0);
    V y(x.size());
    for (std::int64_t c = 0; c < d.channels; ++c) {
      const auto cc = static_cast<std::size_t>(c);
      double m = rm[cc], var = rv[cc];
      if (batch_stats) {
        m = var = 0.0;
        each(c, [&](std::size_t i) { m += x[i]; });
        m /= count();
        each(c, [&](std::size_t i) { var += (x[i] - m) * (x[i] - m); });
        var /= count();
      }
      mean[cc] = m;
      rstd[cc] = 1.0 / std::sqrt(var + eps);
      each(c, [&](std::size_t i) { y[i] = (x[i] - m) * rstd[cc] * w[cc] + b[cc]; });
    }
    return y;
  }

  // dx, and dweight, dbias into grads[first], grads[first + 1].
  V backward(const Params& params, std::size_t first, const V& x, const V& dy, Params& grads) const {
    const V& w = params[first];
    V dx(x.size()), dw(w.size(), 0.0), db(w.size(), 0.0);
    for (std::int64_t c = 0; c < d.channels; ++c) {
      const auto cc = static_cast<std::size_t>(c);
      const auto xhat = [&](std::size_t i) { return (x[i] - mean[cc]) * rstd[cc]; };
      each(c, [&](std::size_t i) {
        dw[cc] += dy[i] * xhat(i);
        db[cc] += dy[i];
      });
      // batch statistics: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w
      const double mg = batch_stats ? w[cc] * db[cc] / count() : 0.0;
      const double mgx = batch_stats ? w[cc] * dw[cc] / count() : 0.0;
      each(c, [&](std::size_t i) { dx[i] = rstd[cc] * (dy[i] * w[cc] - mg - xhat(i) * mgx); });
    }
    grads[first] = dw;
    grads[first + 1] = db;
    return dx;
  }

 private:
  double count() const { return static_cast<double>(d.batch * d.plane()); }
  template <class F>
  void each(std::int64_t c, F f) const {
    for (std::int64_t n = 0; n < d.batch; ++n)
      for (std::int64_t i = 0; i < d.plane(); ++i) f(static_cast<std::size_t>((n * d.channels + c) * d.plane() + i));
  }
};

V relu(const V& x) {
  V y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = std::max(x[i], 0.0);
  return y;
}

// dy where the ReLU's output y is positive.
V relu_backward(const V& y, const V& dy) {
  V dx(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) dx[i] = y[i] > 0 ? dy[i] : 0.0;
  return dx;
}

V add(const V& a, const V& b) {
  V s(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) s[i] = a[i] + b[i];
  return s;
}

// The reference of a block: forward keeps the intermediates, backward gives
// dx and the gradient of every parameter (the norms' weight and bias too).
struct BlockRef {
  Dims in;
  std::int64_t out_channels, stride;
  bool batch_stats;

  bool down() const { return stride != 1 || in.channels != out_channels; }
  t::ConvCase k1() const { return conv_case(in, out_channels, 3, stride, 1); }
  Dims mid() const { return {in.batch, out_channels, k1().out_h(), k1().out_w()}; }
  t::ConvCase k2() const { return conv_case(mid(), out_channels, 3, 1, 1); }
  t::ConvCase kd() const { return conv_case(in, out_channels, 1, stride, 0); }

  Norm n1{}, n2{}, nd{};
  V x{}, a1{}, r1{}, a2{}, d{}, z{}, y{};

  V forward(const Params& p, const V& input) {
    x = input;
    n1 = n2 = nd = Norm{mid(), batch_stats, {}, {}};
    a1 = t::conv_forward_reference(k1(), {p[0]}, x);
    r1 = relu(n1.forward(p, 1, a1));
    a2 = t::conv_forward_reference(k2(), {p[5]}, r1);
    const V h2 = n2.forward(p, 6, a2);
    if (down()) {
      d = t::conv_forward_reference(kd(), {p[10]}, x);
      z = add(h2, nd.forward(p, 11, d));
    } else {
      z = add(h2, x);
    }
    y = relu(z);
    return y;
  }

  std::pair<V, Params> backward(const Params& p, const V& dy) {
    Params g(p.size());
    const V dz = relu_backward(y, dy);
    V dx_short = dz;
    if (down()) {
      const V dd = nd.backward(p, 11, d, dz, g);
      const t::ConvGrads cd = t::conv_backward_reference(kd(), {p[10]}, x, dd);
      g[10] = cd.dweight;
      dx_short = cd.dx;
    }
    const t::ConvGrads c2 = t::conv_backward_reference(k2(), {p[5]}, r1, n2.backward(p, 6, a2, dz, g));
    g[5] = c2.dweight;
    const t::ConvGrads c1 =
        t::conv_backward_reference(k1(), {p[0]}, x, n1.backward(p, 1, a1, relu_backward(r1, c2.dx), g));
    g[0] = c1.dweight;
    return {add(c1.dx, dx_short), g};
  }
};

// The stem: conv 7x7/2 pad 3, norm, ReLU, max pool 3x3/2 pad 1.
struct StemRef {
  Dims in;
  bool batch_stats;

  t::ConvCase k() const { return conv_case(in, 64, 7, 2, 3); }
  Dims mid() const { return {in.batch, 64, k().out_h(), k().out_w()}; }
  std::int64_t pool_h() const { return (mid().h + 2 - 3) / 2 + 1; }
  std::int64_t pool_w() const { return (mid().w + 2 - 3) / 2 + 1; }

  Norm n{};
  V x{}, a{}, r{};
  std::vector<std::size_t> arg{};  // each output's maximum in r

  V forward(const Params& p, const V& input) {
    x = input;
    n = Norm{mid(), batch_stats, {}, {}};
    a = t::conv_forward_reference(k(), {p[0]}, x);
    r = relu(n.forward(p, 1, a));
    const Dims m = mid();
    arg.clear();
    V y;
    for (std::int64_t plane = 0; plane < m.batch * m.channels; ++plane)
      for (std::int64_t oh = 0; oh < pool_h(); ++oh)
        for (std::int64_t ow = 0; ow < pool_w(); ++ow) {
          std::size_t best = 0;
          bool found = false;
          for (std::int64_t i = oh * 2 - 1; i < oh * 2 + 2; ++i)
            for (std::int64_t j = ow * 2 - 1; j < ow * 2 + 2; ++j) {
              if (i < 0 || i >= m.h || j < 0 || j >= m.w) continue;
              const auto at = static_cast<std::size_t>((plane * m.h + i) * m.w + j);
              if (!found || r[at] > r[best]) best = at;
              found = true;
            }
          arg.push_back(best);
          y.push_back(r[best]);
        }
    return y;
  }

  std::pair<V, Params> backward(const Params& p, const V& dy) {
    Params g(p.size());
    V dr(r.size(), 0.0);
    for (std::size_t o = 0; o < arg.size(); ++o) dr[arg[o]] += dy[o];
    const t::ConvGrads c = t::conv_backward_reference(k(), {p[0]}, x, n.backward(p, 1, a, relu_backward(r, dr), g));
    g[0] = c.dweight;
    return {c.dx, g};
  }
};

// ---- running the units ---------------------------------------------------------

// A case with random running statistics (running_var positive, as loaded).
template <class U>
t::UnitCase resnet_case(const U& unit, std::int64_t batch, std::int64_t in, std::uint64_t seed) {
  t::UnitCase c = t::make_case(unit, batch, in, seed);
  for (std::size_t i = 0; i < c.specs.size(); ++i)
    if (c.specs[i].name.ends_with("running_var"))
      for (double& v : c.params[i]) v = 0.5 + std::abs(v);
  return t::rounded<float>(std::move(c));
}

template <class U, class Ref>
void check_against(U unit, Ref ref, std::int64_t batch, std::int64_t in, bool trainable) {
  dtrain::Host dev(1);
  const t::UnitCase c = resnet_case(unit, batch, in, 7);
  const t::UnitResult r = t::run_unit<float>(dev, unit, c);  // a training call
  t::expect_close(r.y, ref.forward(c.params, c.x), forward_tol, "forward");
  const auto [dx, grads] = ref.backward(c.params, c.dy);
  t::expect_close(r.dx, dx, grad_tol, "input gradient");
  for (std::size_t i = 0; i < c.specs.size(); ++i) {
    BOOST_TEST_CONTEXT(c.specs[i].name) {
      if (c.specs[i].trainable) {
        BOOST_TEST(trainable);
        BOOST_TEST_REQUIRE(!grads[i].empty(), "the reference has this gradient");
        t::expect_close(r.grads[i], grads[i], grad_tol, c.specs[i].name + " gradient");
      } else {
        BOOST_TEST(r.grads[i].empty(), "frozen: no gradient");
      }
    }
  }
}

struct BlockCase {
  std::int64_t batch, in_channels, out_channels, stride, h, w;
};

void check_block(const BlockCase& k, ResNetNorm norm, bool trainable = true) {
  const bool batch = norm == ResNetNorm::batch;
  BOOST_TEST_CONTEXT(k.batch << "x" << k.in_channels << "x" << k.h << "x" << k.w << " -> " << k.out_channels
                             << ", stride " << k.stride << (batch ? ", batch norm" : ", frozen norm")
                             << (trainable ? "" : ", frozen convolutions")) {
    const BasicBlock unit(k.in_channels, k.out_channels, k.stride, {k.h, k.w}, {.norm = norm, .trainable = trainable});
    BlockRef ref{{k.batch, k.in_channels, k.h, k.w}, k.out_channels, k.stride, batch};
    BOOST_TEST(unit.has_downsample() == ref.down());
    BOOST_TEST(unit.saved_size({k.batch, 1}, 0) ==
               k.batch * (6 * k.out_channels * ref.mid().plane() + (ref.down() ? k.in_channels * k.h * k.w : 0)));
    check_against(unit, ref, k.batch, k.in_channels * k.h * k.w, trainable);
  }
}

void check_stem(Dims d, ResNetNorm norm, bool trainable = true) {
  const bool batch = norm == ResNetNorm::batch;
  BOOST_TEST_CONTEXT(d.batch << "x3x" << d.h << "x" << d.w << (batch ? ", batch norm" : ", frozen norm")) {
    const ResNetStem unit({d.h, d.w}, {.norm = norm, .trainable = trainable});
    check_against(unit, StemRef{d, batch}, d.batch, 3 * d.h * d.w, trainable);
  }
}

const std::vector<BlockCase> block_cases{
    {2, 3, 4, 2, 12, 10},  // a downsample: layer2.0's shape
    {2, 3, 5, 1, 7, 9},    // a downsample at stride 1 (channels change)
    {2, 4, 4, 1, 12, 10},  // identity shortcut
    {3, 2, 2, 2, 5, 7},    // odd extents, stride 2 with equal channels
};

}  // namespace

BOOST_AUTO_TEST_SUITE(basic_block)

BOOST_AUTO_TEST_CASE(frozen_norm_matches_float64) {
  for (const auto& k : block_cases) check_block(k, ResNetNorm::frozen);
}

BOOST_AUTO_TEST_CASE(batch_norm_matches_float64) {
  for (const auto& k : block_cases) check_block(k, ResNetNorm::batch);
}

BOOST_AUTO_TEST_CASE(frozen_convolutions_give_no_gradients) {
  check_block(block_cases[0], ResNetNorm::frozen, false);
  check_block(block_cases[2], ResNetNorm::batch, false);
}

BOOST_AUTO_TEST_CASE(declares_torchvision_parameters) {
  const auto down = BasicBlock(64, 128, 2, {24, 24}).params();
  const std::vector<std::string> names{"conv1.weight",
                                       "bn1.weight",
                                       "bn1.bias",
                                       "bn1.running_mean",
                                       "bn1.running_var",
                                       "conv2.weight",
                                       "bn2.weight",
                                       "bn2.bias",
                                       "bn2.running_mean",
                                       "bn2.running_var",
                                       "downsample.0.weight",
                                       "downsample.1.weight",
                                       "downsample.1.bias",
                                       "downsample.1.running_mean",
                                       "downsample.1.running_var"};
  BOOST_TEST_REQUIRE(down.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) BOOST_TEST(down[i].name == names[i]);
  BOOST_TEST((down[0].shape == std::vector<std::int64_t>{128, 64, 3, 3}));
  BOOST_TEST((down[5].shape == std::vector<std::int64_t>{128, 128, 3, 3}));
  BOOST_TEST((down[10].shape == std::vector<std::int64_t>{128, 64, 1, 1}));
  BOOST_TEST(down[0].trainable);
  for (std::size_t i : {1, 2, 3, 4, 11, 12}) BOOST_TEST(!down[i].trainable, names[i] << " frozen by default");
  const auto batch = BasicBlock(64, 128, 2, {24, 24}, {.norm = ResNetNorm::batch}).params();
  BOOST_TEST((batch[1].trainable && batch[2].trainable && !batch[3].trainable && !batch[4].trainable));
  const auto frozen = BasicBlock(64, 128, 2, {24, 24}, {.norm = ResNetNorm::batch, .trainable = false}).params();
  for (const auto& s : frozen) BOOST_TEST(!s.trainable, s.name);
  BOOST_TEST(BasicBlock(64, 64, 1, {24, 24}).params().size() == 10u);
  BOOST_TEST(BasicBlock(64, 128, 2, {24, 24}).out_features(64 * 24 * 24) == 128 * 12 * 12);
  BOOST_CHECK_THROW(BasicBlock(64, 64, 1, {24, 24}).out_features(64 * 24 * 23), dtrain::config_error);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(resnet_stem)

BOOST_AUTO_TEST_CASE(frozen_norm_matches_float64) { check_stem({2, 3, 12, 10}, ResNetNorm::frozen); }

BOOST_AUTO_TEST_CASE(batch_norm_matches_float64) { check_stem({2, 3, 9, 14}, ResNetNorm::batch); }

BOOST_AUTO_TEST_CASE(frozen_convolution_gives_no_gradients) { check_stem({1, 3, 8, 8}, ResNetNorm::frozen, false); }

BOOST_AUTO_TEST_CASE(declares_torchvision_parameters) {
  const ResNetStem stem({96, 96});
  const auto specs = stem.params();
  const std::vector<std::string> names{"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"};
  BOOST_TEST_REQUIRE(specs.size() == names.size());
  for (std::size_t i = 0; i < names.size(); ++i) BOOST_TEST(specs[i].name == names[i]);
  BOOST_TEST((specs[0].shape == std::vector<std::int64_t>{64, 3, 7, 7}));
  BOOST_TEST((stem.out_extent().h == 24 && stem.out_extent().w == 24));
  BOOST_TEST(stem.out_features(3 * 96 * 96) == 64 * 24 * 24);
  BOOST_TEST(stem.saved_size({2, 1}, 3 * 96 * 96) == 4 * 2 * 64 * 48 * 48);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// Runs the trunk's units forward over x, then backward from a random dy
// (dx empty for the stem, as the first unit); returns the feature map, every
// unit's gradients (downloaded; empty for frozen) and the input gradient of
// the first block.
struct TrunkRun {
  V y, block_dx;
  std::vector<Params> grads;
  std::vector<std::vector<dtrain::ParamSpec>> specs;
};

TrunkRun run_trunk(ResNetTrunk& trunk, std::int64_t batch, Extent2 image, bool training) {
  dtrain::Host dev(1);
  using buffer = dtrain::Host::buffer<float>;
  std::mt19937_64 rng(11);
  const std::int64_t n = static_cast<std::int64_t>(trunk.size());
  std::vector<t::UnitCase> cases;
  std::vector<t::DeviceParams<float, dtrain::Host>> params;
  cases.reserve(trunk.size());
  params.reserve(trunk.size());
  std::vector<buffer> acts, saved;  // acts[i]: unit i's input; acts[n]: the output
  std::vector<std::int64_t> widths{3 * image.h * image.w};
  acts.push_back(t::upload<float>(dev, t::random_nonzero(static_cast<std::size_t>(batch * widths[0]), rng)));
  TrunkRun out;
  auto each = [&](auto&& f) {
    f(0, trunk.stem);
    for (std::size_t b = 0; b < trunk.blocks.size(); ++b) f(static_cast<std::int64_t>(b + 1), trunk.blocks[b]);
  };
  each([&](std::int64_t i, auto& unit) {
    t::UnitCase c;
    c.specs = unit.params();
    for (const auto& s : c.specs) {
      // He-like scale keeps activations of order one through 17 convolutions
      V v = t::random_nonzero(static_cast<std::size_t>(s.numel()), rng, 1.0 / std::sqrt(s.numel() / s.shape[0]));
      if (s.name.ends_with("running_var") || s.name.ends_with("bn1.weight") || s.name.ends_with("bn2.weight"))
        for (double& e : v) e = 0.5 + std::abs(e) * std::sqrt(s.numel() / s.shape[0]);
      c.params.push_back(std::move(v));
    }
    cases.push_back(c);
    params.emplace_back(dev, cases.back());
    const std::int64_t in = widths.back(), width = unit.out_features(in);
    widths.push_back(width);
    acts.push_back(dtrain::make_buffer<float>(dev, static_cast<std::size_t>(batch * width)));
    saved.push_back(dtrain::make_buffer<float>(dev, static_cast<std::size_t>(unit.saved_size({batch, 1}, in))));
    const dtrain::UnitContext<float> ctx{
        {batch, 1}, saved.back().view(1, static_cast<std::int64_t>(saved.back().size())), training, 0, nullptr};
    unit.template forward<dtrain::Host, float>(dev, params.back().values, std::as_const(acts[i]).view(batch, in),
                                               acts[i + 1].view(batch, width), ctx);
  });
  out.y = t::download<float>(dev, acts[n]);
  buffer dy = t::upload<float>(dev, t::random_nonzero(static_cast<std::size_t>(batch * widths[n]), rng));
  std::vector<buffer> dxs(static_cast<std::size_t>(n));
  // backward in reverse order
  std::vector<std::function<void()>> steps;
  each([&](std::int64_t i, auto& unit) {
    steps.push_back([&, i] {
      const auto k = static_cast<std::size_t>(i);
      const std::int64_t in = widths[k], width = widths[k + 1];
      const buffer& g = k + 1 == static_cast<std::size_t>(n) ? dy : dxs[k + 1];
      if (i > 0) dxs[k] = dtrain::make_buffer<float>(dev, static_cast<std::size_t>(batch * in));
      const dtrain::UnitContext<float> ctx{
          {batch, 1}, saved[k].view(1, static_cast<std::int64_t>(saved[k].size())), training, 0, nullptr};
      unit.template backward<dtrain::Host, float>(dev, params[k].values, params[k].grad_views,
                                                  std::as_const(acts[k]).view(batch, in),
                                                  std::as_const(acts[k + 1]).view(batch, width), g.view(batch, width),
                                                  i > 0 ? dxs[k].view(batch, in) : dtrain::MatView<float>{}, ctx);
    });
  });
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) (*it)();
  out.block_dx = t::download<float>(dev, dxs[1]);
  for (std::size_t k = 0; k < params.size(); ++k) {
    Params g;
    for (const auto& b : params[k].grads) g.push_back(t::download<float>(dev, b));
    out.grads.push_back(std::move(g));
    out.specs.push_back(cases[k].specs);
  }
  return out;
}

bool all_finite(const V& v) {
  return std::all_of(v.begin(), v.end(), [](double e) { return std::isfinite(e); });
}

void check_trunk(ResNetOptions options) {
  const Extent2 image{64, 64};
  ResNetTrunk trunk = dtrain::nn::resnet18_units(image, options);
  BOOST_TEST_REQUIRE(trunk.size() == 9u);
  BOOST_TEST((trunk.out_channels() == 512 && trunk.out_extent().h == 2 && trunk.out_extent().w == 2));
  const TrunkRun r = run_trunk(trunk, 2, image, true);
  BOOST_TEST(r.y.size() == 2u * 512 * 2 * 2);
  BOOST_TEST(all_finite(r.y));
  BOOST_TEST(std::any_of(r.y.begin(), r.y.end(), [](double e) { return e > 0; }), "the feature map is not all zero");
  BOOST_TEST(all_finite(r.block_dx));
  BOOST_TEST(std::any_of(r.block_dx.begin(), r.block_dx.end(), [](double e) { return e != 0; }));
  for (std::size_t k = 0; k < r.grads.size(); ++k)
    for (std::size_t i = 0; i < r.grads[k].size(); ++i) {
      BOOST_TEST_CONTEXT(trunk.torchvision_name(k, r.specs[k][i].name)) {
        if (r.specs[k][i].trainable) {
          BOOST_TEST(r.grads[k][i].size() == static_cast<std::size_t>(r.specs[k][i].numel()));
          BOOST_TEST(all_finite(r.grads[k][i]));
        } else {
          BOOST_TEST(r.grads[k][i].empty());
        }
      }
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(resnet18_trunk)

BOOST_AUTO_TEST_CASE(runs_over_64x64_images) { check_trunk({}); }

BOOST_AUTO_TEST_CASE(frozen_backbone_runs_over_64x64_images) {
  check_trunk({.trainable = false});
  check_trunk({.norm = ResNetNorm::batch});
}

BOOST_AUTO_TEST_CASE(names_prefixes_and_extents) {
  const ResNetTrunk trunk = dtrain::nn::resnet18_units({96, 96});
  const std::vector<std::string> prefixes{"",         "layer1.0", "layer1.1", "layer2.0", "layer2.1",
                                          "layer3.0", "layer3.1", "layer4.0", "layer4.1"};
  BOOST_TEST_REQUIRE(trunk.size() == prefixes.size());
  for (std::size_t i = 0; i < prefixes.size(); ++i) BOOST_TEST(trunk.prefix(i) == prefixes[i]);
  BOOST_CHECK_THROW(trunk.prefix(9), dtrain::config_error);
  BOOST_TEST(trunk.torchvision_name(0, "conv1.weight") == "conv1.weight");
  BOOST_TEST("model.backbone." + trunk.torchvision_name(0, "bn1.weight") == "model.backbone.bn1.weight");
  BOOST_TEST("model.backbone." + trunk.torchvision_name(3, "downsample.1.running_var") ==
             "model.backbone.layer2.0.downsample.1.running_var");
  BOOST_TEST((trunk.out_channels() == 512 && trunk.out_extent().h == 3 && trunk.out_extent().w == 3));
  BOOST_TEST(trunk.out_features() == 512 * 9);
  const Extent2 e64 = dtrain::nn::resnet_out_extent({64, 64}), e96 = dtrain::nn::resnet_out_extent({96, 96}),
                odd = dtrain::nn::resnet_out_extent({480, 640});
  BOOST_TEST((e64.h == 2 && e64.w == 2 && e96.h == 3 && e96.w == 3 && odd.h == 15 && odd.w == 20));
  const ResNetTrunk wide = dtrain::nn::resnet18_units({480, 640});
  BOOST_TEST((wide.out_extent().h == 15 && wide.out_extent().w == 20));
  // the blocks' shapes and downsamples, as torchvision's
  for (std::size_t b = 0; b < trunk.blocks.size(); ++b)
    BOOST_TEST(trunk.blocks[b].has_downsample() == (b == 2 || b == 4 || b == 6), "block " << b);
  // resnet18 without fc: 11,176,512 weights and biases, 9,600 running statistics
  std::int64_t learnable = 0, stats = 0, count = 0;
  auto add = [&](const std::vector<dtrain::ParamSpec>& specs) {
    for (const auto& s : specs) {
      (s.name.find("running_") != std::string::npos ? stats : learnable) += s.numel();
      ++count;
    }
  };
  add(trunk.stem.params());
  for (const auto& b : trunk.blocks) add(b.params());
  BOOST_TEST(learnable == 11176512);
  BOOST_TEST(stats == 9600);
  BOOST_TEST(count == 100);  // torchvision's state_dict without fc and num_batches_tracked
  BOOST_TEST(dtrain::nn::resnet34_units({64, 64}).size() == 17u);
  BOOST_TEST(dtrain::nn::resnet34_units({64, 64}).prefix(16) == "layer4.2");
}

BOOST_AUTO_TEST_SUITE_END()
