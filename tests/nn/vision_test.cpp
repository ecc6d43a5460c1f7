// The vision units on dtrain::Host against float64 references written in
// the test (vision_reference.hpp: direct convolution loops, not im2col):
//  - nn::Conv2d forward, input, weight and bias gradients, over strides,
//    paddings, groups (1, 2, depthwise), odd sizes and non-square kernels:
//    fp32 within 1e-5 (forward) and 1e-4 (gradients) of the largest
//    reference element; bf16/fp16 one rounding more (forward_tol and
//    backward_tol, nn/reference.hpp), gradients 3 x (the input gradient sums
//    up to kernel_h * kernel_w values already rounded to the dtype), inputs
//    rounded to the dtype first;
//  - the same unit against central finite differences of the reference
//    forward (the library's usual check, which also checks the reference);
//  - nn::PatchEmbedding with and without class token and bias, non-square
//    images: tokens and all gradients, same tolerances;
//  - nn::QuickGELU forward and backward, and its saturation;
//  - the errors: groups, input widths, kernels larger than the padded input,
//    other image sizes, the GPU switch.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include "nn/unit_harness.hpp"
#include "nn/vision_reference.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/patch_embedding.hpp"

namespace {

namespace t = dtrain::testing;
using dtrain::nn::Conv2d;
using dtrain::nn::PatchEmbedding;

static_assert(dtrain::Unit<Conv2d, dtrain::Host, float> && dtrain::Unit<Conv2d, dtrain::Host, dtrain::bf16> &&
              dtrain::Unit<Conv2d, dtrain::Host, dtrain::fp16>);
static_assert(dtrain::Unit<dtrain::nn::QuickGELU, dtrain::Host, float>);

template <class T>
void check_conv(const t::ConvCase& k, bool want_dx = true, bool trainable = true) {
  dtrain::Host dev(1);
  t::check_conv_on<T>(dev, k, want_dx, trainable);
}

// The message of a config_error holds `part`.
auto says(const std::string& part) {
  return [part](const dtrain::config_error& e) {
    const bool found = std::string(e.what()).find(part) != std::string::npos;
    if (!found) BOOST_TEST_MESSAGE("message: " << e.what());
    return found;
  };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(conv2d)

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_direct_convolution, T, t::dtypes) {
  for (const auto& k : t::conv_cases) check_conv<T>(k);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_finite_differences, T, t::dtypes) {
  for (const std::size_t i : {1u, 2u, 3u}) {
    const t::ConvCase& k = t::conv_cases[i];
    BOOST_TEST_CONTEXT(t::describe(k)) {
      t::check_unit<T>(
          k.unit(), [k](const auto& p, const auto& x) { return t::conv_forward_reference(k, p, x); }, k.batch,
          k.in_size(), true, {}, std::is_same_v<T, float> ? 1.0 : 3.0);
    }
  }
}

// The first unit gets no input gradient; a frozen unit no parameter gradients.
BOOST_AUTO_TEST_CASE(first_and_frozen) {
  check_conv<float>(t::conv_cases[1], false);
  check_conv<float>(t::conv_cases[1], true, false);
}

// A rank with no data left: no output, zero parameter gradients.
BOOST_AUTO_TEST_CASE(empty_batch) {
  t::ConvCase k = t::conv_cases[0];
  Conv2d unit = k.unit();
  t::UnitCase c = t::make_case(unit, 0, k.in_size(), 3);
  dtrain::Host dev(1);
  const t::UnitResult r = t::run_unit<float>(dev, unit, c);
  for (const auto& g : r.grads)
    for (const double v : g) BOOST_TEST(v == 0.0);
}

BOOST_AUTO_TEST_CASE(declares_pytorch_parameters) {
  const auto specs = Conv2d(4, 6, {3, 2}, {8, 8}, {.groups = 2}).params();
  BOOST_TEST_REQUIRE(specs.size() == 2u);
  BOOST_TEST((specs[0].shape == std::vector<std::int64_t>{6, 2, 3, 2}));
  BOOST_TEST((specs[1].shape == std::vector<std::int64_t>{6}));
  const float bound = 1.f / std::sqrt(12.f);  // fan_in = 2 * 3 * 2
  BOOST_TEST((specs[0].init.kind == dtrain::init_kind::uniform && std::abs(specs[0].init.b - bound) < 1e-6f));
  BOOST_TEST(Conv2d(1, 1, {1, 1}, {1, 1}, {.bias = false}).params().size() == 1u);
  const Conv2d c(3, 8, {3, 3}, {32, 30}, {.stride = {2, 2}, .padding = {1, 1}});
  BOOST_TEST(c.out_h() == 16);
  BOOST_TEST(c.out_w() == 15);
  BOOST_TEST(c.out_features(3 * 32 * 30) == 8 * 16 * 15);
}

BOOST_AUTO_TEST_CASE(errors_name_the_problem_and_the_fix) {
  BOOST_CHECK_EXCEPTION(Conv2d(6, 4, {3, 3}, {8, 8}, {.groups = 4}), dtrain::config_error,
                        says("4 groups do not divide the input and output channels"));
  BOOST_CHECK_EXCEPTION(Conv2d(4, 6, {3, 3}, {8, 8}, {.groups = 4}), dtrain::config_error,
                        says("choose groups that divide both channel counts"));
  BOOST_CHECK_EXCEPTION(Conv2d(3, 4, {5, 3}, {2, 8}, {.padding = {1, 1}}), dtrain::config_error,
                        says("the kernel is larger than the padded input 4 x 10 (2 x 8 images, padding 1 x 1)"));
  BOOST_CHECK_EXCEPTION(Conv2d(3, 4, {3, 3}, {8, 8}, {.stride = {0, 1}}), dtrain::config_error,
                        says("strides must be >= 1"));
  BOOST_CHECK_THROW(Conv2d(0, 4, {3, 3}, {8, 8}), dtrain::config_error);
  BOOST_CHECK_EXCEPTION(Conv2d(3, 4, {3, 3}, {8, 8}).out_features(3 * 8 * 9), dtrain::config_error,
                        says("nn::Conv2d expects 3 channels of 8 x 8 images, 192 values per row (NCHW), got rows "
                             "of 216"));

  // Views that disagree with the unit are refused before any kernel runs.
  dtrain::Host dev(1);
  Conv2d unit(2, 3, {3, 3}, {4, 4});
  t::UnitCase c = t::make_case(unit, 2, 32, 1);
  c.in = 30;
  c.x.resize(60);
  BOOST_CHECK_EXCEPTION(t::run_unit<float>(dev, unit, c), dtrain::config_error, says("got rows of 30"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(patch_embedding)

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_float64, T, t::dtypes) {
  dtrain::Host dev(1);
  for (const auto& k : t::patch_cases) t::check_patch_on<T>(dev, k);
}

BOOST_AUTO_TEST_CASE(declares_parameters) {
  const PatchEmbedding pe(3, 16, 14, {28, 42});
  BOOST_TEST(pe.patches() == 6);
  BOOST_TEST(pe.tokens() == 7);
  const auto specs = pe.params();
  BOOST_TEST_REQUIRE(specs.size() == 4u);
  BOOST_TEST((specs[0].shape == std::vector<std::int64_t>{16, 3, 14, 14}));
  BOOST_TEST(specs[2].name == "class_embedding");
  BOOST_TEST((specs[3].shape == std::vector<std::int64_t>{7, 16}));
  BOOST_TEST(PatchEmbedding(3, 16, 14, {28, 28}, {.bias = false, .class_token = false}).params().size() == 2u);
}

BOOST_AUTO_TEST_CASE(other_image_sizes_are_refused) {
  const PatchEmbedding pe(3, 16, 14, {224, 224});
  const std::vector<std::int64_t> good{2, 3, 224, 224}, larger{2, 3, 336, 336}, gray{2, 1, 224, 224};
  BOOST_CHECK_NO_THROW(pe.check_images(good));
  BOOST_CHECK_EXCEPTION(pe.check_images(larger), dtrain::config_error,
                        says("images of 336 x 336, but the position table is for 224 x 224 images: position "
                             "interpolation is not supported"));
  BOOST_CHECK_EXCEPTION(pe.check_images(larger), dtrain::config_error, says("resize the images to 224 x 224"));
  BOOST_CHECK_EXCEPTION(pe.check_images(gray), dtrain::config_error, says("expected [batch, 3, 224, 224]"));
  BOOST_CHECK_EXCEPTION(pe.out_features(3 * 336 * 336), dtrain::config_error,
                        says("expected 3 x 224 x 224 = 150528: other image sizes need position interpolation, "
                             "which is not supported"));
  BOOST_CHECK_EXCEPTION(PatchEmbedding(3, 16, 14, {224, 220}), dtrain::config_error,
                        says("224 x 220 images do not divide into 14 x 14 patches"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(quick_gelu)

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_float64, T, t::dtypes) {
  t::check_unit<T>(dtrain::nn::QuickGELU{}, t::quick_gelu_reference(), 6, 9);
}

// The analytic derivative against the float64 one, away from the random
// inputs' range too; large |x| saturates to x or 0 without NaN.
BOOST_AUTO_TEST_CASE(derivative_and_saturation) {
  using op = dtrain::nn::detail::quick_gelu_op;
  for (const double x : {-7.0, -2.5, -0.3, 0.0, 0.4, 1.9, 6.0}) {
    const double s = 1.0 / (1.0 + std::exp(-1.702 * x)), d = s + 1.702 * x * s * (1.0 - s);
    BOOST_TEST(std::abs(op::forward(static_cast<float>(x)) - t::quick_gelu(x)) <= 1e-6);
    BOOST_TEST(std::abs(op::backward(static_cast<float>(x), 0.f, 2.f) - 2 * d) <= 1e-6);
  }
  for (const float x : {-200.f, -60.f, 60.f, 200.f}) {
    const float y = x > 0 ? x : 0.f, slope = x > 0 ? 1.f : 0.f;
    BOOST_TEST(std::abs(op::forward(x) - y) <= 1e-20f);
    BOOST_TEST(std::abs(op::backward(x, 0.f, 1.f) - slope) <= 1e-20f);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// A device the host cannot read (the GPU) runs the vision units only with
// DTRAIN_GPU_VISION=on: their GPU path has not run on a GPU yet.
BOOST_AUTO_TEST_CASE(gpu_switch) {
  ::unsetenv("DTRAIN_GPU_VISION");
  BOOST_CHECK_EXCEPTION(dtrain::nn::detail::require_gpu_vision("nn::Conv2d"), dtrain::config_error,
                        says("set DTRAIN_GPU_VISION=on"));
  ::setenv("DTRAIN_GPU_VISION", "maybe", 1);
  BOOST_CHECK_EXCEPTION(dtrain::nn::detail::require_gpu_vision("nn::Conv2d"), dtrain::config_error,
                        says("is not one of off|on"));
  ::setenv("DTRAIN_GPU_VISION", "on", 1);
  BOOST_CHECK_NO_THROW(dtrain::nn::detail::require_gpu_vision("nn::Conv2d"));
  ::unsetenv("DTRAIN_GPU_VISION");
}
