// The nn units on dtrain::Host against float64 references written here:
//  (a) forward matches the float64 forward (fp32: 1e-5 of the output's scale;
//      bf16/fp16: one rounding of the output, plus the fp32 part),
//  (b) every gradient (input and each parameter) matches central finite
//      differences of the float64 forward (fp32: 1e-4; bf16/fp16: one
//      rounding plus 1e-4),
// on random non-zero inputs, parameters and upstream gradients.
#define BOOST_TEST_MODULE nn
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include "nn/unit_harness.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/rms_norm.hpp"

#if DTRAIN_HAS_CUDA
#include "dtrain/backend/cuda/device.hpp"
#endif

namespace {

namespace t = dtrain::testing;

template <class U, class Dev>
constexpr bool unit_for_all_dtypes =
    dtrain::Unit<U, Dev, float>&& dtrain::Unit<U, Dev, dtrain::bf16>&& dtrain::Unit<U, Dev, dtrain::fp16>;

static_assert(unit_for_all_dtypes<dtrain::nn::Linear, dtrain::Host>);
static_assert(unit_for_all_dtypes<dtrain::nn::ReLU, dtrain::Host>);
static_assert(unit_for_all_dtypes<dtrain::nn::GELU, dtrain::Host>);
static_assert(unit_for_all_dtypes<dtrain::nn::LayerNorm, dtrain::Host>);
static_assert(unit_for_all_dtypes<dtrain::nn::RMSNorm, dtrain::Host>);
static_assert(unit_for_all_dtypes<dtrain::nn::GELUTanh, dtrain::Host>);
static_assert(unit_for_all_dtypes<dtrain::nn::SwiGLU, dtrain::Host>);
static_assert(dtrain::Loss<dtrain::nn::SoftmaxCrossEntropy, dtrain::Host, float>);
static_assert(dtrain::Loss<dtrain::nn::SoftmaxCrossEntropy, dtrain::Host, dtrain::bf16>);
#if DTRAIN_HAS_CUDA
// Concept checks need only declarations, so they hold in a g++ translation unit too.
static_assert(unit_for_all_dtypes<dtrain::nn::Linear, dtrain::Cuda>);
static_assert(unit_for_all_dtypes<dtrain::nn::GELU, dtrain::Cuda>);
static_assert(unit_for_all_dtypes<dtrain::nn::LayerNorm, dtrain::Cuda>);
static_assert(unit_for_all_dtypes<dtrain::nn::RMSNorm, dtrain::Cuda>);
static_assert(unit_for_all_dtypes<dtrain::nn::SwiGLU, dtrain::Cuda>);
static_assert(dtrain::Loss<dtrain::nn::SoftmaxCrossEntropy, dtrain::Cuda, dtrain::fp16>);
#endif

}  // namespace

BOOST_AUTO_TEST_SUITE(units)

