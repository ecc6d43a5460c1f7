// diffusion/schedule.hpp against float64 formulas written here: every beta
// schedule's betas and alphas_cumprod, the flow sigmas and their shift, the
// eps, v and flow noisy inputs and targets on random non-zero values, the
// Min-SNR-gamma weights and the noise offset; and the draws: the same for the
// same (seed, rank, step, record) in any order or split, different for any
// other, with the moments the samplers promise. The parity with diffusers
// itself is diffusers_test.cpp.
#define BOOST_TEST_MODULE diffusion_schedule
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <dtrain/diffusion/schedule.hpp>

namespace fs = std::filesystem;
namespace dd = dtrain::diffusion;

BOOST_TEST_DONT_PRINT_LOG_VALUE(dtrain::diffusion::Objective)
BOOST_TEST_DONT_PRINT_LOG_VALUE(dtrain::diffusion::BetaSchedule)

namespace {

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

// Random non-zero values in [-2, -0.1] U [0.1, 2].
std::vector<double> nonzero(std::mt19937_64& g, std::size_t n) {
  std::uniform_real_distribution<double> mag(0.1, 2.0);
  std::bernoulli_distribution sign(0.5);
  std::vector<double> out(n);
  for (auto& x : out) x = sign(g) ? mag(g) : -mag(g);
  return out;
}

double f32(double x) { return static_cast<double>(static_cast<float>(x)); }

// The float64 betas of a schedule, straight from the definitions.
std::vector<double> betas64(dd::BetaSchedule kind, double start, double end, std::int64_t n) {
  std::vector<double> b(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double f = n == 1 ? 0.0 : static_cast<double>(i) / static_cast<double>(n - 1);
    const auto alpha_bar = [](double t) { return std::pow(std::cos((t + 0.008) / 1.008 * std::numbers::pi / 2), 2); };
    switch (kind) {
      case dd::BetaSchedule::linear: b[i] = start + f * (end - start); break;
      case dd::BetaSchedule::scaled_linear:
        b[i] = std::pow(std::sqrt(start) + f * (std::sqrt(end) - std::sqrt(start)), 2);
        break;
      case dd::BetaSchedule::squaredcos_cap_v2:
        b[i] = std::min(1 - alpha_bar(static_cast<double>(i + 1) / n) / alpha_bar(static_cast<double>(i) / n), 0.999);
        break;
    }
  }
  return b;
}

}  // namespace

// Betas to float32 rounding (two roundings of the linspace, one of the square:
// 5e-7 relative); alphas_cumprod to 5e-5 relative against the float64
// product: diffusers keeps each 1 - beta in float32 (measured: up to 1.2e-6
// over 1000 scaled_linear steps, 1.3e-5 for the cosine schedule, whose last
// beta, 0.999, is 1.3e-5 off in float32); and to one float32 rounding (1e-7)
// against the product of the schedule's own betas' float32 factors.
BOOST_AUTO_TEST_CASE(betas_and_alphas_cumprod_match_the_formulas) {
  std::mt19937_64 g(11);
  std::uniform_real_distribution<double> start(1e-4, 2e-3), end(5e-3, 3e-2);
  for (const auto kind :
       {dd::BetaSchedule::linear, dd::BetaSchedule::scaled_linear, dd::BetaSchedule::squaredcos_cap_v2})
    for (const std::int64_t n : {1000, 50, 7}) {
      const dd::ScheduleConfig c{
          .num_train_timesteps = n, .beta_schedule = kind, .beta_start = start(g), .beta_end = end(g)};
      const dd::Schedule s = dd::make_schedule(c);
      const auto b = betas64(kind, c.beta_start, c.beta_end, n);
      BOOST_TEST_REQUIRE(s.betas.size() == b.size());
      BOOST_TEST_REQUIRE(s.alphas_cumprod.size() == b.size());
      double worst_beta = 0, worst_acp = 0, worst_rounded = 0, acp = 1, rounded = 1;
      for (std::size_t i = 0; i < b.size(); ++i) {
        acp *= 1 - b[i];
        rounded *= f32(1 - s.betas[i]);
        worst_beta = std::max(worst_beta, rel(s.betas[i], b[i]));
        worst_acp = std::max(worst_acp, rel(s.alphas_cumprod[i], acp));
        worst_rounded = std::max(worst_rounded, rel(s.alphas_cumprod[i], rounded));
      }
      std::printf("%s, %lld steps: betas %.1e, alphas_cumprod %.1e (float64), %.1e (float32 factors)\n",
                  dd::beta_schedule_name(kind), static_cast<long long>(n), worst_beta, worst_acp, worst_rounded);
      BOOST_TEST(worst_beta <= 5e-7);
      BOOST_TEST(worst_acp <= 5e-5);
      BOOST_TEST(worst_rounded <= 1e-7);
    }
  // The defaults are Stable Diffusion's.
  const dd::Schedule sd = dd::make_schedule({});
  BOOST_TEST(sd.betas.size() == 1000u);
  BOOST_TEST(rel(sd.betas.front(), 0.00085) <= 1e-7);
  BOOST_TEST(rel(sd.betas.back(), 0.012) <= 1e-7);
  BOOST_TEST(sd.config.objective == dd::Objective::eps);
}

