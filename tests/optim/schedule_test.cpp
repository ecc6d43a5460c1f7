#include "dtrain/optim/schedule.hpp"

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <string>

#include "optim/expect_config_error.hpp"
#include <boost/test/unit_test.hpp>

namespace tt = boost::test_tools;
using dtrain::ConstantLR;
using dtrain::lr_scaling_rule;
using dtrain::Schedule;
using dtrain::WarmupCosineLR;

// Expected values are float64, computed by hand from the decimal settings; the
// schedule rounds its inputs and its result to float, hence a relative
// tolerance of 1e-6 (about 8 float ulps).
constexpr double rel = 1e-6;

BOOST_AUTO_TEST_CASE(constant_is_constant) {
  const ConstantLR s{.lr = 3e-4f};
  s.validate();
  for (std::int64_t step : {0, 1, 1000, 1000000000}) BOOST_TEST(s(step) == 3e-4f);
}

BOOST_AUTO_TEST_CASE(warmup_cosine_at_its_boundaries) {
  const WarmupCosineLR s{.peak_lr = 1e-3f, .warmup_steps = 10, .total_steps = 110, .min_lr = 1e-5f};
  s.validate();
  BOOST_TEST(s(0) == 0.f);                                          // warmup starts at 0
  BOOST_TEST(s(5) == 5e-4, tt::tolerance(rel));                     // half way up
  BOOST_TEST(s(9) == 9e-4, tt::tolerance(rel));                     // last warmup step
  BOOST_TEST(s(10) == 1e-3, tt::tolerance(rel));                    // peak: cosine at progress 0
  BOOST_TEST(s(35) == 8.55017856687341e-4, tt::tolerance(rel));     // progress 1/4: 1e-5 + 0.99e-3 (1 + cos(pi/4)) / 2
  BOOST_TEST(s(60) == 5.05e-4, tt::tolerance(rel));                 // progress 1/2: the midpoint of peak and min
  BOOST_TEST(s(109) == 1.0244252618962858e-5, tt::tolerance(rel));  // progress 0.99
  BOOST_TEST(s(110) == 1e-5, tt::tolerance(rel));                   // total_steps: min_lr
  BOOST_TEST(s(111) == 1e-5, tt::tolerance(rel));                   // beyond: stays at min_lr
  BOOST_TEST(s(1000000000000) == 1e-5, tt::tolerance(rel));
}

BOOST_AUTO_TEST_CASE(warmup_start_and_edge_lengths) {
  const WarmupCosineLR from_quarter{.peak_lr = 2.f, .warmup_steps = 4, .total_steps = 8, .warmup_start = 0.25f};
  BOOST_TEST(from_quarter(0) == 0.5, tt::tolerance(rel));
  BOOST_TEST(from_quarter(2) == 1.25, tt::tolerance(rel));  // 2 (0.25 + 0.75 * 2/4)
  BOOST_TEST(from_quarter(4) == 2.0, tt::tolerance(rel));

  const WarmupCosineLR no_warmup{.peak_lr = 2.f, .warmup_steps = 0, .total_steps = 4};
  BOOST_TEST(no_warmup(0) == 2.0, tt::tolerance(rel));
  BOOST_TEST(no_warmup(2) == 1.0, tt::tolerance(rel));
  BOOST_TEST(no_warmup(4) == 0.f);

  // Warmup that fills the whole run: no decay phase, min_lr once it ends.
  const WarmupCosineLR warmup_only{.peak_lr = 2.f, .warmup_steps = 4, .total_steps = 4, .min_lr = 0.5f};
  warmup_only.validate();
  BOOST_TEST(warmup_only(3) == 1.5, tt::tolerance(rel));
  BOOST_TEST(warmup_only(4) == 0.5, tt::tolerance(rel));
}

