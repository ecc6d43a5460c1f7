// The nn units and the loss on dtrain::Cuda against dtrain::Host, same random
// inputs, every dtype; plus the GPU's out-of-range label behaviour. Needs a
// GPU; exits 77 without one.
#include "support/gpu_main.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dtrain/device/cuda.hpp"
#include "dtrain/device/host.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "kernels/numeric.hpp"
#include "nn/custom_model.hpp"
#include "nn/reference.hpp"
#include "nn/unit_harness.hpp"

namespace {

namespace t = dtrain::testing;

// Same math on both sides; fp32 differs by summation order and by the GPU's
// fused multiply-adds and math functions, a half dtype by up to one rounding.
template <class T>
constexpr double cross_device_tol = std::is_same_v<T, float> ? 1e-5 : 2 * t::roundoff<T>() + 1e-4;

template <class T, class U>
void compare_unit(U unit, std::int64_t rows, std::int64_t in, const std::string& name) {
  BOOST_TEST_CONTEXT(name << " " << dtrain::dtype_traits<T>::name) {
    dtrain::Host host(1);
    dtrain::Cuda cuda(0);
    const t::UnitCase c = t::make_case(unit, rows, in, 31);
    const t::UnitResult h = t::run_unit<T>(host, unit, c);
    const t::UnitResult g = t::run_unit<T>(cuda, unit, c);
    t::expect_close(g.y, h.y, cross_device_tol<T>, "forward");
    t::expect_close(g.dx, h.dx, cross_device_tol<T>, "input gradient");
    for (std::size_t i = 0; i < c.specs.size(); ++i)
      t::expect_close(g.grads[i], h.grads[i], cross_device_tol<T>, c.specs[i].name + " gradient");
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_units)

// Enough rows and columns that the GEMMs take cuBLAS's tiled paths and
// for_each more than one block.
BOOST_AUTO_TEST_CASE_TEMPLATE(units_match_host, T, t::dtypes) {
  compare_unit<T>(dtrain::nn::Linear(70, 33), 300, 70, "Linear");
  compare_unit<T>(dtrain::nn::Linear(70, 33, {.bias = false}), 300, 70, "Linear without bias");
  compare_unit<T>(dtrain::nn::ReLU{}, 300, 70, "ReLU");
  compare_unit<T>(dtrain::nn::GELU{}, 300, 70, "GELU");
  compare_unit<T>(dtrain::nn::LayerNorm(70), 300, 70, "LayerNorm");
  compare_unit<T>(dtrain::nn::LayerNorm(70, {.trainable = false}), 300, 70, "frozen LayerNorm");
  compare_unit<T>(FeatureGain{70}, 300, 70, "FeatureGain");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(cross_entropy_matches_host, T, t::dtypes) {
  const std::int64_t rows = 257, classes = 50;
  std::mt19937_64 rng(32);
  const std::vector<double> z = t::random_nonzero(static_cast<std::size_t>(rows * classes), rng, 4.0);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  std::uniform_int_distribution<std::int32_t> label(0, classes - 1);
  for (auto& l : labels) l = label(rng);
  dtrain::Host host(1);
  dtrain::Cuda cuda(0);
  const auto h = t::run_loss<T>(host, z, labels, classes, 0.01f);
  const auto g = t::run_loss<T>(cuda, z, labels, classes, 0.01f);
  BOOST_TEST(g.loss == h.loss, boost::test_tools::tolerance(1e-5));
  t::expect_close(g.dlogits, h.dlogits, cross_device_tol<T>, "dlogits");
}

// Labels are checked on the batch's host copy before any kernel runs, so an
// out-of-range label never reaches the GPU.
BOOST_AUTO_TEST_CASE(out_of_range_label_throws_before_any_kernel) {
  dtrain::Cuda cuda(0);
  const std::int64_t rows = 3, classes = 4;
  const std::vector<std::int32_t> labels{2, 9, 0};
  auto z = t::upload<float>(cuda, std::vector<double>(rows * classes, 0.5));
  auto dz = t::upload<float>(cuda, std::vector<double>(rows * classes, 7.0));
  dtrain::Cuda::buffer<std::int32_t> storage;
  const auto batch = t::label_batch(cuda, labels, storage);
  dtrain::nn::SoftmaxCrossEntropy loss;
  const auto zv = std::as_const(z).view(rows, classes);
  const auto names_row_1 = [](const dtrain::config_error& e) {
    return std::string(e.what()).find("label 9 at row 1 is outside [0, 4)") != std::string::npos;
  };
  const auto forward = [&] { return loss.forward<dtrain::Cuda, float>(cuda, zv, batch); };
  const auto backward = [&] { loss.backward<dtrain::Cuda, float>(cuda, zv, batch, dz.view(rows, classes), 1.f); };
  BOOST_CHECK_EXCEPTION(forward(), dtrain::config_error, names_row_1);
  BOOST_CHECK_EXCEPTION(backward(), dtrain::config_error, names_row_1);
  for (double v : t::download<float>(cuda, dz)) BOOST_TEST(v == 7.0);
}

BOOST_AUTO_TEST_SUITE_END()
