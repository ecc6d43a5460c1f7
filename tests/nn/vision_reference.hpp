#pragma once
// Float64 references of the vision units, written as the textbook loops
// (independently of the library's im2col): a direct 2-D convolution and its
// three gradients, a vision transformer's patch tokens and theirs, and
// QuickGELU. Shared by the host tests (vision_test.cpp) and the GPU tests.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "nn/reference.hpp"

#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/patch_embedding.hpp"

namespace dtrain::testing {

// One convolution's configuration, as the tests name it.
struct ConvCase {
  std::int64_t batch, channels, height, width, out_channels, kernel_h, kernel_w;
  std::int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, groups = 1;
  bool bias = true;

  std::int64_t out_h() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  std::int64_t out_w() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  std::int64_t in_size() const { return channels * height * width; }
  std::int64_t out_size() const { return out_channels * out_h() * out_w(); }
  nn::Conv2d unit(bool trainable = true) const {
    return nn::Conv2d(channels, out_channels, {kernel_h, kernel_w}, {height, width},
                      {.stride = {stride_h, stride_w},
                       .padding = {pad_h, pad_w},
                       .groups = groups,
                       .bias = bias,
                       .trainable = trainable});
  }
};

struct ConvGrads {
  std::vector<double> dx, dweight, dbias;
};

// Calls f(n, o, oh, ow, c, r, q, x index, weight index) for every product
// x[n, c, ih, iw] * weight[o, c - group start, r, q] that output
// y[n, o, oh, ow] sums (the padding's zeros left out).
template <class F>
void conv_products(const ConvCase& k, F&& f) {
  const std::int64_t cg = k.channels / k.groups, og = k.out_channels / k.groups;
  for (std::int64_t n = 0; n < k.batch; ++n)
    for (std::int64_t o = 0; o < k.out_channels; ++o)
      for (std::int64_t oh = 0; oh < k.out_h(); ++oh)
        for (std::int64_t ow = 0; ow < k.out_w(); ++ow)
          for (std::int64_t cl = 0; cl < cg; ++cl)
            for (std::int64_t r = 0; r < k.kernel_h; ++r)
              for (std::int64_t q = 0; q < k.kernel_w; ++q) {
                const std::int64_t c = (o / og) * cg + cl;
                const std::int64_t ih = oh * k.stride_h - k.pad_h + r, iw = ow * k.stride_w - k.pad_w + q;
                if (ih < 0 || ih >= k.height || iw < 0 || iw >= k.width) continue;
                const std::int64_t out = ((n * k.out_channels + o) * k.out_h() + oh) * k.out_w() + ow;
                const std::int64_t in = ((n * k.channels + c) * k.height + ih) * k.width + iw;
                const std::int64_t w = ((o * cg + cl) * k.kernel_h + r) * k.kernel_w + q;
                f(static_cast<std::size_t>(out), static_cast<std::size_t>(in), static_cast<std::size_t>(w), o);
              }
}

// params: weight [out, channels / groups, kh, kw] (+ bias [out]).
inline std::vector<double> conv_forward_reference(const ConvCase& k, const std::vector<std::vector<double>>& p,
                                                  const std::vector<double>& x) {
  std::vector<double> y(static_cast<std::size_t>(k.batch * k.out_size()), 0.0);
  const std::int64_t positions = k.out_h() * k.out_w();
  if (k.bias)
    for (std::size_t i = 0; i < y.size(); ++i)
      y[i] = p[1][static_cast<std::size_t>((static_cast<std::int64_t>(i) / positions) % k.out_channels)];
  conv_products(k, [&](std::size_t out, std::size_t in, std::size_t w, std::int64_t) { y[out] += x[in] * p[0][w]; });
  return y;
}

// The gradients of sum(dy * y) by the adjoint loops of the forward.
inline ConvGrads conv_backward_reference(const ConvCase& k, const std::vector<std::vector<double>>& p,
                                         const std::vector<double>& x, const std::vector<double>& dy) {
  ConvGrads g{std::vector<double>(x.size(), 0.0), std::vector<double>(p[0].size(), 0.0),
              std::vector<double>(static_cast<std::size_t>(k.out_channels), 0.0)};
  conv_products(k, [&](std::size_t out, std::size_t in, std::size_t w, std::int64_t) {
    g.dx[in] += dy[out] * p[0][w];
    g.dweight[w] += dy[out] * x[in];
  });
  const std::int64_t positions = k.out_h() * k.out_w();
  for (std::size_t i = 0; i < dy.size(); ++i)
    g.dbias[static_cast<std::size_t>((static_cast<std::int64_t>(i) / positions) % k.out_channels)] += dy[i];
  return g;
}

// A patch embedding's configuration.
struct PatchCase {
  std::int64_t batch, channels, height, width, dim, patch;
  bool bias = true, class_token = true;

