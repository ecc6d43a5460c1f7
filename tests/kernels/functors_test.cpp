// The kernel functors on dtrain::Host against float64 references of the same
// formulas (PyTorch's AdamW and SGD), over random non-zero inputs and several
// steps.
#define BOOST_TEST_MODULE kernels
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/numeric.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/optimizer.hpp"
#include "dtrain/kernels/reduce.hpp"

namespace {

using dtrain::testing::expect_close;
using dtrain::testing::random_nonzero;

// Float64 AdamW as torch.optim.AdamW documents it.
struct AdamWReference {
  std::vector<double> param, m, v;
  void step(const std::vector<double>& grad, const dtrain::AdamWHyper& h, std::int64_t t, double grad_scale) {
    const double bc1 = 1.0 - std::pow(double{h.beta1}, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(double{h.beta2}, static_cast<double>(t));
    for (std::size_t i = 0; i < param.size(); ++i) {
      const double g = grad[i] * grad_scale;
      param[i] *= 1.0 - double{h.lr} * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
      v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
      param[i] -= h.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + h.eps);
    }
  }
};

// Float64 SGD as torch.optim.SGD documents it (dampening 0).
struct SgdReference {
  std::vector<double> param, buf;
  void step(const std::vector<double>& grad, const dtrain::SgdHyper& h, double grad_scale, bool first) {
    for (std::size_t i = 0; i < param.size(); ++i) {
      double d = grad[i] * grad_scale + h.weight_decay * param[i];
      if (h.momentum != 0.f) {
        buf[i] = first ? d : h.momentum * buf[i] + d;
        d = h.nesterov ? d + h.momentum * buf[i] : buf[i];
      }
      param[i] -= h.lr * d;
    }
  }
};

std::vector<float> to_float(const std::vector<double>& v) { return dtrain::testing::to_dtype<float>(v); }
std::vector<double> widen(const std::vector<float>& v) { return dtrain::testing::to_double<float>(v); }

constexpr std::size_t n = 1000;
constexpr int steps = 5;
// fp32 state against float64 over 5 steps: a few float roundings per step,
// relative to the largest element.
constexpr double optimizer_tol = 1e-5;

}  // namespace

BOOST_AUTO_TEST_SUITE(functors)