// sigma_i = shift s / (1 + (shift - 1) s), s = (N - i) / N, and timesteps = sigma N, to float32 rounding.
BOOST_AUTO_TEST_CASE(flow_sigmas_are_the_shifted_table) {
  for (const double shift : {1.0, 3.0, 0.7})
    for (const std::int64_t n : {1000, 9}) {
      const dd::Schedule s =
          dd::make_schedule({.objective = dd::Objective::flow, .num_train_timesteps = n, .shift = shift});
      BOOST_TEST_REQUIRE(s.sigmas.size() == static_cast<std::size_t>(n));
      double worst = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double u = static_cast<double>(n - i) / n, sigma = shift * u / (1 + (shift - 1) * u);
        worst = std::max({worst, rel(s.sigmas[i], sigma), rel(s.timesteps[i], sigma * n)});
      }
      BOOST_TEST(worst <= 3e-7);
      BOOST_TEST(s.sigmas.front() == 1.0);
    }
}

// The noisy inputs and targets against the formulas, to float64 rounding
// (1e-14 relative to the values' scale, a few units of 2^-52), and the
// identities they keep: x0 = a noisy - b v for v, x0 = noisy - sigma target for flow.
BOOST_AUTO_TEST_CASE(noisy_inputs_and_targets_match_the_formulas) {
  std::mt19937_64 g(5);
  const std::size_t e = 40;
  for (const auto objective : {dd::Objective::eps, dd::Objective::v, dd::Objective::flow}) {
    const dd::Schedule s = dd::make_schedule({.objective = objective, .shift = 3.0});
    for (const std::int64_t index : {0, 1, 421, 999}) {
      const auto x0 = nonzero(g, e), noise = nonzero(g, e);
      std::vector<double> noisy(e), target(e);
      const dd::Timestep t = objective == dd::Objective::flow
                                 ? dd::flow_timestep(s, (static_cast<double>(index) + 0.5) / 1000.0)
                                 : dd::ddpm_timestep(s, {}, index);
      BOOST_TEST(t.index == index);
      dd::noise_and_target(s, t, x0, noise, noisy, target);
      double worst = 0, identity = 0;
      for (std::size_t i = 0; i < e; ++i) {
        double want_noisy, want_target, back;
        if (objective == dd::Objective::flow) {
          const double sigma = s.sigmas[index];
          want_noisy = (1 - sigma) * x0[i] + sigma * noise[i];
          want_target = noise[i] - x0[i];
          back = noisy[i] - sigma * target[i];
        } else {
          const double acp = s.alphas_cumprod[index];
          want_noisy = std::sqrt(acp) * x0[i] + std::sqrt(1 - acp) * noise[i];
          want_target =
              objective == dd::Objective::v ? std::sqrt(acp) * noise[i] - std::sqrt(1 - acp) * x0[i] : noise[i];
          back = objective == dd::Objective::v ? std::sqrt(acp) * noisy[i] - std::sqrt(1 - acp) * target[i] : x0[i];
        }
        worst = std::max({worst, std::abs(noisy[i] - want_noisy) / 4, std::abs(target[i] - want_target) / 4});
        identity = std::max(identity, std::abs(back - x0[i]) / 4);
      }
      BOOST_TEST(worst <= 1e-14);
      BOOST_TEST(identity <= 1e-14);
    }
  }
}