BOOST_AUTO_TEST_CASE_TEMPLATE(linear_with_bias, T, t::dtypes) {
  t::check_unit<T>(dtrain::nn::Linear(5, 4), t::linear_reference(5, 4, true), 6, 5);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(linear_without_bias, T, t::dtypes) {
  t::check_unit<T>(dtrain::nn::Linear(5, 3, {.bias = false}), t::linear_reference(5, 3, false), 6, 5);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(relu, T, t::dtypes) { t::check_unit<T>(dtrain::nn::ReLU{}, t::relu_reference(), 6, 9); }

BOOST_AUTO_TEST_CASE_TEMPLATE(gelu, T, t::dtypes) { t::check_unit<T>(dtrain::nn::GELU{}, t::gelu_reference(), 6, 9); }

BOOST_AUTO_TEST_CASE_TEMPLATE(gelu_tanh, T, t::dtypes) {
  t::check_unit<T>(dtrain::nn::GELUTanh{}, t::gelu_tanh_reference(), 6, 9);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(silu, T, t::dtypes) { t::check_unit<T>(dtrain::nn::SiLU{}, t::silu_reference(), 6, 9); }

BOOST_AUTO_TEST_CASE_TEMPLATE(swiglu, T, t::dtypes) {
  t::check_unit<T>(dtrain::nn::SwiGLU{}, t::swiglu_reference(5), 6, 10, true, {}, 2.0);
  t::check_unit<T>(dtrain::nn::GeGLU{}, t::swiglu_reference(5, true), 6, 10, true, {}, 2.0);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(rms_norm, T, t::dtypes) {
  t::check_unit<T>(dtrain::nn::RMSNorm(7), t::rms_norm_reference(7, 1e-6), 6, 7);
  t::check_unit<T>(dtrain::nn::RMSNorm(7, {.eps = 1e-5f, .trainable = false}), t::rms_norm_reference(7, 1e-5), 6, 7);
  // Gemma's form: the scale 1 + weight, the weight starting at zeros
  t::check_unit<T>(dtrain::nn::RMSNorm(7, {.offset = 1.f}), t::rms_norm_reference(7, 1e-6, 1.0), 6, 7);
  BOOST_TEST((dtrain::nn::RMSNorm(7, {.offset = 1.f}).params()[0].init.kind == dtrain::init_kind::zeros));
}

// Large |x| saturates the sigmoid-form activations to x or 0 (slopes 1 or
// 0) without NaN or overflow: exp(-x) overflows to inf for x < -88.
BOOST_AUTO_TEST_CASE(gated_activations_saturate) {
  using dtrain::nn::detail::gelu_tanh_op;
  using dtrain::nn::detail::silu_op;
  for (const float x : {-200.f, -60.f, 60.f, 200.f}) {
    BOOST_TEST_CONTEXT("x = " << x) {
      const float y = x > 0 ? x : 0.f, slope = x > 0 ? 1.f : 0.f;
      BOOST_TEST(std::abs(gelu_tanh_op::forward(x) - y) <= 1e-20f);
      BOOST_TEST(std::abs(silu_op::forward(x) - y) <= 1e-20f);
      BOOST_TEST(std::abs(gelu_tanh_op::backward(x, 0.f, 1.f) - slope) <= 1e-20f);
      BOOST_TEST(std::abs(silu_op::backward(x, 0.f, 1.f) - slope) <= 1e-20f);
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(layer_norm, T, t::dtypes) {
  t::check_unit<T>(dtrain::nn::LayerNorm(7), t::layer_norm_reference(7, 1e-5), 6, 7);
}

// The first unit gets no input gradient; a frozen unit no parameter gradients.
BOOST_AUTO_TEST_CASE(first_and_frozen_units) {
  t::check_unit<float>(dtrain::nn::Linear(5, 4), t::linear_reference(5, 4, true), 6, 5, false);
  t::check_unit<float>(dtrain::nn::LayerNorm(7), t::layer_norm_reference(7, 1e-5), 6, 7, false);
  t::check_unit<float>(dtrain::nn::Linear(5, 4, {.trainable = false}), t::linear_reference(5, 4, true), 6, 5);
  t::check_unit<float>(dtrain::nn::LayerNorm(7, {.trainable = false}), t::layer_norm_reference(7, 1e-5), 6, 7);
}

BOOST_AUTO_TEST_CASE(declared_parameters_follow_pytorch) {
  const auto lin = dtrain::nn::Linear(16, 3).params();
  BOOST_TEST_REQUIRE(lin.size() == 2u);
  BOOST_TEST(lin[0].name == "weight");
  BOOST_TEST((lin[0].shape == std::vector<std::int64_t>{3, 16}));
  BOOST_TEST(lin[1].name == "bias");
  BOOST_TEST((lin[1].shape == std::vector<std::int64_t>{3}));
  for (const auto& p : lin) {
    BOOST_TEST((p.init.kind == dtrain::init_kind::uniform && p.init.a == -0.25f && p.init.b == 0.25f));
    BOOST_TEST(p.trainable);
  }
  const auto ln = dtrain::nn::LayerNorm(8).params();
  BOOST_TEST_REQUIRE(ln.size() == 2u);
  BOOST_TEST((ln[0].init.kind == dtrain::init_kind::ones && ln[1].init.kind == dtrain::init_kind::zeros));
  BOOST_TEST(dtrain::nn::GELU{}.params().empty());
  BOOST_TEST(dtrain::nn::Linear(5, 4, {.trainable = false}).params()[1].trainable == false);
}

BOOST_AUTO_TEST_CASE(shape_mismatches_name_the_unit) {
  BOOST_CHECK_EXCEPTION(
      dtrain::nn::Linear(5, 4).out_features(6), dtrain::config_error, [](const dtrain::config_error& e) {
        return std::string(e.what()).find("nn::Linear expects inputs of width 5, got 6") != std::string::npos;
      });
  BOOST_CHECK_THROW(dtrain::nn::Linear(0, 4), dtrain::config_error);
  BOOST_CHECK_THROW(dtrain::nn::LayerNorm(7).out_features(8), dtrain::config_error);
  BOOST_CHECK_THROW(dtrain::nn::RMSNorm(7).out_features(8), dtrain::config_error);
  BOOST_CHECK_THROW(dtrain::nn::RMSNorm(7, {.eps = 0.f}), dtrain::config_error);
  BOOST_CHECK_THROW(dtrain::nn::SwiGLU{}.out_features(9), dtrain::config_error);

  dtrain::Host dev(1);
  dtrain::nn::Linear lin(5, 4);
  t::UnitCase c = t::make_case(lin, 2, 5, 1);
  c.in = 6;  // the views now disagree with the unit
  c.x.resize(12);
  BOOST_CHECK_EXCEPTION(t::run_unit<float>(dev, lin, c), dtrain::config_error, [](const dtrain::config_error& e) {
    return std::string(e.what()).find("nn::Linear: input is [2 x 6], expected [2 x 5]") != std::string::npos;
  });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(softmax_cross_entropy)

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_float64_and_finite_differences, T, t::dtypes) {
  const std::int64_t rows = 5, classes = 7;
  const float scale = 0.25f;
  std::mt19937_64 rng(7);
  const std::vector<double> z = t::round_to<T>(t::random_nonzero(rows * classes, rng, 3.0));
  const std::vector<std::int32_t> labels{0, 6, 3, 3, 1};
  dtrain::Host dev(1);
  const auto [loss, dlogits] = t::run_loss<T>(dev, z, labels, classes, scale);

  const double ref = t::cross_entropy_reference(z, labels, classes);
  BOOST_TEST(loss == ref, boost::test_tools::tolerance(1e-5));
  const auto scaled_loss = [&](const std::vector<double>& v) {
    return scale * t::cross_entropy_reference(v, labels, classes);
  };
  t::expect_close(dlogits, t::finite_difference(scaled_loss, z), t::backward_tol<T>, "dlogits");
}

BOOST_AUTO_TEST_CASE(large_logits_stay_finite) {
  const std::int64_t rows = 3, classes = 4;
  std::mt19937_64 rng(8);
  std::vector<double> z = t::random_nonzero(rows * classes, rng);
  for (auto& v : z) v = static_cast<float>(v + 1000.0);  // exp(1000) overflows: the max shift must prevent it
  const std::vector<std::int32_t> labels{1, 0, 3};
  dtrain::Host dev(1);
  const auto [loss, dlogits] = t::run_loss<float>(dev, z, labels, classes, 1.f);
  BOOST_TEST(loss == t::cross_entropy_reference(z, labels, classes), boost::test_tools::tolerance(1e-4));
  for (std::int64_t r = 0; r < rows; ++r) {
    double row_sum = 0.0;  // softmax - onehot sums to zero
    for (std::int64_t c = 0; c < classes; ++c) row_sum += dlogits[static_cast<std::size_t>(r * classes + c)];
    BOOST_TEST(std::abs(row_sum) < 1e-6);
  }
}

BOOST_AUTO_TEST_CASE(out_of_range_label_names_row_and_label) {
  dtrain::Host dev(1);
  dtrain::nn::SoftmaxCrossEntropy loss;
  std::vector<float> z(3 * 4, 0.5f), dz(3 * 4, 7.f);
  const std::vector<std::int32_t> labels{0, 4, -1};
  const dtrain::MatView<const float> zv{z.data(), 3, 4};
  const auto names_row_1 = [](const dtrain::config_error& e) {
    return std::string(e.what()).find("label 4 at row 1 is outside [0, 4)") != std::string::npos;
  };
  dtrain::Host::buffer<std::int32_t> storage;
  const auto forward = [&](const std::vector<std::int32_t>& l) {
    return loss.forward<dtrain::Host, float>(dev, zv, t::label_batch(dev, l, storage));
  };
  const auto backward = [&](const std::vector<std::int32_t>& l) {
    loss.backward<dtrain::Host, float>(dev, zv, t::label_batch(dev, l, storage), {dz.data(), 3, 4}, 1.f);
  };
  BOOST_CHECK_EXCEPTION(forward(labels), dtrain::config_error, names_row_1);
  BOOST_CHECK_EXCEPTION(backward(labels), dtrain::config_error, names_row_1);
  BOOST_TEST(std::all_of(dz.begin(), dz.end(), [](float v) { return v == 7.f; }), "nothing was written");
  BOOST_CHECK_THROW(forward({0, 4}), dtrain::config_error);
}

BOOST_AUTO_TEST_SUITE_END()