BOOST_AUTO_TEST_CASE(adamw_matches_float64_pytorch_formulas) {
  dtrain::Host dev(1);
  std::mt19937_64 rng(1);
  const dtrain::AdamWHyper h{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  const double grad_scale = 0.5;
  AdamWReference ref{random_nonzero(n, rng), std::vector<double>(n), std::vector<double>(n)};
  std::vector<float> param = to_float(ref.param), m(n), v(n);
  std::vector<dtrain::bf16> param_out(n);
  for (int t = 1; t <= steps; ++t) {
    const std::vector<double> grad = dtrain::testing::round_to<float>(random_nonzero(n, rng, 2.0));
    const std::vector<float> g = to_float(grad);
    ref.step(grad, h, t, grad_scale);
    dev.for_each(n, dtrain::AdamWStep<dtrain::bf16>({.param = param.data(),
                                                     .grad = g.data(),
                                                     .exp_avg = m.data(),
                                                     .exp_avg_sq = v.data(),
                                                     .param_out = param_out.data()},
                                                    h, t, static_cast<float>(grad_scale)));
  }
  expect_close(widen(param), ref.param, optimizer_tol, "param");
  expect_close(widen(m), ref.m, optimizer_tol, "exp_avg");
  expect_close(widen(v), ref.v, optimizer_tol, "exp_avg_sq");
  for (std::size_t i = 0; i < n; ++i)
    BOOST_TEST_REQUIRE(param_out[i].bits == dtrain::bf16(param[i]).bits, "param_out is bf16(param) at " << i);
}

// Hyper-parameter ranges are checked once by the configs (tests/optim); the
// functor itself only refuses a step count that breaks bias correction.
BOOST_AUTO_TEST_CASE(adamw_rejects_a_step_count_below_one) {
  float x = 0.f;
  const dtrain::AdamWStep<>::Buffers b{&x, &x, &x, &x};
  BOOST_CHECK_THROW(dtrain::AdamWStep<>(b, {}, 0), dtrain::config_error);
}

BOOST_AUTO_TEST_CASE(sgd_matches_float64_pytorch_formulas) {
  const dtrain::SgdHyper variants[] = {
      {.lr = 0.1f},
      {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f},
      {.lr = 0.05f, .momentum = 0.8f, .weight_decay = 0.1f, .nesterov = true},
  };
  dtrain::Host dev(1);
  for (const auto& h : variants) {
    BOOST_TEST_CONTEXT("momentum " << h.momentum << " nesterov " << h.nesterov) {
      std::mt19937_64 rng(2);
      SgdReference ref{random_nonzero(n, rng), std::vector<double>(n)};
      std::vector<float> param = to_float(ref.param), buf(n);
      std::vector<dtrain::fp16> param_out(n);
      for (int t = 1; t <= steps; ++t) {
        const std::vector<double> grad = dtrain::testing::round_to<float>(random_nonzero(n, rng));
        const std::vector<float> g = to_float(grad);
        ref.step(grad, h, 0.25, t == 1);
        dev.for_each(
            n,
            dtrain::SgdStep<dtrain::fp16>(
                {.param = param.data(), .grad = g.data(), .momentum_buffer = buf.data(), .param_out = param_out.data()},
                h, 0.25f));
      }
      expect_close(widen(param), ref.param, optimizer_tol, "param");
      if (h.momentum != 0.f) expect_close(widen(buf), ref.buf, optimizer_tol, "momentum buffer");
      for (std::size_t i = 0; i < n; ++i)
        BOOST_TEST_REQUIRE(param_out[i].bits == dtrain::fp16(param[i]).bits, "param_out is fp16(param) at " << i);
    }
  }
}

BOOST_AUTO_TEST_CASE(cast_accumulate_scale_round_once) {
  dtrain::Host dev(1);
  std::mt19937_64 rng(3);
  const std::vector<float> src = to_float(random_nonzero(n, rng, 100.0));
  std::vector<dtrain::bf16> half(n);
  dev.for_each(n, dtrain::Cast<float, dtrain::bf16>{src.data(), half.data()});
  std::vector<dtrain::fp16> other(n);
  dev.for_each(n, dtrain::Cast<dtrain::bf16, dtrain::fp16>{half.data(), other.data()});
  std::vector<float> acc = to_float(random_nonzero(n, rng));
  const std::vector<float> acc0 = acc;
  dev.for_each(n, dtrain::AccumulateInto<dtrain::bf16>{acc.data(), half.data()});
  std::vector<dtrain::bf16> scaled = half;
  dev.for_each(n, dtrain::Scale<dtrain::bf16>{scaled.data(), 0.3f});
  for (std::size_t i = 0; i < n; ++i) {
    BOOST_TEST_REQUIRE(half[i].bits == dtrain::bf16(src[i]).bits);
    BOOST_TEST_REQUIRE(other[i].bits == dtrain::fp16(static_cast<float>(half[i])).bits);
    BOOST_TEST_REQUIRE(acc[i] == acc0[i] + static_cast<float>(half[i]));
    BOOST_TEST_REQUIRE(scaled[i].bits == dtrain::bf16(static_cast<float>(half[i]) * 0.3f).bits);
  }
}

BOOST_AUTO_TEST_CASE(norm_and_non_finite_reductions) {
  dtrain::Host dev(1);
  std::mt19937_64 rng(4);
  const std::vector<double> x = dtrain::testing::round_to<dtrain::fp16>(random_nonzero(n, rng, 10.0));
  const std::vector<dtrain::fp16> h = dtrain::testing::to_dtype<dtrain::fp16>(x);
  double expected = 0.0;
  for (double v : x) expected += v * v;
  BOOST_TEST(dtrain::squared_norm(dev, std::span(h)) == expected, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(dtrain::count_non_finite(dev, std::span(h)) == 0u);

  std::vector<float> bad = to_float(x);
  bad[3] = std::numeric_limits<float>::infinity();
  bad[500] = -std::numeric_limits<float>::infinity();
  bad[999] = std::numeric_limits<float>::quiet_NaN();
  BOOST_TEST(dtrain::count_non_finite(dev, std::span<const float>(bad)) == 3u);
  // The documented shortcut: the squared norm alone reveals a non-finite element.
  BOOST_TEST(!std::isfinite(dtrain::squared_norm(dev, std::span(bad))));
  bad[3] = bad[500] = 1.f;
  BOOST_TEST(!std::isfinite(dtrain::squared_norm(dev, std::span(bad))));
  bad[999] = std::numeric_limits<float>::max();
  BOOST_TEST(std::isfinite(dtrain::squared_norm(dev, std::span(bad))));
}

BOOST_AUTO_TEST_SUITE_END()