BOOST_AUTO_TEST_CASE(min_snr_weights_match_the_formulas) {
  for (const auto objective : {dd::Objective::eps, dd::Objective::v}) {
    const dd::Schedule s = dd::make_schedule({.objective = objective});
    for (const std::int64_t t : {0, 10, 300, 999}) {
      const double acp = s.alphas_cumprod[t], snr = acp / (1 - acp);
      BOOST_TEST(rel(dd::snr(s, t), snr) <= 1e-15);
      const double want = std::min(snr, 5.0) / (objective == dd::Objective::v ? snr + 1 : snr);
      BOOST_TEST(rel(dd::ddpm_timestep(s, {.snr_gamma = 5.0}, t).weight, want) <= 1e-15);
      BOOST_TEST(dd::ddpm_timestep(s, {}, t).weight == 1.0);  // off
    }
  }
  // Not for flow.
  const dd::Schedule flow = dd::make_schedule({.objective = dd::Objective::flow});
  const std::vector<float> x0(8, 1.f);
  const std::vector<std::int64_t> records{0, 1};
  BOOST_CHECK_THROW(dd::make_targets(flow, {.snr_gamma = 5.0}, x0, 4, records, 1, 0, 0), dtrain::config_error);
}

// make_targets is draw_timestep, draw_noise and noise_and_target, record by
// record, rounded to float once; the noise offset is one normal per record and channel.
BOOST_AUTO_TEST_CASE(make_targets_is_the_record_by_record_formula) {
  std::mt19937_64 g(3);
  const std::int64_t e = 24, channels = 4;
  const std::vector<std::int64_t> records{17, 3, 250000};
  std::vector<float> x0(records.size() * e);
  for (auto& x : x0) x = static_cast<float>(nonzero(g, 1)[0]);
  for (const auto objective : {dd::Objective::eps, dd::Objective::v, dd::Objective::flow}) {
    const dd::Schedule s = dd::make_schedule({.objective = objective, .shift = 3.0});
    const dd::Options o{.sampling = dd::TimestepSampling::logit_normal,
                        .snr_gamma = objective == dd::Objective::flow ? 0.0 : 5.0,
                        .noise_offset = 0.1,
                        .channels = channels};
    const dd::Targets out = dd::make_targets(s, o, x0, e, records, 42, 1, 7);
    for (std::size_t r = 0; r < records.size(); ++r) {
      const std::uint64_t stream = dd::record_stream(42, 1, 7, records[r]);
      const dd::Timestep t = dd::draw_timestep(s, o, stream);
      std::vector<double> clean(x0.begin() + r * e, x0.begin() + (r + 1) * e), noise(e), plain(e), noisy(e), target(e);
      dd::draw_noise(o, stream, noise);
      dd::draw_noise({}, stream, plain);
      for (std::int64_t i = 0; i < e; ++i) {
        const std::int64_t c = i / (e / channels);
        const double offset = 0.1 * dd::standard_normal(dd::part_stream(stream, dd::Part::offset), c);
        BOOST_TEST(std::abs(noise[i] - plain[i] - offset) <= 1e-15);
      }
      dd::noise_and_target(s, t, clean, noise, noisy, target);
      for (std::int64_t i = 0; i < e; ++i) {
        BOOST_TEST(out.noisy[r * e + i] == static_cast<float>(noisy[i]));
        BOOST_TEST(out.target[r * e + i] == static_cast<float>(target[i]));
      }
      BOOST_TEST(out.timesteps[r] == t.timestep);
      BOOST_TEST(out.weights[r] == t.weight);
    }
  }
}

