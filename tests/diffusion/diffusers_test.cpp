// diffusion/schedule.hpp against diffusers 0.42.1 itself (the pinned torch2
// set, scripts/python/torch2.txt; CTest names its python in
// DTRAIN_PYTHON_TORCH2): diffusers_schedule.py writes DDPMScheduler's betas
// and alphas_cumprod, add_noise, get_velocity, compute_snr and the
// Min-SNR-gamma weights, FlowMatchEulerDiscreteScheduler's sigmas,
// timesteps and scale_noise, and the SD3 / Flux scripts' timestep draws, and
// dtrain's values must agree to 1e-6 relative (1e-6 absolute below 1).
// Skipped (77) where the torch2 set cannot be installed.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/pinned_main.hpp"
#include "support/python_venv.hpp"
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include <dtrain/diffusion/schedule.hpp>

namespace fs = std::filesystem;
namespace dd = dtrain::diffusion;
using nlohmann::json;

BOOST_TEST_DONT_PRINT_LOG_VALUE(dtrain::diffusion::Objective)
BOOST_TEST_DONT_PRINT_LOG_VALUE(dtrain::diffusion::BetaSchedule)

namespace {

constexpr double tolerance = 1e-6;

// Relative difference, absolute for values below 1 in magnitude.
double diff(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1.0); }
double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

const fs::path& out_dir() {
  static const fs::path dir = [] {
    const fs::path d = fs::path(DTRAIN_TEST_BINARY_DIR) / "diffusers_expected";
    fs::remove_all(d);
    const std::string cmd = dtrain::testing::pinned_python("torch2") + " " + DTRAIN_SOURCE_DIR +
                            "/tests/diffusion/diffusers_schedule.py " + d.string();
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("diffusers_schedule.py failed: " + cmd);
    return d;
  }();
  return dir;
}

const json& expected() {
  static const json j = [] {
    std::ifstream in(out_dir() / "expected.json");
    return json::parse(in);
  }();
  return j;
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }

// The worst difference over two tables (relative, or absolute below 1 when `absolute_below_one`).
double worst(const std::vector<double>& got, const std::vector<double>& want, bool absolute_below_one = false) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  double w = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    w = std::max(w, absolute_below_one ? diff(got[i], want[i]) : rel(got[i], want[i]));
  return w;
}

}  // namespace

BOOST_AUTO_TEST_CASE(ddpm_schedules_noising_and_weights) {
  for (const auto& c : expected().at("ddpm")) {
    const dd::ScheduleConfig config{.num_train_timesteps = c.at("num_train_timesteps").get<std::int64_t>(),
                                    .beta_schedule = dd::parse_beta_schedule(c.at("beta_schedule").get<std::string>()),
                                    .beta_start = c.at("beta_start").get<double>(),
                                    .beta_end = c.at("beta_end").get<double>()};
    dd::Schedule s = dd::make_schedule(config);
    const double betas = worst(s.betas, doubles(c.at("betas")));
    const double acp = worst(s.alphas_cumprod, doubles(c.at("alphas_cumprod")));
    // add_noise, get_velocity (float64 in diffusers), compute_snr and the weights (float32 there).
    const auto x0 = doubles(c.at("x0")), noise = doubles(c.at("noise"));
    const auto ts = c.at("t").get<std::vector<std::int64_t>>();
    const std::size_t e = x0.size() / ts.size();
    std::vector<double> noisy(x0.size()), velocity(x0.size()), snr, eps_w, v_w;
    for (const auto objective : {dd::Objective::eps, dd::Objective::v}) {
      s.config.objective = objective;
      for (std::size_t r = 0; r < ts.size(); ++r) {
        const dd::Timestep t = dd::ddpm_timestep(s, {.snr_gamma = 5.0}, ts[r]);
        std::vector<double> n(e), target(e);
        dd::noise_and_target(s, t, std::span(x0).subspan(r * e, e), std::span(noise).subspan(r * e, e), n, target);
        std::copy(n.begin(), n.end(), noisy.begin() + static_cast<std::ptrdiff_t>(r * e));
        if (objective == dd::Objective::v) {
          std::copy(target.begin(), target.end(), velocity.begin() + static_cast<std::ptrdiff_t>(r * e));
          v_w.push_back(t.weight);
        } else {
          eps_w.push_back(t.weight);
          snr.push_back(dd::snr(s, ts[r]));
        }
      }
    }
    const double add_noise = worst(noisy, doubles(c.at("noisy")), true);
    const double get_velocity = worst(velocity, doubles(c.at("velocity")), true);
    const double snrs = worst(snr, doubles(c.at("snr")));
    const double weights = std::max(worst(eps_w, doubles(c.at("min_snr_eps"))), worst(v_w, doubles(c.at("min_snr_v"))));
    std::printf(
        "%s %g..%g, %lld steps: betas %.1e, alphas_cumprod %.1e, add_noise %.1e, get_velocity %.1e, snr %.1e, "
        "min-snr weights %.1e\n",
        dd::beta_schedule_name(config.beta_schedule), config.beta_start, config.beta_end,
        static_cast<long long>(config.num_train_timesteps), betas, acp, add_noise, get_velocity, snrs, weights);
    BOOST_TEST(betas <= tolerance);
    BOOST_TEST(acp <= tolerance);
    BOOST_TEST(add_noise <= tolerance);
    BOOST_TEST(get_velocity <= tolerance);
    BOOST_TEST(snrs <= tolerance);
    BOOST_TEST(weights <= tolerance);
  }
}

