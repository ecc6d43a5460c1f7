#pragma once
// The training objectives of diffusion fine-tuning, as diffusers' training
// scripts (train_text_to_image.py, train_dreambooth_sd3.py / _flux.py) and
// OneTrainer compute them: given a micro-batch of clean latents x0, draw a
// timestep and Gaussian noise per record and return the model's noisy input,
// its regression target and a per-record loss weight. Host code, double
// precision; the model, its loss and the GPU are elsewhere.
//
// Objectives (the model predicts the target; the loss is the mean squared
// error, times the record's weight):
//   eps   DDPM, epsilon prediction: noisy = sqrt(acp_t) x0 + sqrt(1 - acp_t) noise,
//         target = noise (diffusers' DDPMScheduler.add_noise)
//   v     DDPM, v-prediction: the same noisy input,
//         target = sqrt(acp_t) noise - sqrt(1 - acp_t) x0 (get_velocity)
//   flow  rectified flow (SD3, Flux): noisy = (1 - sigma) x0 + sigma noise,
//         target = noise - x0, the model's timestep = sigma * num_train_timesteps
// acp_t is alphas_cumprod[t], the product of (1 - beta) up to the integer
// timestep t, drawn uniformly from [0, num_train_timesteps).
//
// Schedules match diffusers 0.42 exactly: betas "linear" (linspace(start,
// end)), "scaled_linear" (linspace(sqrt(start), sqrt(end))^2, Stable
// Diffusion's, the default here with 0.00085 to 0.012 over 1000 steps) and
// "squaredcos_cap_v2" (the cosine schedule, each beta capped at 0.999). The
// tables hold the float32 values diffusers' scheduler holds: computed in
// double, rounded to float where diffusers' tensors are float32 (betas, 1 -
// beta, each product of the cumulative product, accumulated in double as
// PyTorch's CPU cumprod does). Without that rounding the cosine schedule's
// last alphas_cumprod would differ from diffusers' by 1e-5 relative.
// For flow, diffusers' FlowMatchEulerDiscreteScheduler table: sigmas[i] =
// shift s / (1 + (shift - 1) s) with s = (N - i) / N, i in [0, N); a draw u
// in [0, 1) picks i = floor(u N), as the SD3 and Flux scripts do.
//
// Timestep sampling for flow (diffusers' compute_density_for_timestep_sampling):
// "uniform" (u uniform), "logit_normal" (u = sigmoid(mean + std z), z standard
// normal) and "mode" (u = 1 - v - mode_scale (cos^2(pi v / 2) - 1 + v), v
// uniform). DDPM timesteps are always uniform integers.
//
// Options: Min-SNR-gamma weights (Hang et al. 2023, as the diffusers scripts
// apply them: snr = acp / (1 - acp), weight min(snr, gamma) / snr for eps,
// min(snr, gamma) / (snr + 1) for v; not for flow), and a noise offset
// (noise += offset * one normal draw per record and channel, the channels
// being equal contiguous blocks of a record's elements, as in NCHW latents).
//
// Every draw is a pure function of (seed, rank, step, record index) through
// core/random.hpp's counter-based streams, so a resumed run, a recomputed
// step or a different micro-batch split draws the same numbers; pass rank 0
// when the record indices are global, so the draws do not depend on the
// world size either. Uniforms take the 53 high bits of a splitmix64 draw
// (uniform53, [0, 1)); normals come from Box-Muller on two uniforms (elements
// 2k and 2k + 1 share the pair k: r cos and r sin). drop_text decides the
// classifier-free-guidance drop of a record's caption (seed, step, record).
//
// read_scheduler_config reads a diffusers scheduler_config.json.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/random.hpp"