// (b) The same (seed, rank, step, record) draws the same, whatever the other
// records of the micro-batch and their order (a resumed run, another split);
// a different seed, rank, step or record draws differently.
BOOST_AUTO_TEST_CASE(draws_are_a_function_of_seed_rank_step_record) {
  const dd::Schedule s = dd::make_schedule({});
  const std::int64_t e = 16;
  std::vector<float> x0(3 * e);
  for (std::size_t i = 0; i < x0.size(); ++i) x0[i] = 0.25f + 0.01f * static_cast<float>(i);
  const std::vector<std::int64_t> records{8, 9, 10}, reversed{10, 9, 8};
  const auto a = dd::make_targets(s, {}, x0, e, records, 5, 0, 100);
  const auto again = dd::make_targets(s, {}, x0, e, records, 5, 0, 100);
  BOOST_TEST(a.noisy == again.noisy);
  BOOST_TEST(a.target == again.target);
  BOOST_TEST(a.timesteps == again.timesteps);
  // Record 9 alone, with record 9's latents: its draws are the same.
  const std::vector<float> x9(x0.begin() + e, x0.begin() + 2 * e);
  const std::vector<std::int64_t> nine{9};
  const auto alone = dd::make_targets(s, {}, x9, e, nine, 5, 0, 100);
  BOOST_TEST(std::vector<float>(a.target.begin() + e, a.target.begin() + 2 * e) == alone.target);
  BOOST_TEST(a.timesteps[1] == alone.timesteps[0]);
  std::vector<float> x0r(x0.size());
  for (int r = 0; r < 3; ++r) std::copy_n(x0.begin() + (2 - r) * e, e, x0r.begin() + r * e);
  const auto back = dd::make_targets(s, {}, x0r, e, reversed, 5, 0, 100);
  BOOST_TEST(std::vector<float>(back.target.begin(), back.target.begin() + e) ==
             std::vector<float>(a.target.begin() + 2 * e, a.target.end()));
  // Any other key: other noise.
  const auto differs = [&](const dd::Targets& other) { return other.target != a.target; };
  BOOST_TEST(differs(dd::make_targets(s, {}, x0, e, records, 6, 0, 100)));   // seed
  BOOST_TEST(differs(dd::make_targets(s, {}, x0, e, records, 5, 1, 100)));   // rank
  BOOST_TEST(differs(dd::make_targets(s, {}, x0, e, records, 5, 0, 101)));   // step
  BOOST_TEST(differs(dd::make_targets(s, {}, x0, e, reversed, 5, 0, 100)));  // records
  // Record streams differ across every key, pairwise.
  std::set<std::uint64_t> streams;
  for (std::uint64_t seed : {0u, 1u})
    for (std::int64_t rank : {0, 1})
      for (std::int64_t step : {0, 1})
        for (std::int64_t record : {0, 1}) streams.insert(dd::record_stream(seed, rank, step, record));
  BOOST_TEST(streams.size() == 16u);
  // drop_text: a pure function, at the rate asked (binomial: 4 standard deviations).
  int dropped = 0;
  const int trials = 100000;
  for (int r = 0; r < trials; ++r) {
    const bool d = dd::drop_text(9, 3, r, 0.1);
    BOOST_TEST_REQUIRE(d == dd::drop_text(9, 3, r, 0.1));
    dropped += d;
  }
  BOOST_TEST(std::abs(dropped - 0.1 * trials) <= 4 * std::sqrt(trials * 0.1 * 0.9));
  int changed = 0;
  for (int r = 0; r < 1000; ++r) changed += dd::drop_text(9, 3, r, 0.5) != dd::drop_text(9, 4, r, 0.5);
  BOOST_TEST(changed > 400);
  BOOST_TEST(!dd::drop_text(9, 3, 0, 0.0));
  BOOST_TEST(dd::drop_text(9, 3, 0, 1.0));
}

