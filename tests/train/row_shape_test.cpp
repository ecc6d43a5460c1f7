// Units that change the row count (out_shape, model/unit.hpp) through the
// Trainer, against float64 references written here:
//  - Spread ([B, F] -> [B * K, F], first unit, keeps its input in its saved
//    view), nn::Linear over the B * K rows, Pool ([B * K, D] -> [B, D]) and
//    an MSE loss over B rows: every parameter's gradient (one SGD step with
//    lr = 1 at 1 rank, and DDP at 2 ranks with Accumulate<2> and uneven
//    micro-batches, which must both give the reference's over all samples)
//    within 2e-5 of the largest |parameter| + |gradient| (fp32); each unit
//    checks ctx.shape and the rows it gets;
//  - nn::PatchEmbedding as a model's first unit (an input unit reading 4-D
//    images as x): its gradients in fp32 (2e-5) and bf16 (4e-2 relative to
//    the largest, the images converted to bf16 in its saved view);
//  - model_activation_bytes counts each unit's own rows.
#define BOOST_TEST_MODULE row_shape
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "nn/vision_reference.hpp"
#include "support/ranks.hpp"
#include "train/step_check.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

constexpr std::int64_t F = 3, K = 4, D = 2;

// y[b * K + k, f] = x[b, f] * s[k, f]: K rows per input row.
struct Spread {
  std::vector<ParamSpec> params() const { return {{"s", {K, F}, Init::normal(0.f, 0.7f)}}; }
  std::int64_t out_features(std::int64_t in) const { return in; }
  // [snippet:out_shape]
  SeqShape out_shape(SeqShape in, SeqShape /*batch*/) const { return {in.rows(), K}; }  // K rows per row read
  // [/snippet:out_shape]
  std::int64_t saved_size(SeqShape in, std::int64_t width) const { return in.rows() * width; }

  template <class Dev, class T>
  void forward(Dev&, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    require(ctx.shape.rows() == x.rows && y.rows == x.rows * K, "Spread: rows");
    require(ctx.saved.size() == x.size(), "Spread: saved view");
    for (std::int64_t b = 0; b < x.rows; ++b)
      for (std::int64_t f = 0; f < F; ++f) {
        ctx.saved(0, b * F + f) = x(b, f);
        for (std::int64_t k = 0; k < K; ++k) y(b * K + k, f) = x(b, f) * p[0](k, f);
      }
  }
  template <class Dev, class T>
  void backward(Dev&, UnitParams<const T>, UnitParams<T> g, MatView<const T>, MatView<const T>, MatView<const T> dy,
                MatView<T> dx, const UnitContext<T>& ctx) {
    require(dx.empty(), "Spread: the first unit gets no input gradient");
    const std::int64_t rows = ctx.shape.rows();
    require(dy.rows == rows * K, "Spread: dy rows");
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t f = 0; f < F; ++f) {
        T sum = 0;
        for (std::int64_t b = 0; b < rows; ++b) sum += dy(b * K + k, f) * ctx.saved(0, b * F + f);
        g[0](k, f) = sum;
      }
  }
};

// y[b] = sum_k w[k] x[b * K + k]: back to one row per sample.
struct Pool {
  std::vector<ParamSpec> params() const { return {{"w", {K}, Init::normal(0.f, 0.7f)}}; }
  std::int64_t out_features(std::int64_t in) const { return in; }
  SeqShape out_shape(SeqShape in, SeqShape batch) const {
    require(in.time == K && in.batch == batch.rows(), "Pool: its input shape");
    return {in.batch, 1};
  }