namespace dtrain::diffusion {

// What the model predicts.
enum class Objective { eps, v, flow };
inline constexpr const char* objective_names = "eps, v, flow";
// "eps", "v" or "flow"; anything else is a config_error listing those.
DTRAIN_DECL Objective parse_objective(std::string_view name);
DTRAIN_DECL const char* objective_name(Objective o);

// DDPM beta schedules (diffusers' beta_schedule names).
enum class BetaSchedule { linear, scaled_linear, squaredcos_cap_v2 };
inline constexpr const char* beta_schedule_names = "linear, scaled_linear, squaredcos_cap_v2";
DTRAIN_DECL BetaSchedule parse_beta_schedule(std::string_view name);
DTRAIN_DECL const char* beta_schedule_name(BetaSchedule s);

// How flow timesteps are drawn (diffusers' weighting_scheme names).
enum class TimestepSampling { uniform, logit_normal, mode };
inline constexpr const char* timestep_sampling_names = "uniform, logit_normal, mode";
DTRAIN_DECL TimestepSampling parse_timestep_sampling(std::string_view name);

// The schedule's settings; the defaults are Stable Diffusion's (eps,
// scaled_linear, 0.00085 to 0.012, 1000 steps).
struct ScheduleConfig {
  Objective objective = Objective::eps;
  std::int64_t num_train_timesteps = 1000;
  BetaSchedule beta_schedule = BetaSchedule::scaled_linear;  // eps, v
  double beta_start = 0.00085, beta_end = 0.012;             // eps, v (not squaredcos_cap_v2)
  double shift = 1.0;                                        // flow: SD3 uses 3.0
};

// The tables of a config (make_schedule).
struct Schedule {
  ScheduleConfig config;
  std::vector<double> betas;           // eps, v: [num_train_timesteps]
  std::vector<double> alphas_cumprod;  // eps, v: [num_train_timesteps]
  std::vector<double> sigmas;          // flow: [num_train_timesteps], sigmas[0] = 1 (largest)
  std::vector<double> timesteps;       // flow: sigmas * num_train_timesteps (float32, as diffusers')
};

// Checks `c` (a config_error names what is wrong) and builds its tables.
DTRAIN_DECL Schedule make_schedule(const ScheduleConfig& c);

// A diffusers scheduler_config.json (or the folder holding it). A
// FlowMatchEulerDiscreteScheduler config gives flow (num_train_timesteps,
// shift; with use_dynamic_shifting the training table is unshifted, as
// diffusers builds it); any other class gives DDPM's keys, absent ones at
// DDPMScheduler's defaults (linear, 0.0001 to 0.02, epsilon), prediction_type
// "epsilon" -> eps, "v_prediction" -> v. Refused with a config_error:
// trained_betas, an unknown beta_schedule (naming the supported ones),
// prediction_type "sample", rescale_betas_zero_snr. Keys that only shape
// sampling (steps_offset, clip_sample, timestep_spacing, ...) are ignored.
DTRAIN_DECL ScheduleConfig read_scheduler_config(const std::filesystem::path& dir_or_file);

// The drawing options of make_targets.
struct Options {
  TimestepSampling sampling = TimestepSampling::uniform;  // flow only
  double logit_mean = 0.0, logit_std = 1.0;               // logit_normal
  double mode_scale = 1.29;                               // mode
  double snr_gamma = 0.0;                                 // > 0: Min-SNR-gamma weights (eps, v)
  double noise_offset = 0.0;                              // 0: off
  std::int64_t channels = 1;                              // the noise offset's channels per record
};

// --- Draws ----------------------------------------------------------------

// The stream of one record's draws.
inline std::uint64_t record_stream(std::uint64_t seed, std::int64_t rank, std::int64_t step, std::int64_t record) {
  using dtrain::detail::derive_stream;
  constexpr std::uint64_t diffusion_key = 0x646966667573696full;  // "diffusio"
  std::uint64_t s = derive_stream(derive_stream(seed, diffusion_key), static_cast<std::uint64_t>(rank));
  return derive_stream(derive_stream(s, static_cast<std::uint64_t>(step)), static_cast<std::uint64_t>(record));
}

// The parts of a record's stream.
enum class Part : std::uint64_t { timestep = 1, noise = 2, offset = 3 };
inline std::uint64_t part_stream(std::uint64_t record, Part p) {
  return dtrain::detail::derive_stream(record, static_cast<std::uint64_t>(p));
}

// Uniform in [0, 1) with 53 random bits (every value exact in double).
inline double uniform53(std::uint64_t stream, std::uint64_t index) {
  return static_cast<double>(dtrain::detail::derive_stream(stream, index) >> 11) * 0x1.0p-53;
}

// A standard normal: Box-Muller on the uniforms 2k and 2k + 1 (k = index / 2),
// r cos(2 pi u2) for an even index, r sin(2 pi u2) for an odd one.
DTRAIN_DECL double standard_normal(std::uint64_t stream, std::uint64_t index);

// Whether the caption of `record` is dropped at `step` (classifier-free
// guidance training): a uniform draw below `probability`.
DTRAIN_DECL bool drop_text(std::uint64_t seed, std::int64_t step, std::int64_t record, double probability);

// One record's timestep.
struct Timestep {
  std::int64_t index = 0;  // eps, v: the timestep t; flow: the index into sigmas
  double timestep = 0.0;   // what the model is given: t, or sigma * num_train_timesteps
  double sigma = 0.0;      // flow: the noise level
  double weight = 1.0;     // the loss weight
};

// u in [0, 1) of a flow sampling scheme, from a uniform u and a standard normal z.
DTRAIN_DECL double flow_density(const Options& o, double uniform, double normal);
// The timestep of a DDPM t or of a flow u (index floor(u N), at most N - 1),
// with its loss weight.
DTRAIN_DECL Timestep ddpm_timestep(const Schedule& s, const Options& o, std::int64_t t);
DTRAIN_DECL Timestep flow_timestep(const Schedule& s, double u);
// The signal-to-noise ratio alphas_cumprod[t] / (1 - alphas_cumprod[t]).
DTRAIN_DECL double snr(const Schedule& s, std::int64_t t);
// A record's timestep from its stream (record_stream).
DTRAIN_DECL Timestep draw_timestep(const Schedule& s, const Options& o, std::uint64_t record);
// A record's noise into `out` (its elements, `o.channels` equal blocks),
// the noise offset included (a config_error when the channels do not divide
// the elements).
DTRAIN_DECL void draw_noise(const Options& o, std::uint64_t record, std::span<double> out);

// --- Targets --------------------------------------------------------------

// The noisy input and the target of one record at timestep `t`.
DTRAIN_DECL void noise_and_target(const Schedule& s, const Timestep& t, std::span<const double> x0,
                                  std::span<const double> noise, std::span<double> noisy, std::span<double> target);

// A micro-batch's model inputs and targets.
struct Targets {
  std::vector<float> noisy;       // [n, elements]
  std::vector<float> target;      // [n, elements]
  std::vector<double> timesteps;  // [n]: Timestep::timestep
  std::vector<double> weights;    // [n]: Timestep::weight
};

// x0 holds records.size() records of `elements` values each; records[i] is
// the index of the i-th (in the dataset, or in the rank's shard: see above).
DTRAIN_DECL Targets make_targets(const Schedule& s, const Options& o, std::span<const float> x0, std::int64_t elements,
                                 std::span<const std::int64_t> records, std::uint64_t seed, std::int64_t rank,
                                 std::int64_t step);

}  // namespace dtrain::diffusion

#if DTRAIN_DEFINE_IMPL
#include "dtrain/diffusion/schedule.ipp"
#endif