// The samplers' moments over many records: a sample mean within 4 standard
// errors (sd / sqrt(n)), a sample standard deviation within 4 of its own
// (about sd / sqrt(2 n)).
BOOST_AUTO_TEST_CASE(sampler_moments) {
  const int n = 200000;
  const auto moments = [&](const auto& draw) {
    double sum = 0, squares = 0;
    for (int i = 0; i < n; ++i) {
      const double x = draw(i);
      sum += x;
      squares += x * x;
    }
    const double mean = sum / n;
    return std::pair{mean, std::sqrt(squares / n - mean * mean)};
  };
  const auto near = [&](std::pair<double, double> got, double mean, double sd) {
    std::printf("mean %.4f (want %.4f), sd %.4f (want %.4f)\n", got.first, mean, got.second, sd);
    BOOST_TEST(std::abs(got.first - mean) <= 4 * sd / std::sqrt(n));
    BOOST_TEST(std::abs(got.second - sd) <= 4 * sd / std::sqrt(2.0 * n));
  };
  // The noise: standard normal, over the elements of records.
  near(moments([](int i) {
         std::vector<double> noise(8);
         dd::draw_noise({}, dd::record_stream(1, 0, 2, i / 8), noise);
         return noise[i % 8];
       }),
       0.0, 1.0);
  // Logit-normal flow timesteps: logit(u) ~ N(mean, std); the index is floor(u N).
  const dd::Schedule flow = dd::make_schedule({.objective = dd::Objective::flow});
  const dd::Options o{.sampling = dd::TimestepSampling::logit_normal, .logit_mean = 0.3, .logit_std = 1.2};
  near(moments([&](int i) {
         const std::uint64_t record = dd::record_stream(4, 0, 9, i);
         const std::uint64_t stream = dd::part_stream(record, dd::Part::timestep);
         const double u = dd::flow_density(o, dd::uniform53(stream, 0), dd::standard_normal(stream, 2));
         const dd::Timestep t = dd::draw_timestep(flow, o, record);
         BOOST_TEST_REQUIRE(t.index == static_cast<std::int64_t>(u * 1000));
         return std::log(u / (1 - u));
       }),
       0.3, 1.2);
  // Uniform flow u and uniform DDPM timesteps: [0, N), mean (N - 1) / 2, sd sqrt((N^2 - 1) / 12).
  const dd::Schedule ddpm = dd::make_schedule({});
  near(moments([&](int i) {
         const dd::Timestep t = dd::draw_timestep(ddpm, {}, dd::record_stream(4, 0, 9, i));
         BOOST_TEST_REQUIRE((t.index >= 0 && t.index < 1000));
         return static_cast<double>(t.index);
       }),
       499.5, std::sqrt((1000.0 * 1000.0 - 1) / 12));
  near(moments([&](int i) { return dd::uniform53(dd::record_stream(8, 0, 0, i), 0); }), 0.5, std::sqrt(1.0 / 12));
  // Mode: u stays in [0, 1] for mode_scale 1.29, and its index is in range.
  const dd::Options mode{.sampling = dd::TimestepSampling::mode};
  for (int i = 0; i < 1000; ++i) {
    const double v = i / 1000.0, u = dd::flow_density(mode, v, 0.0);
    BOOST_TEST_REQUIRE((u >= 0.0 && u <= 1.0));
    BOOST_TEST(rel(u, 1 - v - 1.29 * (std::pow(std::cos(std::numbers::pi * v / 2), 2) - 1 + v)) <= 1e-15);
  }
  BOOST_TEST(dd::flow_timestep(flow, 1.0).index == 999);
  BOOST_TEST(dd::flow_timestep(flow, -0.1).index == 0);
}

