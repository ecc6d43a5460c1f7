// The units of a ResNet backbone beyond nn::Conv2d, on dtrain::Host against
// float64 references written here, over odd image sizes (7 x 5, 9 x 7),
// several channel counts, strides and paddings, in fp32, bf16 and fp16 (inputs
// rounded to the dtype first); tolerances relative to the largest reference
// element (nn/reference.hpp): fp32 1e-5 forward, 1e-4 gradients; bf16/fp16
// one rounding more, gradients 3 x that (a gradient subtracts sums of values
// already rounded to the dtype):
//  - nn::MaxPool2d forward and input gradient against direct loops (first
//    maximum on ties, padding never taken), and ties routed to the first
//    maximum of each window;
//  - nn::FrozenBatchNorm2d forward and input gradient against the formula,
//    no parameter gradients;
//  - nn::BatchNorm2d in training (the batch's statistics) and in evaluation
//    (the running ones): forward against the formula, input, weight and bias
//    gradients against central finite differences of it;
//  - the parameter names and the errors.
// (One program with resnet_test.cpp, which names the module.)
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include "nn/unit_harness.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/nn/batch_norm.hpp"
#include "dtrain/nn/pooling.hpp"

namespace {

namespace t = dtrain::testing;
using dtrain::nn::BatchNorm2d;
using dtrain::nn::Extent2;
using dtrain::nn::FrozenBatchNorm2d;
using dtrain::nn::MaxPool2d;

static_assert(dtrain::Unit<MaxPool2d, dtrain::Host, float> && dtrain::Unit<MaxPool2d, dtrain::Host, dtrain::bf16>);
static_assert(dtrain::Unit<FrozenBatchNorm2d, dtrain::Host, float> &&
              dtrain::Unit<FrozenBatchNorm2d, dtrain::Host, dtrain::fp16>);
static_assert(dtrain::Unit<BatchNorm2d, dtrain::Host, float> && dtrain::Unit<BatchNorm2d, dtrain::Host, dtrain::bf16>);

template <class T>
constexpr double grad_tol = std::is_same_v<T, float> ? t::backward_tol<T> : 3 * t::backward_tol<T>;

// The message of a config_error holds `part`.
auto says(const std::string& part) {
  return [part](const dtrain::config_error& e) {
    const bool found = std::string(e.what()).find(part) != std::string::npos;
    if (!found) BOOST_TEST_MESSAGE("message: " << e.what());
    return found;
  };
}

struct PoolCase {
  std::int64_t batch, channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  std::int64_t out_h() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  std::int64_t out_w() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
  MaxPool2d unit() const {
    return MaxPool2d(channels, {kernel_h, kernel_w}, {height, width},
                     {.stride = Extent2{stride_h, stride_w}, .padding = {pad_h, pad_w}});
  }
};

const std::vector<PoolCase> pool_cases{
    {2, 3, 7, 5, 3, 3, 2, 2, 1, 1},  // ResNet's stem pooling on an odd image
    {1, 2, 6, 8, 2, 2, 2, 2, 0, 0}, {3, 1, 5, 7, 3, 2, 1, 2, 1, 0}, {2, 4, 9, 7, 3, 3, 3, 2, 1, 1},
    {2, 2, 4, 6, 4, 2, 1, 3, 2, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
};

// For each output element, the index of its window's first maximum in x
// (row-major window order, padding never taken).
std::vector<std::size_t> pool_argmax(const PoolCase& k, const std::vector<double>& x) {
  std::vector<std::size_t> arg;
  for (std::int64_t plane = 0; plane < k.batch * k.channels; ++plane)
    for (std::int64_t oh = 0; oh < k.out_h(); ++oh)
      for (std::int64_t ow = 0; ow < k.out_w(); ++ow) {
        std::size_t best = 0;
        bool found = false;
        for (std::int64_t r = 0; r < k.kernel_h; ++r)
          for (std::int64_t q = 0; q < k.kernel_w; ++q) {
            const std::int64_t ih = oh * k.stride_h - k.pad_h + r, iw = ow * k.stride_w - k.pad_w + q;
            if (ih < 0 || ih >= k.height || iw < 0 || iw >= k.width) continue;
            const auto at = static_cast<std::size_t>((plane * k.height + ih) * k.width + iw);
            if (!found || x[at] > x[best]) best = at;
            found = true;
          }
        BOOST_TEST_REQUIRE(found, "every window holds an input element");
        arg.push_back(best);
      }
  return arg;
}

template <class T>
void check_pool(const PoolCase& k, const std::vector<double>* x_override = nullptr) {
  BOOST_TEST_CONTEXT(k.batch << "x" << k.channels << "x" << k.height << "x" << k.width << ", kernel " << k.kernel_h
                             << "x" << k.kernel_w << ", stride " << k.stride_h << "x" << k.stride_w << ", padding "
                             << k.pad_h << "x" << k.pad_w << " " << dtrain::dtype_traits<T>::name) {
    dtrain::Host dev(1);
    MaxPool2d unit = k.unit();
    const std::int64_t in = k.channels * k.height * k.width;
    t::UnitCase c = t::make_case(unit, k.batch, in, 5);
    if (x_override != nullptr) c.x = *x_override;
    c = t::rounded<T>(std::move(c));
    BOOST_TEST_REQUIRE(c.out == k.channels * k.out_h() * k.out_w());
    const t::UnitResult r = t::run_unit<T>(dev, unit, c);
    const std::vector<std::size_t> arg = pool_argmax(k, c.x);
    std::vector<double> y(arg.size()), dx(c.x.size(), 0.0);
    for (std::size_t o = 0; o < arg.size(); ++o) {
      y[o] = c.x[arg[o]];
      dx[arg[o]] += c.dy[o];
    }
    t::expect_close(r.y, y, t::forward_tol<T>, "forward");
    t::expect_close(r.dx, dx, t::backward_tol<T>, "input gradient");
  }
}

// Images with (2 + channel) values per channel, weight, bias, running_mean
// random and running_var positive, as a unit trained or loaded has.
template <class U>
t::UnitCase norm_case(const U& unit, std::int64_t batch, std::int64_t in, std::uint64_t seed) {
  t::UnitCase c = t::make_case(unit, batch, in, seed);
  for (double& v : c.params[3]) v = 0.5 + std::abs(v);
  return c;
}

struct NormCase {
  std::int64_t batch, channels, height, width;
  std::int64_t in() const { return channels * height * width; }
};

const std::vector<NormCase> norm_cases{{2, 3, 7, 5}, {1, 5, 4, 4}, {3, 1, 1, 1}, {4, 2, 3, 1}};

// The per-channel normalisation in float64: the batch's statistics (mean,
// biased variance) when `batch_stats`, else running_mean and running_var.
t::RefForward norm_reference(const NormCase& k, bool batch_stats, double eps = 1e-5) {
  return [k, batch_stats, eps](const std::vector<std::vector<double>>& p, const std::vector<double>& x) {
    const std::int64_t plane = k.height * k.width, batch = static_cast<std::int64_t>(x.size()) / k.in();
    std::vector<double> y(x.size());
    for (std::int64_t c = 0; c < k.channels; ++c) {
      const auto at = [&](std::int64_t n, std::int64_t i) {
        return static_cast<std::size_t>((n * k.channels + c) * plane + i);
      };
      double mean = p[2][static_cast<std::size_t>(c)], var = p[3][static_cast<std::size_t>(c)];
      if (batch_stats) {
        mean = var = 0.0;
        for (std::int64_t n = 0; n < batch; ++n)
          for (std::int64_t i = 0; i < plane; ++i) mean += x[at(n, i)];
        mean /= static_cast<double>(batch * plane);
        for (std::int64_t n = 0; n < batch; ++n)
          for (std::int64_t i = 0; i < plane; ++i) var += (x[at(n, i)] - mean) * (x[at(n, i)] - mean);
        var /= static_cast<double>(batch * plane);
      }
      const double w = p[0][static_cast<std::size_t>(c)], b = p[1][static_cast<std::size_t>(c)];
      for (std::int64_t n = 0; n < batch; ++n)
        for (std::int64_t i = 0; i < plane; ++i) y[at(n, i)] = (x[at(n, i)] - mean) / std::sqrt(var + eps) * w + b;
    }
    return y;
  };
}

// Runs a BatchNorm2d forward and backward with ctx.training = `training`.
template <class T>
t::UnitResult run_batch_norm(dtrain::Host& dev, BatchNorm2d& unit, const t::UnitCase& c, bool training) {
  const t::DeviceParams<T, dtrain::Host> d(dev, c);
  const auto x = t::upload<T>(dev, c.x), dy = t::upload<T>(dev, c.dy);
  auto y = dtrain::make_buffer<T>(dev, c.x.size());
  auto dx = dtrain::make_buffer<T>(dev, c.x.size());
  const dtrain::UnitContext<T> ctx{{c.rows, 1}, {}, training, 0, nullptr};
  unit.forward<dtrain::Host, T>(dev, d.values, x.view(c.rows, c.in), y.view(c.rows, c.out), ctx);
  unit.backward<dtrain::Host, T>(dev, d.values, d.grad_views, x.view(c.rows, c.in),
                                 std::as_const(y).view(c.rows, c.out), dy.view(c.rows, c.out), dx.view(c.rows, c.in),
                                 ctx);
  t::UnitResult r{t::download<T>(dev, y), t::download<T>(dev, dx), {}};
  for (const auto& g : d.grads) r.grads.push_back(t::download<T>(dev, g));
  return r;
}

template <class T>
void check_batch_norm(const NormCase& k, bool training) {
  BOOST_TEST_CONTEXT(k.batch << "x" << k.channels << "x" << k.height << "x" << k.width
                             << (training ? " training " : " evaluation ") << dtrain::dtype_traits<T>::name) {
    dtrain::Host dev(1);
    BatchNorm2d unit(k.channels, {k.height, k.width});
    const t::UnitCase c = t::rounded<T>(norm_case(unit, k.batch, k.in(), 3));
    const t::UnitResult r = run_batch_norm<T>(dev, unit, c, training);
    const t::RefForward ref = norm_reference(k, training);
    t::expect_close(r.y, ref(c.params, c.x), t::forward_tol<T>, "forward");
    const t::FdGrads fd = t::finite_difference_grads(ref, c);
    t::expect_close(r.dx, fd.dx, grad_tol<T>, "input gradient");
    t::expect_close(r.grads[0], fd.grads[0], grad_tol<T>, "weight gradient");
    t::expect_close(r.grads[1], fd.grads[1], grad_tol<T>, "bias gradient");
    BOOST_TEST(r.grads[2].empty());
    BOOST_TEST(r.grads[3].empty());
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(max_pool2d)

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_direct_loops, T, t::dtypes) {
  for (const auto& k : pool_cases) check_pool<T>(k);
}

// Equal values: each window's gradient goes to its first element, as PyTorch's.
BOOST_AUTO_TEST_CASE(ties_go_to_the_first_maximum) {
  const PoolCase k{1, 2, 5, 7, 3, 3, 1, 2, 1, 1};
  std::vector<double> x(static_cast<std::size_t>(k.channels * k.height * k.width), 0.75);
  for (std::size_t i = 0; i < x.size(); i += 3) x[i] = -0.5;
  check_pool<float>(k, &x);
}

BOOST_AUTO_TEST_CASE(shape_and_errors) {
  const MaxPool2d stem(64, {3, 3}, {112, 112}, {.stride = Extent2{2, 2}, .padding = {1, 1}});
  BOOST_TEST(stem.out_h() == 56);
  BOOST_TEST(stem.out_features(64 * 112 * 112) == 64 * 56 * 56);
  BOOST_TEST(stem.params().empty());
  BOOST_TEST(MaxPool2d(1, {2, 3}, {7, 5}).out_w() == 1);  // the stride defaults to the kernel
  BOOST_CHECK_EXCEPTION(MaxPool2d(3, {3, 3}, {8, 8}, {.padding = {2, 1}}), dtrain::config_error,
                        says("at most kernel / 2"));
  BOOST_CHECK_EXCEPTION(MaxPool2d(3, {3, 3}, {8, 8}, {.stride = Extent2{0, 1}}), dtrain::config_error,
                        says("must be >= 1"));
  BOOST_CHECK_EXCEPTION(MaxPool2d(3, {5, 3}, {2, 8}, {.padding = {1, 1}}), dtrain::config_error,
                        says("larger than the padded input"));
  BOOST_CHECK_EXCEPTION(MaxPool2d(3, {3, 3}, {8, 8}).out_features(3 * 8 * 9), dtrain::config_error,
                        says("expects 3 channels of 8 x 8 images, 192 values per row"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(frozen_batch_norm2d)

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_float64, T, t::dtypes) {
  for (const auto& k : norm_cases) {
    BOOST_TEST_CONTEXT(k.batch << "x" << k.channels << "x" << k.height << "x" << k.width << " "
                               << dtrain::dtype_traits<T>::name) {
      dtrain::Host dev(1);
      FrozenBatchNorm2d unit(k.channels, {k.height, k.width});
      const t::UnitCase c = t::rounded<T>(norm_case(unit, k.batch, k.in(), 9));
      const t::UnitResult r = t::run_unit<T>(dev, unit, c);
      const t::RefForward ref = norm_reference(k, false);
      t::expect_close(r.y, ref(c.params, c.x), t::forward_tol<T>, "forward");
      t::expect_close(r.dx, t::finite_difference_grads(ref, c).dx, t::backward_tol<T>, "input gradient");
      for (const auto& g : r.grads) BOOST_TEST(g.empty(), "frozen: no parameter gradient");
    }
  }
}

BOOST_AUTO_TEST_CASE(declares_torchvision_parameters) {
  const auto specs = FrozenBatchNorm2d(6, {7, 5}).params();
  BOOST_TEST_REQUIRE(specs.size() == 4u);
  const std::vector<std::string> names{"weight", "bias", "running_mean", "running_var"};
  for (std::size_t i = 0; i < 4; ++i) {
    BOOST_TEST(specs[i].name == names[i]);
    BOOST_TEST(!specs[i].trainable);
    BOOST_TEST(specs[i].shape == std::vector<std::int64_t>{6});
  }
  BOOST_CHECK_EXCEPTION(FrozenBatchNorm2d(6, {7, 5}).out_features(6 * 7 * 4), dtrain::config_error,
                        says("nn::FrozenBatchNorm2d expects 6 channels of 7 x 5 images, 210 values per row"));
  BOOST_CHECK_THROW(FrozenBatchNorm2d(0, {7, 5}), dtrain::config_error);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(batch_norm2d)

BOOST_AUTO_TEST_CASE_TEMPLATE(training_uses_the_batch_statistics, T, t::dtypes) {
  for (const auto& k : norm_cases) check_batch_norm<T>(k, true);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(evaluation_uses_the_running_statistics, T, t::dtypes) {
  for (const auto& k : norm_cases) check_batch_norm<T>(k, false);
}

BOOST_AUTO_TEST_CASE(declares_parameters) {
  const auto specs = BatchNorm2d(4, {3, 3}).params();
  BOOST_TEST_REQUIRE(specs.size() == 4u);
  BOOST_TEST((specs[0].name == "weight" && specs[0].trainable && specs[1].name == "bias" && specs[1].trainable));
  BOOST_TEST((specs[2].name == "running_mean" && !specs[2].trainable));
  BOOST_TEST((specs[3].name == "running_var" && !specs[3].trainable));
  BOOST_TEST(!BatchNorm2d(4, {3, 3}, {.trainable = false}).params()[0].trainable);
  BOOST_CHECK_EXCEPTION(BatchNorm2d(4, {3, 3}, {.eps = 0.f}), dtrain::config_error, says("must be > 0"));
}

BOOST_AUTO_TEST_SUITE_END()