  template <class Dev, class T>
  void forward(Dev&, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    require(ctx.shape.time == K && x.rows == ctx.shape.rows() && y.rows == ctx.shape.batch, "Pool: rows");
    for (std::int64_t b = 0; b < y.rows; ++b)
      for (std::int64_t c = 0; c < y.cols; ++c) {
        T sum = 0;
        for (std::int64_t k = 0; k < K; ++k) sum += p[0].data[k] * x(b * K + k, c);
        y(b, c) = sum;
      }
  }
  template <class Dev, class T>
  void backward(Dev&, UnitParams<const T> p, UnitParams<T> g, MatView<const T> x, MatView<const T>, MatView<const T> dy,
                MatView<T> dx, const UnitContext<T>& ctx) {
    require(dx.rows == ctx.shape.rows() && dy.rows == ctx.shape.batch, "Pool: gradient rows");
    for (std::int64_t k = 0; k < K; ++k) {
      T sum = 0;
      for (std::int64_t b = 0; b < dy.rows; ++b)
        for (std::int64_t c = 0; c < dy.cols; ++c) sum += dy(b, c) * x(b * K + k, c);
      g[0].data[k] = sum;
    }
    for (std::int64_t b = 0; b < dy.rows; ++b)
      for (std::int64_t k = 0; k < K; ++k)
        for (std::int64_t c = 0; c < dy.cols; ++c) dx(b * K + k, c) = p[0].data[k] * dy(b, c);
  }
};

struct RowNet {
  Spread spread;
  nn::Linear lin{F, D};
  Pool pool;
  nn::MSELoss loss;
  auto units() { return std::tie(spread, lin, pool); }
};

using Values = std::map<std::string, std::vector<float>>;

// Samples [first, first + n) of a fixed set of 5: x [n, F], y [n, D].
Batch samples(std::int64_t first, std::int64_t n) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(0.2f, 1.5f);
  std::vector<float> x(5 * F), y(5 * D);
  for (auto& v : x) v = (rng() % 2 ? 1.f : -1.f) * u(rng);
  for (auto& v : y) v = (rng() % 2 ? 1.f : -1.f) * u(rng);
  Batch b;
  b.set("x", HostTensor::of(std::vector<float>(x.begin() + first * F, x.begin() + (first + n) * F), {n, F}));
  b.set("y", HostTensor::of(std::vector<float>(y.begin() + first * D, y.begin() + (first + n) * D), {n, D}));
  return b;
}

std::vector<double> as_double(std::span<const float> v) { return {v.begin(), v.end()}; }