  std::int64_t grid_w() const { return width / patch; }
  std::int64_t patches() const { return (height / patch) * grid_w(); }
  std::int64_t first() const { return class_token ? 1 : 0; }
  std::int64_t tokens() const { return patches() + first(); }
  std::int64_t in_size() const { return channels * height * width; }
  nn::PatchEmbedding unit() const {
    return nn::PatchEmbedding(channels, dim, patch, {height, width}, {.bias = bias, .class_token = class_token});
  }
};

// Calls f(y index, x index, weight index, d) for every product of patch token
// y[n, first + p, d] = sum x[n, c, ph * patch + i, pw * patch + j] * weight[d, c, i, j].
template <class F>
void patch_products(const PatchCase& k, F&& f) {
  for (std::int64_t n = 0; n < k.batch; ++n)
    for (std::int64_t p = 0; p < k.patches(); ++p)
      for (std::int64_t d = 0; d < k.dim; ++d)
        for (std::int64_t c = 0; c < k.channels; ++c)
          for (std::int64_t i = 0; i < k.patch; ++i)
            for (std::int64_t j = 0; j < k.patch; ++j) {
              const std::int64_t h = (p / k.grid_w()) * k.patch + i, w = (p % k.grid_w()) * k.patch + j;
              f(static_cast<std::size_t>((n * k.tokens() + k.first() + p) * k.dim + d),
                static_cast<std::size_t>(((n * k.channels + c) * k.height + h) * k.width + w),
                static_cast<std::size_t>(((d * k.channels + c) * k.patch + i) * k.patch + j), d);
            }
}

// params in declaration order: weight, [bias], [class_embedding], position_embedding.
struct PatchParams {
  const std::vector<double>* weight = nullptr;
  const std::vector<double>* bias = nullptr;
  const std::vector<double>* cls = nullptr;
  const std::vector<double>* pos = nullptr;
};

inline PatchParams patch_params(const PatchCase& k, const std::vector<std::vector<double>>& p) {
  std::size_t i = 0;
  PatchParams out;
  out.weight = &p[i++];
  if (k.bias) out.bias = &p[i++];
  if (k.class_token) out.cls = &p[i++];
  out.pos = &p[i];
  return out;
}

inline std::vector<double> patch_forward_reference(const PatchCase& k, const std::vector<std::vector<double>>& params,
                                                   const std::vector<double>& x) {
  const PatchParams p = patch_params(k, params);
  std::vector<double> y(static_cast<std::size_t>(k.batch * k.tokens() * k.dim), 0.0);
  for (std::int64_t n = 0; n < k.batch; ++n)
    for (std::int64_t t = 0; t < k.tokens(); ++t)
      for (std::int64_t d = 0; d < k.dim; ++d) {
        double v = (*p.pos)[static_cast<std::size_t>(t * k.dim + d)];
        if (t < k.first())
          v += (*p.cls)[static_cast<std::size_t>(d)];
        else if (k.bias)
          v += (*p.bias)[static_cast<std::size_t>(d)];
        y[static_cast<std::size_t>((n * k.tokens() + t) * k.dim + d)] = v;
      }
  patch_products(
      k, [&](std::size_t out, std::size_t in, std::size_t w, std::int64_t) { y[out] += x[in] * (*p.weight)[w]; });
  return y;
}

// dx, then the gradient of each parameter in declaration order.
inline std::vector<std::vector<double>> patch_backward_reference(const PatchCase& k,
                                                                 const std::vector<std::vector<double>>& params,
                                                                 const std::vector<double>& x,
                                                                 const std::vector<double>& dy) {
  const PatchParams p = patch_params(k, params);
  std::vector<double> dx(x.size(), 0.0), dw(p.weight->size(), 0.0), db(static_cast<std::size_t>(k.dim), 0.0),
      dcls(static_cast<std::size_t>(k.dim), 0.0), dpos(p.pos->size(), 0.0);
  patch_products(k, [&](std::size_t out, std::size_t in, std::size_t w, std::int64_t) {
    dx[in] += dy[out] * (*p.weight)[w];
    dw[w] += dy[out] * x[in];
  });
  for (std::int64_t n = 0; n < k.batch; ++n)
    for (std::int64_t t = 0; t < k.tokens(); ++t)
      for (std::int64_t d = 0; d < k.dim; ++d) {
        const double g = dy[static_cast<std::size_t>((n * k.tokens() + t) * k.dim + d)];
        dpos[static_cast<std::size_t>(t * k.dim + d)] += g;
        (t < k.first() ? dcls : db)[static_cast<std::size_t>(d)] += g;
      }
  std::vector<std::vector<double>> out{dx, dw};
  if (k.bias) out.push_back(db);
  if (k.class_token) out.push_back(dcls);
  out.push_back(dpos);
  return out;
}

// Random non-zero inputs for a patch embedding (as make_case).
inline UnitCase make_patch_case(const PatchCase& k, const nn::PatchEmbedding& unit, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  UnitCase c{k.batch, k.in_size(), k.dim, unit.params(), {}, {}, {}};
  for (const auto& s : c.specs) c.params.push_back(random_nonzero(static_cast<std::size_t>(s.numel()), rng));
  c.x = random_nonzero(static_cast<std::size_t>(k.batch * k.in_size()), rng, 2.0);
  c.dy = random_nonzero(static_cast<std::size_t>(k.batch * k.tokens() * k.dim), rng);
  return c;
}

// run_unit for a patch embedding, whose output has `tokens` rows per image.
template <class T, class Dev>
UnitResult run_patch(Dev& dev, nn::PatchEmbedding& unit, const UnitCase& c, bool want_dx = true) {
  using buffer = typename Dev::template buffer<T>;
  const DeviceParams<T, Dev> d(dev, c);
  const auto& pv = d.values;
  const auto& gv = d.grad_views;
  const std::int64_t rows = c.rows * unit.tokens();
  const buffer x = upload<T>(dev, c.x), dy = upload<T>(dev, c.dy);
  buffer y = make_buffer<T>(dev, static_cast<std::size_t>(rows * c.out));
  buffer dx = make_buffer<T>(dev, want_dx ? static_cast<std::size_t>(c.rows * c.in) : 0);
  unit.template forward<Dev, T>(dev, pv, x.view(c.rows, c.in), y.view(rows, c.out));
  unit.template backward<Dev, T>(dev, pv, gv, x.view(c.rows, c.in), std::as_const(y).view(rows, c.out),
                                 dy.view(rows, c.out), want_dx ? dx.view(c.rows, c.in) : MatView<T>{});
  UnitResult r{download<T>(dev, y), download<T>(dev, dx), {}};
  for (const auto& g : d.grads) r.grads.push_back(download<T>(dev, g));
  return r;
}

// Strides, paddings and groups that exercise every index path: padding on
// one axis only, stride larger than the kernel, a kernel as large as the
// padded input, depthwise with and without a channel multiplier.
inline const std::vector<ConvCase> conv_cases{
    {.batch = 2,
     .channels = 3,
     .height = 7,
     .width = 9,
     .out_channels = 4,
     .kernel_h = 3,
     .kernel_w = 3,
     .pad_h = 1,
     .pad_w = 1},
    {.batch = 2,
     .channels = 4,
     .height = 8,
     .width = 5,
     .out_channels = 6,
     .kernel_h = 3,
     .kernel_w = 2,
     .stride_h = 2,
     .stride_w = 1,
     .pad_h = 1,
     .pad_w = 0,
     .groups = 2},
    {.batch = 3,
     .channels = 5,
     .height = 6,
     .width = 7,
     .out_channels = 5,
     .kernel_h = 3,
     .kernel_w = 3,
     .stride_h = 2,
     .stride_w = 2,
     .pad_h = 2,
     .pad_w = 2,
     .groups = 5},
    {.batch = 1,
     .channels = 3,
     .height = 5,
     .width = 8,
     .out_channels = 6,
     .kernel_h = 1,
     .kernel_w = 3,
     .stride_h = 1,
     .stride_w = 2,
     .pad_h = 0,
     .pad_w = 1,
     .groups = 3,
     .bias = false},
    {.batch = 2,
     .channels = 2,
     .height = 5,
     .width = 5,
     .out_channels = 3,
     .kernel_h = 5,
     .kernel_w = 5,
     .stride_h = 3,
     .stride_w = 3},
    {.batch = 2,
     .channels = 2,
     .height = 9,
     .width = 7,
     .out_channels = 3,
     .kernel_h = 2,
     .kernel_w = 2,
     .stride_h = 3,
     .stride_w = 3,
     .pad_h = 1,
     .pad_w = 1,
     .bias = false},
    {.batch = 2,
     .channels = 1,
     .height = 2,
     .width = 3,
     .out_channels = 2,
     .kernel_h = 4,
     .kernel_w = 4,
     .pad_h = 1,
     .pad_w = 1},
};

inline std::string describe(const ConvCase& k) {
  return std::to_string(k.batch) + "x" + std::to_string(k.channels) + "x" + std::to_string(k.height) + "x" +
         std::to_string(k.width) + " -> " + std::to_string(k.out_channels) + ", kernel " + std::to_string(k.kernel_h) +
         "x" + std::to_string(k.kernel_w) + ", stride " + std::to_string(k.stride_h) + "x" +
         std::to_string(k.stride_w) + ", padding " + std::to_string(k.pad_h) + "x" + std::to_string(k.pad_w) +
         ", groups " + std::to_string(k.groups) + (k.bias ? "" : ", no bias");
}

// Gradient tolerance: the input gradient sums kernel_h * kernel_w products
// of values rounded to T.
template <class T>
constexpr double grad_tol = std::is_same_v<T, float> ? backward_tol<T> : 3 * backward_tol<T>;

// A convolution on `dev` in T against the float64 loops.
template <class T, class Dev>
void check_conv_on(Dev& dev, const ConvCase& k, bool want_dx = true, bool trainable = true) {
  BOOST_TEST_CONTEXT(describe(k) << " " << dtype_traits<T>::name) {
    nn::Conv2d unit = k.unit(trainable);
    const UnitCase c = rounded<T>(make_case(unit, k.batch, k.in_size(), 7));
    BOOST_TEST_REQUIRE(c.out == k.out_size());
    const UnitResult r = run_unit<T>(dev, unit, c, want_dx);
    expect_close(r.y, conv_forward_reference(k, c.params, c.x), forward_tol<T>, "forward");
    const ConvGrads g = conv_backward_reference(k, c.params, c.x, c.dy);
    if (want_dx) expect_close(r.dx, g.dx, grad_tol<T>, "input gradient");
    if (!trainable) {
      for (const auto& grad : r.grads) BOOST_TEST(grad.empty(), "frozen: no gradient");
      return;
    }
    expect_close(r.grads[0], g.dweight, grad_tol<T>, "weight gradient");
    if (k.bias) expect_close(r.grads[1], g.dbias, grad_tol<T>, "bias gradient");
  }
}

inline const std::vector<PatchCase> patch_cases{
    {.batch = 2, .channels = 3, .height = 8, .width = 12, .dim = 5, .patch = 4},
    {.batch = 3, .channels = 2, .height = 6, .width = 4, .dim = 7, .patch = 2, .bias = false},
    {.batch = 2, .channels = 3, .height = 9, .width = 6, .dim = 4, .patch = 3, .class_token = false},
    {.batch = 1, .channels = 1, .height = 5, .width = 5, .dim = 3, .patch = 5, .bias = false, .class_token = false},
};

// A patch embedding on `dev` in T against the float64 loops.
template <class T, class Dev>
void check_patch_on(Dev& dev, const PatchCase& k) {
  BOOST_TEST_CONTEXT("images " << k.batch << "x" << k.channels << "x" << k.height << "x" << k.width << ", patch "
                               << k.patch << ", dim " << k.dim << (k.bias ? "" : ", no bias")
                               << (k.class_token ? "" : ", no class token") << " " << dtype_traits<T>::name) {
    nn::PatchEmbedding unit = k.unit();
    BOOST_TEST_REQUIRE(unit.tokens() == k.tokens());
    const UnitCase c = rounded<T>(make_patch_case(k, unit, 11));
    const UnitResult r = run_patch<T>(dev, unit, c);
    expect_close(r.y, patch_forward_reference(k, c.params, c.x), forward_tol<T>, "tokens");
    const auto g = patch_backward_reference(k, c.params, c.x, c.dy);
    expect_close(r.dx, g[0], backward_tol<T>, "input gradient");
    for (std::size_t i = 0; i < c.specs.size(); ++i)
      expect_close(r.grads[i], g[i + 1], backward_tol<T>, c.specs[i].name + " gradient");
  }
}

inline double quick_gelu(double v) { return v / (1.0 + std::exp(-1.702 * v)); }

inline RefForward quick_gelu_reference() { return elementwise_reference(quick_gelu); }

}  // namespace dtrain::testing
