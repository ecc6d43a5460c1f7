// The diffusion units (nn/diffusion_units.hpp) on dtrain::Host against
// float64 references written here, over random non-zero inputs and
// parameters rounded to the dtype first; tolerances relative to the largest
// reference element (kernels/numeric.hpp: expect_close):
//  - nn::GroupNorm forward, input, weight and bias gradients against the
//    formula and its analytic gradient (which is itself checked against
//    central finite differences of the forward), over group counts from 1 to
//    channels, odd image sizes and one-pixel images: fp32 within 1e-5 for
//    forward and every gradient (measured <= 2.5e-7); bf16/fp16 one rounding
//    of the result more (forward_tol and backward_tol, nn/reference.hpp:
//    2^-8 + 2e-5 and 2^-8 + 1e-4 in bf16; measured <= 3.1e-3 in bf16,
//    4.8e-4 in fp16); frozen parameters give no gradients; the parameters
//    and the errors, channels % groups among them;
//  - nn::Upsample2d forward (exact: copies) and input gradient (sums of
//    factor^2 values: fp32 1e-5, measured 9e-8; bf16/fp16 forward_tol,
//    measured 3.6e-3 in bf16) for factors 1, 2, 3 over odd image sizes;
//  - nn::get_timestep_embedding against diffusers' formula in float64 for
//    both flip_sin_to_cos settings, downscale_freq_shift 0 and 1, odd and
//    even dims, scale and max_period: fp32 within 1e-6 of 1 (one rounding of
//    a value in [-1, 1]; measured 3e-8), bf16 2^-8 (measured 2e-3); and
//    against values worked out by hand.
// (Part of the nn program: nn_test.cpp names the module.)
#include "dtrain/nn/diffusion_units.hpp"

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