BOOST_AUTO_TEST_CASE(flow_tables_draws_and_noising) {
  for (const auto& c : expected().at("flow")) {
    const double shift = c.at("shift").get<double>();
    const dd::Schedule s = dd::make_schedule(
        {.objective = dd::Objective::flow, .num_train_timesteps = c.at("num_train_timesteps"), .shift = shift});
    const double sigmas = worst(s.sigmas, doubles(c.at("sigmas")));
    const double timesteps = worst(s.timesteps, doubles(c.at("timesteps")));
    // The training scripts' draws: dtrain's density of diffusers' raw draw,
    // the index floor(u N), its timestep and sigma.
    double density = 0, looked_up = 0;
    int index_mismatches = 0;
    for (const auto& [scheme, d] : c.at("draws").items()) {
      dd::Options o{.sampling = dd::parse_timestep_sampling(scheme)};
      if (d.contains("logit_mean")) o.logit_mean = d.at("logit_mean"), o.logit_std = d.at("logit_std");
      if (d.contains("mode_scale")) o.mode_scale = d.at("mode_scale");
      const auto raw = doubles(d.at("raw")), u = doubles(d.at("u"));
      const auto indices = d.at("indices").get<std::vector<std::int64_t>>();
      const auto ts = doubles(d.at("timesteps")), sg = doubles(d.at("sigmas"));
      for (std::size_t i = 0; i < raw.size(); ++i) {
        const bool normal = o.sampling == dd::TimestepSampling::logit_normal;
        const double mine =
            dd::flow_density(o, normal ? 0.0 : raw[i], normal ? (raw[i] - o.logit_mean) / o.logit_std : 0.0);
        density = std::max(density, diff(mine, u[i]));
        const dd::Timestep t = dd::flow_timestep(s, u[i]);
        index_mismatches += t.index != indices[i];
        looked_up = std::max({looked_up, rel(t.timestep, ts[i]), rel(t.sigma, sg[i])});
      }
    }
    // scale_noise, the flow forward process.
    const auto x0 = doubles(c.at("x0")), noise = doubles(c.at("noise"));
    const auto index = c.at("index").get<std::vector<std::int64_t>>();
    const std::size_t e = x0.size() / index.size();
    std::vector<double> noisy(x0.size());
    for (std::size_t r = 0; r < index.size(); ++r) {
      const std::size_t k = static_cast<std::size_t>(index[r]);
      const dd::Timestep t{.index = index[r], .timestep = s.timesteps[k], .sigma = s.sigmas[k]};
      std::vector<double> target(e);
      dd::noise_and_target(s, t, std::span(x0).subspan(r * e, e), std::span(noise).subspan(r * e, e),
                           std::span(noisy).subspan(r * e, e), target);
    }
    const double scale_noise = worst(noisy, doubles(c.at("noisy")), true);
    std::printf(
        "flow shift %g: sigmas %.1e, timesteps %.1e, density %.1e, drawn timestep/sigma %.1e (%d index mismatches), "
        "scale_noise %.1e\n",
        shift, sigmas, timesteps, density, looked_up, index_mismatches, scale_noise);
    BOOST_TEST(sigmas <= tolerance);
    BOOST_TEST(timesteps <= tolerance);
    BOOST_TEST(density <= tolerance);
    BOOST_TEST(index_mismatches == 0);
    BOOST_TEST(looked_up <= tolerance);
    BOOST_TEST(scale_noise <= tolerance);
  }
}

// scheduler_config.json files diffusers saved.
BOOST_AUTO_TEST_CASE(reads_diffusers_scheduler_configs) {
  const dd::ScheduleConfig v = dd::read_scheduler_config(out_dir() / "ddpm_v");
  BOOST_TEST(v.objective == dd::Objective::v);
  BOOST_TEST(v.beta_schedule == dd::BetaSchedule::scaled_linear);
  BOOST_TEST(v.beta_start == 0.00085);
  BOOST_TEST(v.beta_end == 0.012);
  BOOST_TEST(v.num_train_timesteps == 1000);
  const dd::ScheduleConfig flow = dd::read_scheduler_config(out_dir() / "flow_sd3" / "scheduler_config.json");
  BOOST_TEST(flow.objective == dd::Objective::flow);
  BOOST_TEST(flow.shift == 3.0);
}

// Skipped with the fixture that makes the pinned set's venv when it cannot be installed here.
int main(int argc, char* argv[]) { return dtrain::testing::main_needing_set("torch2", argc, argv); }