BOOST_AUTO_TEST_CASE(warmup_cosine_matches_a_float64_reference_on_random_settings) {
  // The reference uses the half-angle form (1 + cos x) / 2 = cos^2(x / 2), so
  // it shares no arithmetic with the implementation.
  std::mt19937_64 rng(20240611);
  std::uniform_real_distribution<float> peak_dist(1e-5f, 1.f), frac_dist(0.01f, 0.9f);
  std::uniform_int_distribution<std::int64_t> len_dist(1, 5000);
  for (int trial = 0; trial < 200; ++trial) {
    const float peak_lr = peak_dist(rng);
    const std::int64_t warmup = len_dist(rng);
    const WarmupCosineLR s{.peak_lr = peak_lr,
                           .warmup_steps = warmup,
                           .total_steps = warmup + len_dist(rng),
                           .min_lr = peak_lr * frac_dist(rng),
                           .warmup_start = frac_dist(rng)};
    s.validate();
    const double peak = s.peak_lr, lo = s.min_lr, start = s.warmup_start;
    std::uniform_int_distribution<std::int64_t> step_dist(1, 2 * s.total_steps);
    for (int k = 0; k < 20; ++k) {
      const std::int64_t step = step_dist(rng);
      double expected = lo;
      if (step < s.warmup_steps) {
        expected = peak * start + peak * (1.0 - start) * static_cast<double>(step) / static_cast<double>(warmup);
      } else if (step < s.total_steps) {
        const double half_angle =
            std::numbers::pi / 2 * static_cast<double>(step - warmup) / static_cast<double>(s.total_steps - warmup);
        expected = lo + (peak - lo) * std::cos(half_angle) * std::cos(half_angle);
      }
      BOOST_TEST(s(step) == expected, tt::tolerance(rel));
    }
  }
}

BOOST_AUTO_TEST_CASE(schedules_reject_bad_settings) {
  expect_config_error([] { ConstantLR{}.validate(); }, "ConstantLR.lr");
  expect_config_error([] { WarmupCosineLR{.total_steps = 10}.validate(); }, "WarmupCosineLR.peak_lr");
  expect_config_error([] { WarmupCosineLR{.peak_lr = 1.f}.validate(); }, "WarmupCosineLR.total_steps");
  expect_config_error([] { WarmupCosineLR{.peak_lr = 1.f, .warmup_steps = -1, .total_steps = 10}.validate(); },
                      "WarmupCosineLR.warmup_steps");
  expect_config_error([] { WarmupCosineLR{.peak_lr = 1.f, .warmup_steps = 11, .total_steps = 10}.validate(); },
                      "WarmupCosineLR.warmup_steps = 11 exceeds total_steps = 10");
  expect_config_error([] { WarmupCosineLR{.peak_lr = 1.f, .total_steps = 10, .min_lr = 2.f}.validate(); },
                      "WarmupCosineLR.min_lr");
  expect_config_error([] { WarmupCosineLR{.peak_lr = 1.f, .total_steps = 10, .min_lr = -1.f}.validate(); },
                      "WarmupCosineLR.min_lr");
  expect_config_error([] { WarmupCosineLR{.peak_lr = 1.f, .total_steps = 10, .warmup_start = 1.5f}.validate(); },
                      "WarmupCosineLR.warmup_start");
  // A negative step is a caller's bug, not a setting: a plain dtrain::error.
  BOOST_CHECK_THROW(ConstantLR{.lr = 1.f}(-1), dtrain::error);
  BOOST_CHECK_THROW((WarmupCosineLR{.peak_lr = 1.f, .total_steps = 10}(-3)), dtrain::error);
}

BOOST_AUTO_TEST_CASE(schedule_wraps_any_schedule_and_validates_it) {
  const WarmupCosineLR cosine{.peak_lr = 1e-3f, .warmup_steps = 10, .total_steps = 110, .min_lr = 1e-5f};
  const Schedule wrapped = cosine;
  BOOST_TEST(wrapped.name() == "cosine");
  for (std::int64_t step : {0, 5, 10, 35, 110, 500}) BOOST_TEST(wrapped(step) == cosine(step));

  const Schedule copy = wrapped;
  BOOST_TEST(copy(35) == cosine(35));

  const Schedule custom = [](std::int64_t step) { return 1.f / static_cast<float>(step + 1); };
  BOOST_TEST(custom.name() == "custom");
  BOOST_TEST(custom(3) == 0.25f);

  expect_config_error([] { Schedule{WarmupCosineLR{.peak_lr = 1.f, .warmup_steps = 5, .total_steps = 4}}; },
                      "WarmupCosineLR.warmup_steps");
}