// The float64 gradient of the mean squared error over all 5 samples.
Values reference_grads(const Values& p) {
  const Batch all = samples(0, 5);
  const auto x = as_double(all.at("x").values<float>()), y = as_double(all.at("y").values<float>());
  const auto s = as_double(p.at("0.s")), W = as_double(p.at("1.weight")), bl = as_double(p.at("1.bias")),
             w = as_double(p.at("2.w"));
  const std::int64_t B = 5;
  std::vector<double> h(B * K * F), g(B * K * D), dp(B * D);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t k = 0; k < K; ++k) {
      for (std::int64_t f = 0; f < F; ++f) h[(b * K + k) * F + f] = x[b * F + f] * s[k * F + f];
      for (std::int64_t d = 0; d < D; ++d) {
        double v = bl[d];
        for (std::int64_t f = 0; f < F; ++f) v += W[d * F + f] * h[(b * K + k) * F + f];
        g[(b * K + k) * D + d] = v;
      }
    }
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t d = 0; d < D; ++d) {
      double v = 0;
      for (std::int64_t k = 0; k < K; ++k) v += w[k] * g[(b * K + k) * D + d];
      dp[b * D + d] = 2 * (v - y[b * D + d]) / static_cast<double>(B * D);
    }
  std::vector<double> ds(K * F, 0), dW(D * F, 0), dbl(D, 0), dw(K, 0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t d = 0; d < D; ++d) {
        const double dg = dp[b * D + d] * w[k];
        dw[k] += dp[b * D + d] * g[(b * K + k) * D + d];
        dbl[d] += dg;
        for (std::int64_t f = 0; f < F; ++f) {
          dW[d * F + f] += dg * h[(b * K + k) * F + f];
          ds[k * F + f] += dg * W[d * F + f] * x[b * F + f];
        }
      }
  const auto f32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  return {{"0.s", f32(ds)}, {"1.weight", f32(dW)}, {"1.bias", f32(dbl)}, {"2.w", f32(dw)}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(units_that_change_rows_train_as_the_float64_reference) {
  Values before, after;
  run_ranks(1, [&](World& w) {
    RowNet net;
    Trainer<RowNet> t(w, net, SGD{.lr = 1.f}, {.seed = 3});
    before = t.parameters();
    const std::vector<Batch> one{samples(0, 5)};
    t.step(one);
    after = t.parameters();
  });
  check_sgd_step(before, after, reference_grads(before), 2e-5, "1 rank");

  // Rank 0 takes samples 0-1 and 2, rank 1 sample 3 and 4.
  Values ddp_before, ddp_after;
  run_ranks(2, [&](World& w) {
    RowNet net;
    Trainer<RowNet, Strategy<DDP>, Accumulate<2>> t(w, net, SGD{.lr = 1.f}, {.seed = 3});
    const Values p0 = t.parameters();
    const std::vector<Batch> mine = w.rank() == 0 ? std::vector<Batch>{samples(0, 2), samples(2, 1)}
                                                  : std::vector<Batch>{samples(3, 1), samples(4, 1)};
    t.step(mine);
    const Values p1 = t.parameters();
    if (w.rank() == 0) ddp_before = p0, ddp_after = p1;
  });
  check_sgd_step(ddp_before, ddp_after, reference_grads(ddp_before), 2e-5, "DDP, 2 ranks, Accumulate<2>");
}

BOOST_AUTO_TEST_CASE(activation_bytes_count_each_units_rows) {
  RowNet net;
  const std::int64_t B = 5;
  const std::int64_t acts = B * F + B * K * F + B * K * D + B * D;
  const std::int64_t grads = 2 * B * K * F;  // the largest activation
  const std::int64_t saved = B * F;          // Spread's copy of its input
  BOOST_TEST(model_activation_bytes(net, {B, 1}, F, 0, 4, false) ==
             static_cast<std::size_t>((acts + grads + saved) * 4));
}

namespace {

const PatchCase patch_case{.batch = 3, .channels = 2, .height = 8, .width = 12, .dim = 5, .patch = 4};

struct PatchNet {
  nn::PatchEmbedding embed = nn::PatchEmbedding(patch_case.channels, patch_case.dim, patch_case.patch,
                                                {patch_case.height, patch_case.width}, {.input = "x"});
  nn::MSELoss loss;
  auto units() { return std::tie(embed); }
};

template <class... Policies>
void check_patch_net(double tol, const std::string& what) {
  const PatchCase& k = patch_case;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(0.2f, 1.5f);
  std::vector<float> x(static_cast<std::size_t>(k.batch * k.in_size())),
      y(static_cast<std::size_t>(k.batch * k.tokens() * k.dim));
  for (auto& v : x) v = (rng() % 2 ? 1.f : -1.f) * u(rng);
  for (auto& v : y) v = (rng() % 2 ? 1.f : -1.f) * u(rng);
  Batch b;
  b.set("x", HostTensor::of(x, {k.batch, k.channels, k.height, k.width}));
  b.set("y", HostTensor::of(y, {k.batch, k.tokens(), k.dim}));
  Values before, after;
  run_ranks(1, [&](World& w) {
    PatchNet net;
    Trainer<PatchNet, Policies...> t(w, net, SGD{.lr = 1.f}, {.seed = 8});
    before = t.parameters();
    t.step(std::vector<Batch>{b});
    after = t.parameters();
  });
  const std::vector<std::string> names{"0.weight", "0.bias", "0.class_embedding", "0.position_embedding"};
  std::vector<std::vector<double>> p;
  for (const auto& n : names) p.push_back(as_double(before.at(n)));
  const std::vector<double> out = patch_forward_reference(k, p, as_double(x));
  std::vector<double> dy(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) dy[i] = 2 * (out[i] - y[i]) / static_cast<double>(out.size());
  const auto grads = patch_backward_reference(k, p, as_double(x), dy);
  Values want;
  for (std::size_t i = 0; i < names.size(); ++i)
    want[names[i]] = std::vector<float>(grads[i + 1].begin(), grads[i + 1].end());
  check_sgd_step(before, after, want, tol, what);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_patch_embedding_is_a_models_first_unit) {
  static_assert(InputUnit<nn::PatchEmbedding, Host, float>);
  check_patch_net<>(2e-5, "PatchEmbedding fp32");
  check_patch_net<Precision<bf16>>(4e-2, "PatchEmbedding bf16");
}