BOOST_AUTO_TEST_CASE(names_and_configs) {
  BOOST_TEST(dd::objective_name(dd::parse_objective("v")) == std::string("v"));
  BOOST_TEST(dd::parse_objective("flow") == dd::Objective::flow);
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const dtrain::config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  BOOST_TEST(message([] { dd::parse_objective("epsilon"); }).find("eps, v, flow") != std::string::npos);
  BOOST_TEST(message([] { dd::parse_timestep_sampling("cosmap"); }).find("uniform, logit_normal, mode") !=
             std::string::npos);
  BOOST_CHECK_THROW(dd::make_schedule({.num_train_timesteps = 0}), dtrain::config_error);
  BOOST_CHECK_THROW(dd::make_schedule({.beta_end = 1.5}), dtrain::config_error);
  BOOST_CHECK_THROW(dd::make_schedule({.objective = dd::Objective::flow, .shift = 0.0}), dtrain::config_error);
  const std::vector<float> x0(8, 1.f);
  const std::vector<std::int64_t> one{0};
  BOOST_CHECK_THROW(dd::make_targets(dd::make_schedule({}), {.noise_offset = 0.1, .channels = 3}, x0, 8, one, 1, 0, 0),
                    dtrain::config_error);
  BOOST_CHECK_THROW(dd::make_targets(dd::make_schedule({}), {}, x0, 3, one, 1, 0, 0), dtrain::config_error);

  // scheduler_config.json: what the file says, absent keys at DDPMScheduler's defaults.
  const fs::path dir = fs::path(DTRAIN_TEST_BINARY_DIR) / "diffusion_configs";
  fs::create_directories(dir);
  const auto config = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return dir / name;
  };
  const dd::ScheduleConfig sd = dd::read_scheduler_config(config(
      "sd.json",
      R"({"_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
          "num_train_timesteps": 1000, "set_alpha_to_one": false, "skip_prk_steps": true, "steps_offset": 1,
          "trained_betas": null, "clip_sample": false})"));
  BOOST_TEST(sd.objective == dd::Objective::eps);
  BOOST_TEST(sd.beta_schedule == dd::BetaSchedule::scaled_linear);
  BOOST_TEST(sd.beta_start == 0.00085);
  const dd::ScheduleConfig plain = dd::read_scheduler_config(config("plain.json", "{}"));
  BOOST_TEST(plain.beta_schedule == dd::BetaSchedule::linear);
  BOOST_TEST(plain.beta_end == 0.02);
  const dd::ScheduleConfig flux = dd::read_scheduler_config(
      config("flux.json",
             R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0, "use_dynamic_shifting": true})"));
  BOOST_TEST(flux.objective == dd::Objective::flow);
  BOOST_TEST(flux.shift == 1.0);
  BOOST_TEST(message([&] {
               dd::read_scheduler_config(config("tb.json", R"({"trained_betas": [0.1, 0.2]})"));
             }).find("trained_betas") != std::string::npos);
  BOOST_TEST(message([&] {
               dd::read_scheduler_config(config("sig.json", R"({"beta_schedule": "sigmoid"})"));
             }).find("linear, scaled_linear, squaredcos_cap_v2") != std::string::npos);
  BOOST_TEST(message([&] {
               dd::read_scheduler_config(config("x0.json", R"({"prediction_type": "sample"})"));
             }).find("sample") != std::string::npos);
  BOOST_TEST(message([&] {
               dd::read_scheduler_config(config("bad.json", R"({"beta_start": "a"})"));
             }).find("beta_start") != std::string::npos);
  BOOST_CHECK_THROW(dd::read_scheduler_config(dir / "missing.json"), dtrain::config_error);
}