BOOST_AUTO_TEST_CASE(make_schedule_by_name) {
  const Schedule constant = dtrain::make_schedule("constant", {.lr = 2e-4f, .total_steps = 100});
  BOOST_TEST(constant.name() == "constant");
  BOOST_TEST(constant(0) == 2e-4f);
  BOOST_TEST(constant(99) == 2e-4f);

  const Schedule cosine =
      dtrain::make_schedule("cosine", {.lr = 1e-3f, .warmup_steps = 10, .total_steps = 110, .min_lr = 1e-5f});
  BOOST_TEST(cosine.name() == "cosine");
  BOOST_TEST(cosine(35) == 8.55017856687341e-4, tt::tolerance(rel));

  const Schedule linear = dtrain::make_schedule("linear", {.lr = 1e-3f, .warmup_steps = 10, .total_steps = 110});
  BOOST_TEST(linear.name() == "linear");
  BOOST_TEST(linear(60) == 5e-4, tt::tolerance(rel));
  const Schedule isqrt = dtrain::make_schedule("inverse_sqrt", {.lr = 1e-3f, .warmup_steps = 16});
  BOOST_TEST(isqrt.name() == "inverse_sqrt");
  BOOST_TEST(isqrt(64) == 5e-4, tt::tolerance(rel));

  try {
    dtrain::make_schedule("cosin", {.lr = 1e-3f, .total_steps = 10});
    BOOST_FAIL("no config_error");
  } catch (const dtrain::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("'cosin'") != std::string::npos);
    BOOST_TEST(e.fix() == "use one of: constant, cosine, linear, inverse_sqrt");
  }
  expect_config_error([] { dtrain::make_schedule("inverse_sqrt", {.lr = 1e-3f, .min_lr = 1e-5f}); }, "min_lr");
  expect_config_error([] { dtrain::make_schedule("linear", {.lr = 1e-3f, .warmup_steps = 20, .total_steps = 10}); },
                      "LinearLR.warmup_steps");
  expect_config_error([] { dtrain::make_schedule("constant", {.lr = 1e-3f, .warmup_steps = 10}); }, "warmup_steps");
  expect_config_error([] { dtrain::make_schedule("cosine", {.lr = 0.f, .total_steps = 10}); }, "peak_lr");
}

// LinearLR and InverseSqrtLR against float64 formulas on random settings
// (rel as above).
BOOST_AUTO_TEST_CASE(linear_and_inverse_sqrt_match_a_float64_reference_on_random_settings) {
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<double> unit(0.05, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const auto total = static_cast<std::int64_t>(10 + rng() % 5000);
    const auto warmup = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(total / 2 + 1));
    const float peak = static_cast<float>(unit(rng) * 1e-2), min_lr = static_cast<float>(unit(rng) * peak * 0.5);
    const float start = static_cast<float>(unit(rng) * 0.5);
    const dtrain::LinearLR lin{
        .peak_lr = peak, .warmup_steps = warmup, .total_steps = total, .min_lr = min_lr, .warmup_start = start};
    const dtrain::InverseSqrtLR inv{.peak_lr = peak, .warmup_steps = warmup, .warmup_start = start};
    lin.validate();
    inv.validate();
    for (int k = 0; k < 20; ++k) {
      const auto step = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(total + 20));
      const double p = peak, w = static_cast<double>(warmup), st = static_cast<double>(step);
      const double warm = step < warmup ? p * (start + (1 - start) * st / w) : 0;
      const double lin_ref = step < warmup   ? warm
                             : step >= total ? static_cast<double>(min_lr)
                                             : min_lr + (p - min_lr) * (total - st) / (total - w);
      const double inv_ref = step < warmup ? warm : p * std::sqrt(std::max(w, 1.0) / std::max(st, 1.0));
      BOOST_TEST(lin(step) == lin_ref, tt::tolerance(rel));
      BOOST_TEST(inv(step) == inv_ref, tt::tolerance(rel));
    }
  }
}

BOOST_AUTO_TEST_CASE(lr_scaling_rules) {
  BOOST_TEST(dtrain::scale_lr(3e-4f, lr_scaling_rule::none, 8) == 3e-4f);
  BOOST_TEST(dtrain::scale_lr(3e-4f, lr_scaling_rule::linear, 8) == 2.4e-3, tt::tolerance(rel));
  BOOST_TEST(dtrain::scale_lr(3e-4f, lr_scaling_rule::sqrt, 8) == 8.48528137423857e-4, tt::tolerance(rel));
  for (lr_scaling_rule rule : {lr_scaling_rule::none, lr_scaling_rule::linear, lr_scaling_rule::sqrt})
    BOOST_TEST(dtrain::scale_lr(0.1f, rule, 1) == 0.1f);  // one rank is the tuned setting
  expect_config_error([] { dtrain::scale_lr(1e-3f, lr_scaling_rule::linear, 0); }, "batch multiplier 0");
}