namespace {

namespace t = dtrain::testing;
using dtrain::nn::Extent2;
using dtrain::nn::GroupNorm;
using dtrain::nn::TimestepEmbeddingOptions;
using dtrain::nn::Upsample2d;

static_assert(dtrain::Unit<GroupNorm, dtrain::Host, float> && dtrain::Unit<GroupNorm, dtrain::Host, dtrain::bf16> &&
              dtrain::Unit<GroupNorm, dtrain::Host, dtrain::fp16>);
static_assert(dtrain::Unit<Upsample2d, dtrain::Host, float> && dtrain::Unit<Upsample2d, dtrain::Host, dtrain::bf16>);

// fp32: 1e-5 of the largest reference element for the forward and every
// gradient (the statistics are double sums; what is left is fp32 arithmetic
// on O(1) values); the half dtypes: the library's one-rounding tolerances.
template <class T>
constexpr double norm_forward_tol = std::is_same_v<T, float> ? 1e-5 : t::forward_tol<T>;
template <class T>
constexpr double norm_grad_tol = std::is_same_v<T, float> ? 1e-5 : t::backward_tol<T>;

// The message of a config_error holds `part`.
auto says(const std::string& part) {
  return [part](const dtrain::config_error& e) {
    const bool found = std::string(e.what()).find(part) != std::string::npos;
    if (!found) BOOST_TEST_MESSAGE("message: " << e.what());
    return found;
  };
}

// The worst |got - ref| over the largest |ref|: what expect_close measures,
// logged (--log_level=message) to state the tolerances' margins.
double worst_relative(const std::vector<double>& got, const std::vector<double>& ref) {
  double scale = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::abs(ref[i]));
    worst = std::max(worst, std::abs(got[i] - ref[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

void expect_close_logged(const std::vector<double>& got, const std::vector<double>& ref, double tol,
                         const std::string& what) {
  if (got.size() == ref.size()) BOOST_TEST_MESSAGE(what << ": worst relative error " << worst_relative(got, ref));
  t::expect_close(got, ref, tol, what);
}

struct GroupCase {
  std::int64_t batch, channels, groups, height, width;
  std::int64_t in() const { return channels * height * width; }
  std::int64_t plane() const { return height * width; }
};

const std::vector<GroupCase> group_cases{
    {2, 6, 3, 5, 3},     // two channels per group, odd image
    {3, 4, 4, 3, 5},     // groups == channels (an instance norm)
    {2, 5, 1, 7, 1},     // groups == 1 (a layer norm over the whole image)
    {2, 8, 2, 1, 1},     // one-pixel images
    {1, 12, 4, 9, 7},    // three channels per group
    {2, 64, 32, 7, 9},   // a UNet's 32 groups of two channels
    {1, 320, 32, 5, 5},  // stable diffusion's first block: 10 channels per group
};

struct GroupGrads {
  std::vector<double> dx, dweight, dbias;
};

// Calls f(n, g, index of the group's first value) for every group of every image.
template <class F>
void for_each_group(const GroupCase& k, std::int64_t batch, F&& f) {
  const std::int64_t cpg = k.channels / k.groups;
  for (std::int64_t n = 0; n < batch; ++n)
    for (std::int64_t g = 0; g < k.groups; ++g)
      f(n, g, static_cast<std::size_t>((n * k.channels + g * cpg) * k.plane()));
}

// The mean and 1 / sqrt(biased variance + eps) of the `size` values from `base`.
std::pair<double, double> moments(const std::vector<double>& x, std::size_t base, std::size_t size, double eps) {
  double mean = 0.0, var = 0.0;
  for (std::size_t i = 0; i < size; ++i) mean += x[base + i];
  mean /= static_cast<double>(size);
  for (std::size_t i = 0; i < size; ++i) var += (x[base + i] - mean) * (x[base + i] - mean);
  var /= static_cast<double>(size);
  return {mean, 1.0 / std::sqrt(var + eps)};
}

// torch.nn.GroupNorm in float64: params weight [channels], bias [channels].
t::RefForward group_norm_reference(const GroupCase& k, double eps = 1e-5) {
  return [k, eps](const std::vector<std::vector<double>>& p, const std::vector<double>& x) {
    const std::int64_t batch = static_cast<std::int64_t>(x.size()) / k.in();
    const auto size = static_cast<std::size_t>(k.channels / k.groups * k.plane());
    const auto plane = static_cast<std::size_t>(k.plane());
    std::vector<double> y(x.size());
    for_each_group(k, batch, [&](std::int64_t, std::int64_t g, std::size_t base) {
      const auto [mean, rstd] = moments(x, base, size, eps);
      for (std::size_t i = 0; i < size; ++i) {
        const auto c = static_cast<std::size_t>(g * (k.channels / k.groups)) + i / plane;
        y[base + i] = (x[base + i] - mean) * rstd * p[0][c] + p[1][c];
      }
    });
    return y;
  };
}

// The gradients of sum(dy * y) in float64, from the textbook derivation:
// per group, with xhat = (x - mean) * rstd and g = dy * weight,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dweight[c] = sum(dy *
// xhat), dbias[c] = sum(dy) over the images' planes of channel c.
GroupGrads group_norm_grads(const GroupCase& k, const std::vector<std::vector<double>>& p, const std::vector<double>& x,
                            const std::vector<double>& dy, double eps = 1e-5) {
  const std::int64_t batch = static_cast<std::int64_t>(x.size()) / k.in();
  const auto size = static_cast<std::size_t>(k.channels / k.groups * k.plane());
  const auto plane = static_cast<std::size_t>(k.plane());
  GroupGrads r{std::vector<double>(x.size()), std::vector<double>(static_cast<std::size_t>(k.channels), 0.0),
               std::vector<double>(static_cast<std::size_t>(k.channels), 0.0)};
  for_each_group(k, batch, [&](std::int64_t, std::int64_t g, std::size_t base) {
    const auto [mean, rstd] = moments(x, base, size, eps);
    const auto channel = [&](std::size_t i) {
      return static_cast<std::size_t>(g * (k.channels / k.groups)) + i / plane;
    };
    double mean_g = 0.0, mean_gx = 0.0;
    for (std::size_t i = 0; i < size; ++i) {
      const double xhat = (x[base + i] - mean) * rstd, gi = dy[base + i] * p[0][channel(i)];
      mean_g += gi;
      mean_gx += gi * xhat;
      r.dweight[channel(i)] += dy[base + i] * xhat;
      r.dbias[channel(i)] += dy[base + i];
    }
    mean_g /= static_cast<double>(size);
    mean_gx /= static_cast<double>(size);
    for (std::size_t i = 0; i < size; ++i) {
      const double xhat = (x[base + i] - mean) * rstd;
      r.dx[base + i] = rstd * (dy[base + i] * p[0][channel(i)] - mean_g - xhat * mean_gx);
    }
  });
  return r;
}

template <class T>
void check_group_norm(const GroupCase& k, bool trainable = true) {
  BOOST_TEST_CONTEXT(k.batch << "x" << k.channels << "x" << k.height << "x" << k.width << ", " << k.groups << " groups"
                             << (trainable ? " " : " frozen ") << dtrain::dtype_traits<T>::name) {
    dtrain::Host dev(1);
    GroupNorm unit(k.groups, k.channels, {k.height, k.width}, {.trainable = trainable});
    const t::UnitCase c = t::rounded<T>(t::make_case(unit, k.batch, k.in(), 17));
    BOOST_TEST_REQUIRE(c.out == k.in());
    const t::UnitResult r = t::run_unit<T>(dev, unit, c);
    expect_close_logged(r.y, group_norm_reference(k)(c.params, c.x), norm_forward_tol<T>, "forward");
    const GroupGrads g = group_norm_grads(k, c.params, c.x, c.dy);
    expect_close_logged(r.dx, g.dx, norm_grad_tol<T>, "input gradient");
    if (trainable) {
      expect_close_logged(r.grads[0], g.dweight, norm_grad_tol<T>, "weight gradient");
      expect_close_logged(r.grads[1], g.dbias, norm_grad_tol<T>, "bias gradient");
    } else {
      BOOST_TEST(r.grads[0].empty());
      BOOST_TEST(r.grads[1].empty());
    }
  }
}

struct UpsampleCase {
  std::int64_t batch, channels, height, width, factor;
  std::int64_t in() const { return channels * height * width; }
};

const std::vector<UpsampleCase> upsample_cases{
    {2, 3, 5, 3, 2}, {1, 2, 1, 1, 2}, {3, 1, 4, 7, 3}, {2, 4, 3, 3, 1}, {1, 5, 7, 5, 2},
};

// Calls f(y index, x index) for every output pixel and the input pixel it copies.
template <class F>
void upsample_pairs(const UpsampleCase& k, F&& f) {
  const std::int64_t oh_n = k.height * k.factor, ow_n = k.width * k.factor;
  for (std::int64_t plane = 0; plane < k.batch * k.channels; ++plane)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        f(static_cast<std::size_t>((plane * oh_n + oh) * ow_n + ow),
          static_cast<std::size_t>((plane * k.height + oh / k.factor) * k.width + ow / k.factor));
}

template <class T>
void check_upsample(const UpsampleCase& k) {
  BOOST_TEST_CONTEXT(k.batch << "x" << k.channels << "x" << k.height << "x" << k.width << ", factor " << k.factor << " "
                             << dtrain::dtype_traits<T>::name) {
    dtrain::Host dev(1);
    Upsample2d unit(k.channels, {k.height, k.width}, k.factor);
    const t::UnitCase c = t::rounded<T>(t::make_case(unit, k.batch, k.in(), 23));
    BOOST_TEST_REQUIRE(c.out == k.in() * k.factor * k.factor);
    const t::UnitResult r = t::run_unit<T>(dev, unit, c);
    std::vector<double> y(static_cast<std::size_t>(k.batch * c.out)), dx(c.x.size(), 0.0);
    upsample_pairs(k, [&](std::size_t o, std::size_t i) {
      y[o] = c.x[i];
      dx[i] += c.dy[o];
    });
    t::expect_close(r.y, y, 0.0, "forward (copies)");
    expect_close_logged(r.dx, dx, t::forward_tol<T>, "input gradient");
  }
}

// diffusers' get_timestep_embedding step by step, in float64.
std::vector<double> timestep_reference(const std::vector<double>& timesteps, const TimestepEmbeddingOptions& o) {
  const std::int64_t half = o.dim / 2;
  std::vector<double> out;
  for (double ts : timesteps) {
    std::vector<double> sin_part, cos_part;
    for (std::int64_t k = 0; k < half; ++k) {
      const double exponent = -std::log(o.max_period) * static_cast<double>(k) / (half - o.downscale_freq_shift);
      const double angle = o.scale * (ts * std::exp(exponent));
      sin_part.push_back(std::sin(angle));
      cos_part.push_back(std::cos(angle));
    }
    const auto& first = o.flip_sin_to_cos ? cos_part : sin_part;
    const auto& second = o.flip_sin_to_cos ? sin_part : cos_part;
    out.insert(out.end(), first.begin(), first.end());
    out.insert(out.end(), second.begin(), second.end());
    if (o.dim % 2 == 1) out.push_back(0.0);  // F.pad(emb, (0, 1, 0, 0))
  }
  return out;
}

template <class T>
std::vector<double> run_timesteps(const std::vector<double>& timesteps, const TimestepEmbeddingOptions& o) {
  dtrain::Host dev(1);
  const auto ts = t::upload<float>(dev, timesteps);
  auto out = dtrain::make_buffer<T>(dev, timesteps.size() * static_cast<std::size_t>(o.dim));
  dtrain::nn::get_timestep_embedding(dev, ts.data(), out.view(static_cast<std::int64_t>(timesteps.size()), o.dim), o);
  return t::download<T>(dev, out);
}

// Timesteps as a sampler draws them (integers up to 999) and fractional ones,
// each exact in float.
const std::vector<double> timesteps{0.0, 1.0, 10.0, 999.0, 500.5, 37.25, 0.125};

}  // namespace

BOOST_AUTO_TEST_SUITE(diffusion_group_norm)

BOOST_AUTO_TEST_CASE(reference_gradients_match_finite_differences) {
  for (const GroupCase& k : {GroupCase{2, 6, 3, 3, 1}, GroupCase{1, 4, 1, 2, 3}, GroupCase{2, 3, 3, 1, 2}}) {
    GroupNorm unit(k.groups, k.channels, {k.height, k.width});
    const t::UnitCase c = t::make_case(unit, k.batch, k.in(), 5);
    const t::FdGrads fd = t::finite_difference_grads(group_norm_reference(k), c);
    const GroupGrads g = group_norm_grads(k, c.params, c.x, c.dy);
    t::expect_close(g.dx, fd.dx, 1e-7, "input gradient");
    t::expect_close(g.dweight, fd.grads[0], 1e-7, "weight gradient");
    t::expect_close(g.dbias, fd.grads[1], 1e-7, "bias gradient");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_float64, T, t::dtypes) {
  for (const auto& k : group_cases) check_group_norm<T>(k);
}

BOOST_AUTO_TEST_CASE(frozen_parameters_have_no_gradients) { check_group_norm<float>(group_cases[0], false); }

// Rows of one value repeated: variance 0, xhat 0, y = bias; rstd = 1 / sqrt(eps).
BOOST_AUTO_TEST_CASE(constant_images_give_the_bias) {
  dtrain::Host dev(1);
  GroupNorm unit(2, 4, {3, 3});
  t::UnitCase c = t::make_case(unit, 2, 36, 3);
  for (double& v : c.x) v = 0.75;
  const t::UnitResult r = t::run_unit<float>(dev, unit, c);
  for (std::size_t i = 0; i < r.y.size(); ++i)
    BOOST_TEST(r.y[i] == static_cast<double>(static_cast<float>(c.params[1][(i / 9) % 4])));
  for (double v : r.dx) BOOST_TEST(std::isfinite(v));
}

BOOST_AUTO_TEST_CASE(declares_parameters_and_refuses_bad_shapes) {
  const auto specs = GroupNorm(32, 320, {8, 8}).params();
  BOOST_TEST_REQUIRE(specs.size() == 2u);
  BOOST_TEST(specs[0].name == "weight");
  BOOST_TEST(specs[1].name == "bias");
  for (const auto& s : specs) {
    BOOST_TEST(s.shape == std::vector<std::int64_t>{320});
    BOOST_TEST(s.trainable);
  }
  BOOST_TEST((specs[0].init.kind == dtrain::init_kind::ones && specs[1].init.kind == dtrain::init_kind::zeros));
  BOOST_TEST((specs[0].tags == std::vector<std::string>{"norm"}));
  BOOST_TEST((specs[1].tags == std::vector<std::string>{"norm", "bias"}));
  BOOST_TEST(!GroupNorm(2, 4, {3, 3}, {.trainable = false}).params()[1].trainable);
  BOOST_TEST(GroupNorm(32, 320, {8, 8}).out_features(320 * 64) == 320 * 64);
  BOOST_CHECK_EXCEPTION(GroupNorm(32, 48, {8, 8}), dtrain::config_error,
                        says("48 channels do not split into 32 equal groups"));
  BOOST_CHECK_EXCEPTION(GroupNorm(3, 4, {1, 1}), dtrain::config_error, says("nn::GroupNorm(3 groups, 4 channels)"));
  BOOST_CHECK_EXCEPTION(GroupNorm(0, 4, {3, 3}), dtrain::config_error, says("must be >= 1"));
  BOOST_CHECK_EXCEPTION(GroupNorm(2, 4, {3, 3}, {.eps = 0.f}), dtrain::config_error, says("must be > 0"));
  BOOST_CHECK_EXCEPTION(GroupNorm(2, 4, {3, 3}).out_features(4 * 3 * 4), dtrain::config_error,
                        says("nn::GroupNorm expects 4 channels of 3 x 3 images, 36 values per row"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(diffusion_upsample2d)

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_float64, T, t::dtypes) {
  for (const auto& k : upsample_cases) check_upsample<T>(k);
}

BOOST_AUTO_TEST_CASE(shape_and_errors) {
  const Upsample2d up(320, {32, 32});
  BOOST_TEST(up.factor() == 2);
  BOOST_TEST(up.out_h() == 64);
  BOOST_TEST(up.out_features(320 * 32 * 32) == 320 * 64 * 64);
  BOOST_TEST(up.params().empty());
  BOOST_TEST(Upsample2d(3, {5, 7}, 3).out_w() == 21);
  BOOST_CHECK_EXCEPTION(Upsample2d(3, {5, 7}, 0), dtrain::config_error, says("must be >= 1"));
  BOOST_CHECK_EXCEPTION(Upsample2d(3, {5, 7}).out_features(3 * 5 * 6), dtrain::config_error,
                        says("nn::Upsample2d expects 3 channels of 5 x 7 images, 105 values per row"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(diffusion_timestep_embedding)

BOOST_AUTO_TEST_CASE(matches_the_float64_formula) {
  for (const std::int64_t dim : {1, 4, 5, 32, 33, 320})
    for (const bool flip : {false, true})
      for (const double shift : {0.0, 1.0}) {
        const TimestepEmbeddingOptions o{.dim = dim, .flip_sin_to_cos = flip, .downscale_freq_shift = shift};
        BOOST_TEST_CONTEXT("dim " << dim << ", flip_sin_to_cos " << flip << ", downscale_freq_shift " << shift) {
          const std::vector<double> ref = timestep_reference(timesteps, o);
          expect_close_logged(run_timesteps<float>(timesteps, o), ref, 1e-6, "fp32");
          expect_close_logged(run_timesteps<dtrain::bf16>(timesteps, o), ref, t::roundoff<dtrain::bf16>(), "bf16");
        }
      }
  // scale and max_period (diffusers' defaults are 1 and 10000)
  const TimestepEmbeddingOptions o{
      .dim = 16, .flip_sin_to_cos = true, .downscale_freq_shift = 0.0, .scale = 25.0, .max_period = 500.0};
  expect_close_logged(run_timesteps<float>(timesteps, o), timestep_reference(timesteps, o), 1e-6, "scale 25, 500");
}

// Worked out by hand (exact values, which float32 rounds by at most 6e-8):
//  - dim 6, shift 1, t = 10: half 3, exponent -ln(10000) * [0, 1, 2] / 2, so
//    the frequencies are [1, 1e-2, 1e-4] and the angles [10, 0.1, 0.001]:
//    [sin 10, sin 0.1, sin 0.001, cos 10, cos 0.1, cos 0.001];
//  - dim 5, shift 0, flipped, t = 1: half 2, exponent -ln(10000) * [0, 1] / 2,
//    frequencies [1, 1e-2]: [cos 1, cos 0.01, sin 1, sin 0.01, 0];
//  - dim 4, shift 1, t = 0: [sin 0, sin 0, cos 0, cos 0] = [0, 0, 1, 1].
BOOST_AUTO_TEST_CASE(known_values) {
  const std::vector<double> a{-0.5440211108893698, 0.09983341664682815, 0.0009999998333333417,
                              -0.8390715290764524, 0.9950041652780258,  0.9999995000000417};
  t::expect_close(run_timesteps<float>({10.0}, {.dim = 6, .flip_sin_to_cos = false, .downscale_freq_shift = 1.0}), a,
                  1e-7, "dim 6, shift 1, t 10");
  const std::vector<double> b{0.5403023058681398, 0.9999500004166653, 0.8414709848078965, 0.009999833334166664, 0.0};
  t::expect_close(run_timesteps<float>({1.0}, {.dim = 5, .flip_sin_to_cos = true, .downscale_freq_shift = 0.0}), b,
                  1e-7, "dim 5, shift 0, flipped, t 1");
  const std::vector<double> zero{0.0, 0.0, 1.0, 1.0};
  t::expect_close(run_timesteps<float>({0.0}, {.dim = 4}), zero, 0.0, "dim 4, t 0");
}

BOOST_AUTO_TEST_CASE(refuses_bad_options) {
  // dim 2 or 3 with shift 1: half - shift = 0, diffusers' NaN
  BOOST_CHECK_EXCEPTION(run_timesteps<float>({1.0}, {.dim = 3, .downscale_freq_shift = 1.0}), dtrain::config_error,
                        says("dim / 2 - downscale_freq_shift is 0"));
  BOOST_CHECK_EXCEPTION(run_timesteps<float>({1.0}, {.dim = 0}), dtrain::config_error, says("dim must be >= 1"));
  BOOST_CHECK_EXCEPTION(run_timesteps<float>({1.0}, {.dim = 4, .max_period = 0.0}), dtrain::config_error,
                        says("max_period must be > 0"));
}

BOOST_AUTO_TEST_SUITE_END()
