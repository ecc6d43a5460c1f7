// The definitions schedule.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>

#include "dtrain/diffusion/schedule.hpp"
#include "dtrain/io/json.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::diffusion {
  namespace detail {

  // A value rounded to float32, as diffusers' tables hold it.
  inline double f32(double x) { return static_cast<double>(static_cast<float>(x)); }

  // torch.linspace(start, end, n, dtype=float32): the ends rounded to float,
  // the points computed in double and rounded once.
  inline std::vector<double> linspace_f32(double start, double end, std::int64_t n) {
    const double a = f32(start), b = f32(end);
    std::vector<double> out(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      out[static_cast<std::size_t>(i)] =
          n == 1 ? a : f32(a + (b - a) * static_cast<double>(i) / static_cast<double>(n - 1));
    return out;
  }

  // Glide's cosine alpha_bar (diffusers' betas_for_alpha_bar, "cosine").
  inline double cosine_alpha_bar(double t) {
    const double c = std::cos((t + 0.008) / 1.008 * std::numbers::pi / 2.0);
    return c * c;
  }

  inline bool finite_in_open_unit(double x) { return std::isfinite(x) && x > 0.0 && x < 1.0; }

  template <class V>
  V get(const nlohmann::ordered_json& j, const std::string& where, const char* key, V fallback) {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    const auto& v = j.at(key);
    std::optional<V> out;
    if constexpr (std::is_same_v<V, std::string>) {
      if (v.is_string()) out = v.get<std::string>();
    } else if constexpr (std::is_same_v<V, bool>) {
      if (v.is_boolean()) out = v.get<bool>();
    } else {
      out = dtrain::detail::json_number<V>(v);
    }
    if (!out)
      throw config_error(where + ": \"" + key + "\" is " + v.dump() + ", not a value of the right type",
                         "write a diffusers scheduler_config.json (a scheduler's save_pretrained writes one)");
    return *out;
  }

  }  // namespace detail

  DTRAIN_DECL Objective parse_objective(std::string_view name) {
    if (name == "eps") return Objective::eps;
    if (name == "v") return Objective::v;
    if (name == "flow") return Objective::flow;
    throw config_error(
        "diffusion objective \"" + std::string(name) + "\" is not known (valid: " + objective_names + ")",
        "give eps (epsilon prediction), v (v-prediction) or flow (rectified flow)");
  }

  DTRAIN_DECL const char* objective_name(Objective o) {
    switch (o) {
      case Objective::eps: return "eps";
      case Objective::v: return "v";
      case Objective::flow: return "flow";
    }
    return "?";
  }

  DTRAIN_DECL BetaSchedule parse_beta_schedule(std::string_view name) {
    if (name == "linear") return BetaSchedule::linear;
    if (name == "scaled_linear") return BetaSchedule::scaled_linear;
    if (name == "squaredcos_cap_v2") return BetaSchedule::squaredcos_cap_v2;
    throw config_error(
        "beta_schedule \"" + std::string(name) + "\" is not supported (supported: " + beta_schedule_names + ")",
        "give one of those (diffusers' names)");
  }

  DTRAIN_DECL const char* beta_schedule_name(BetaSchedule s) {
    switch (s) {
      case BetaSchedule::linear: return "linear";
      case BetaSchedule::scaled_linear: return "scaled_linear";
      case BetaSchedule::squaredcos_cap_v2: return "squaredcos_cap_v2";
    }
    return "?";
  }

  DTRAIN_DECL TimestepSampling parse_timestep_sampling(std::string_view name) {
    if (name == "uniform") return TimestepSampling::uniform;
    if (name == "logit_normal") return TimestepSampling::logit_normal;
    if (name == "mode") return TimestepSampling::mode;
    throw config_error(
        "timestep sampling \"" + std::string(name) + "\" is not known (valid: " + timestep_sampling_names + ")",
        "give one of those (diffusers' weighting_scheme names)");
  }

  DTRAIN_DECL Schedule make_schedule(const ScheduleConfig& c) {
    const std::int64_t n = c.num_train_timesteps;
    if (n < 1 || n > (std::int64_t{1} << 24))
      throw config_error("num_train_timesteps is " + std::to_string(n) + ", not in [1, 2^24]",
                         "give the number of training timesteps (1000 for Stable Diffusion, SD3 and Flux)");
    Schedule s;
    s.config = c;
    const auto size = static_cast<std::size_t>(n);
    if (c.objective == Objective::flow) {
      if (!std::isfinite(c.shift) || c.shift <= 0.0)
        throw config_error("flow shift is " + std::to_string(c.shift) + ", not a positive number",
                           "give diffusers' shift (1.0: none; SD3 uses 3.0)");
      s.sigmas.resize(size);
      s.timesteps.resize(size);
      const double nd = static_cast<double>(n);
      for (std::int64_t i = 0; i < n; ++i) {
        // diffusers: timesteps linspace(1, N, N) reversed, sigmas = timesteps / N, shifted.
        const double unshifted = detail::f32(static_cast<double>(n - i) / nd);
        const double sigma = detail::f32(c.shift * unshifted / (1.0 + (c.shift - 1.0) * unshifted));
        s.sigmas[static_cast<std::size_t>(i)] = sigma;
        s.timesteps[static_cast<std::size_t>(i)] = detail::f32(sigma * nd);
      }
      return s;
    }
    if (c.beta_schedule != BetaSchedule::squaredcos_cap_v2 &&
        !(detail::finite_in_open_unit(c.beta_start) && detail::finite_in_open_unit(c.beta_end)))
      throw config_error("beta_start " + std::to_string(c.beta_start) + " and beta_end " + std::to_string(c.beta_end) +
                             " are not both in (0, 1)",
                         "give diffusers' beta_start and beta_end (Stable Diffusion: 0.00085 and 0.012)");
    switch (c.beta_schedule) {
      case BetaSchedule::linear: s.betas = detail::linspace_f32(c.beta_start, c.beta_end, n); break;
      case BetaSchedule::scaled_linear:
        s.betas = detail::linspace_f32(std::sqrt(c.beta_start), std::sqrt(c.beta_end), n);
        for (auto& b : s.betas) b = detail::f32(b * b);
        break;
      case BetaSchedule::squaredcos_cap_v2:
        s.betas.resize(size);
        for (std::int64_t i = 0; i < n; ++i) {
          const double t1 = static_cast<double>(i) / static_cast<double>(n);
          const double t2 = static_cast<double>(i + 1) / static_cast<double>(n);
          s.betas[static_cast<std::size_t>(i)] =
              detail::f32(std::min(1.0 - detail::cosine_alpha_bar(t2) / detail::cosine_alpha_bar(t1), 0.999));
        }
        break;
    }
    s.alphas_cumprod.resize(size);
    double product = 1.0;  // PyTorch's CPU cumprod accumulates float32 in double
    for (std::size_t i = 0; i < size; ++i) {
      product *= detail::f32(1.0 - s.betas[i]);
      s.alphas_cumprod[i] = detail::f32(product);
    }
    return s;
  }

  DTRAIN_DECL ScheduleConfig read_scheduler_config(const std::filesystem::path& dir_or_file) {
    namespace fs = std::filesystem;
    const fs::path file = fs::is_directory(dir_or_file) ? dir_or_file / "scheduler_config.json" : dir_or_file;
    const std::string where = "\"" + file.string() + "\"";
    const std::string fix = "give a diffusers scheduler folder (a scheduler's save_pretrained writes one)";
    std::ifstream in(file);
    if (!in) throw config_error(where + " cannot be read", fix);
    const auto j = dtrain::detail::parse_json(
        in, [&](const std::string& problem) { return config_error(where + " is " + problem, fix); });
    if (!j.is_object()) throw config_error(where + " is not a JSON object", fix);
    ScheduleConfig c;
    const std::string cls = detail::get<std::string>(j, where, "_class_name", "");
    c.num_train_timesteps = detail::get<std::int64_t>(j, where, "num_train_timesteps", 1000);
    if (cls.rfind("FlowMatch", 0) == 0) {
      c.objective = Objective::flow;
      c.shift = detail::get<double>(j, where, "shift", 1.0);
      // With dynamic shifting diffusers shifts at inference only: its training table is unshifted.
      if (detail::get<bool>(j, where, "use_dynamic_shifting", false)) c.shift = 1.0;
      make_schedule(c);  // checks it
      return c;
    }
    if (j.contains("trained_betas") && !j.at("trained_betas").is_null())
      throw config_error(where + ": trained_betas is set; dtrain builds the betas from beta_schedule only (" +
                             beta_schedule_names + ")",
                         "set trained_betas to null and give the beta_schedule they came from");
    if (detail::get<bool>(j, where, "rescale_betas_zero_snr", false))
      throw config_error(where + ": rescale_betas_zero_snr is true, which dtrain does not support",
                         "set it to false, or train with diffusers");
    // Absent keys: DDPMScheduler's defaults, as from_pretrained fills them.
    c.beta_schedule = parse_beta_schedule(detail::get<std::string>(j, where, "beta_schedule", "linear"));
    c.beta_start = detail::get<double>(j, where, "beta_start", 0.0001);
    c.beta_end = detail::get<double>(j, where, "beta_end", 0.02);
    const std::string prediction = detail::get<std::string>(j, where, "prediction_type", "epsilon");
    if (prediction == "epsilon")
      c.objective = Objective::eps;
    else if (prediction == "v_prediction")
      c.objective = Objective::v;
    else
      throw config_error(
          where + ": prediction_type \"" + prediction + "\" is not supported (supported: epsilon, v_prediction)",
          "give epsilon or v_prediction");
    make_schedule(c);  // checks it
    return c;
  }

  DTRAIN_DECL double standard_normal(std::uint64_t stream, std::uint64_t index) {
    const std::uint64_t pair = index / 2;
    const double u1 = 1.0 - uniform53(stream, 2 * pair);  // (0, 1]: log is finite
    const double u2 = uniform53(stream, 2 * pair + 1);
    const double r = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * std::numbers::pi * u2;
    return index % 2 == 0 ? r * std::cos(angle) : r * std::sin(angle);
  }

  DTRAIN_DECL bool drop_text(std::uint64_t seed, std::int64_t step, std::int64_t record, double probability) {
    using dtrain::detail::derive_stream;
    constexpr std::uint64_t cfg_key = 0x6366672d64726f70ull;  // "cfg-drop"
    const std::uint64_t s = derive_stream(derive_stream(derive_stream(seed, cfg_key), static_cast<std::uint64_t>(step)),
                                          static_cast<std::uint64_t>(record));
    return uniform53(s, 0) < probability;
  }

  DTRAIN_DECL double flow_density(const Options& o, double uniform, double normal) {
    switch (o.sampling) {
      case TimestepSampling::uniform: return uniform;
      case TimestepSampling::logit_normal: return 1.0 / (1.0 + std::exp(-(o.logit_mean + o.logit_std * normal)));
      case TimestepSampling::mode: {
        const double c = std::cos(std::numbers::pi * uniform / 2.0);
        return 1.0 - uniform - o.mode_scale * (c * c - 1.0 + uniform);
      }
    }
    return uniform;
  }

  DTRAIN_DECL double snr(const Schedule& s, std::int64_t t) {
    const double acp = s.alphas_cumprod.at(static_cast<std::size_t>(t));
    return acp / (1.0 - acp);
  }

  DTRAIN_DECL Timestep ddpm_timestep(const Schedule& s, const Options& o, std::int64_t t) {
    Timestep out{.index = t, .timestep = static_cast<double>(t)};
    if (o.snr_gamma > 0.0) {
      const double r = snr(s, t), clipped = std::min(r, o.snr_gamma);
      out.weight = s.config.objective == Objective::v ? clipped / (r + 1.0) : clipped / r;
    }
    return out;
  }

  DTRAIN_DECL Timestep flow_timestep(const Schedule& s, double u) {
    const std::int64_t n = s.config.num_train_timesteps;
    // u in [0, 1); an out-of-range u (mode with a large scale) takes the nearest end.
    std::int64_t i = 0;
    if (u > 0.0) i = u >= 1.0 ? n - 1 : std::min(static_cast<std::int64_t>(u * static_cast<double>(n)), n - 1);
    const auto k = static_cast<std::size_t>(i);
    return {.index = i, .timestep = s.timesteps.at(k), .sigma = s.sigmas.at(k), .weight = 1.0};
  }

  DTRAIN_DECL Timestep draw_timestep(const Schedule& s, const Options& o, std::uint64_t record) {
    const std::uint64_t stream = part_stream(record, Part::timestep);
    if (s.config.objective != Objective::flow) {
      const auto n = static_cast<double>(s.config.num_train_timesteps);
      const auto t = std::min(static_cast<std::int64_t>(uniform53(stream, 0) * n), s.config.num_train_timesteps - 1);
      return ddpm_timestep(s, o, t);
    }
    // The uniform and the normal use different indices of the stream.
    const double u = flow_density(o, uniform53(stream, 0), standard_normal(stream, 2));
    return flow_timestep(s, u);
  }

  DTRAIN_DECL void draw_noise(const Options& o, std::uint64_t record, std::span<double> out) {
    if (o.noise_offset != 0.0 && (o.channels < 1 || out.size() % static_cast<std::size_t>(o.channels) != 0))
      throw config_error("noise offset channels " + std::to_string(o.channels) + " do not divide a record's " +
                             std::to_string(out.size()) + " elements",
                         "give the latents' channel count (the offset is per record and channel)");
    const std::uint64_t stream = part_stream(record, Part::noise);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = standard_normal(stream, i);
    if (o.noise_offset == 0.0) return;
    const auto channels = static_cast<std::size_t>(o.channels);
    const std::size_t block = out.size() / channels;
    const std::uint64_t offsets = part_stream(record, Part::offset);
    for (std::size_t c = 0; c < channels; ++c) {
      const double shift = o.noise_offset * standard_normal(offsets, c);
      for (std::size_t i = c * block; i < (c + 1) * block; ++i) out[i] += shift;
    }
  }

  DTRAIN_DECL void noise_and_target(const Schedule& s, const Timestep& t, std::span<const double> x0,
                                    std::span<const double> noise, std::span<double> noisy, std::span<double> target) {
    const std::size_t n = x0.size();
    if (noise.size() != n || noisy.size() != n || target.size() != n)
      throw config_error("noise_and_target: x0, noise, noisy and target differ in size",
                         "give spans of one record's elements each");
    if (s.config.objective == Objective::flow) {
      const double sigma = t.sigma;
      for (std::size_t i = 0; i < n; ++i) {
        noisy[i] = (1.0 - sigma) * x0[i] + sigma * noise[i];
        target[i] = noise[i] - x0[i];
      }
      return;
    }
    const double acp = s.alphas_cumprod.at(static_cast<std::size_t>(t.index));
    const double a = std::sqrt(acp), b = std::sqrt(1.0 - acp);
    const bool v = s.config.objective == Objective::v;
    for (std::size_t i = 0; i < n; ++i) {
      noisy[i] = a * x0[i] + b * noise[i];
      target[i] = v ? a * noise[i] - b * x0[i] : noise[i];
    }
  }

  DTRAIN_DECL Targets make_targets(const Schedule& s, const Options& o, std::span<const float> x0,
                                   std::int64_t elements, std::span<const std::int64_t> records, std::uint64_t seed,
                                   std::int64_t rank, std::int64_t step) {
    const std::size_t count = records.size();
    if (elements < 1 || x0.size() != count * static_cast<std::size_t>(elements))
      throw config_error("make_targets: x0 holds " + std::to_string(x0.size()) + " values, not " +
                             std::to_string(count) + " records of " + std::to_string(elements),
                         "give x0 as [records, elements]");
    if (o.snr_gamma > 0.0 && s.config.objective == Objective::flow)
      throw config_error("Min-SNR-gamma weights are for the eps and v objectives, not flow", "set snr_gamma to 0");
    if (!std::isfinite(o.snr_gamma) || o.snr_gamma < 0.0 || !std::isfinite(o.noise_offset) ||
        !std::isfinite(o.logit_mean) || !std::isfinite(o.logit_std) || o.logit_std < 0.0 ||
        !std::isfinite(o.mode_scale))
      throw config_error(
          "diffusion options: snr_gamma and logit_std must be finite and not negative, "
          "the others finite",
          "check the diffusion options");
    const auto e = static_cast<std::size_t>(elements);
    Targets out;
    out.noisy.resize(count * e);
    out.target.resize(count * e);
    out.timesteps.resize(count);
    out.weights.resize(count);
    std::vector<double> clean(e), noise(e), noisy(e), target(e);
    for (std::size_t r = 0; r < count; ++r) {
      const std::uint64_t stream = record_stream(seed, rank, step, records[r]);
      const Timestep t = draw_timestep(s, o, stream);
      draw_noise(o, stream, noise);
      for (std::size_t i = 0; i < e; ++i) clean[i] = x0[r * e + i];
      noise_and_target(s, t, clean, noise, noisy, target);
      for (std::size_t i = 0; i < e; ++i) {
        out.noisy[r * e + i] = static_cast<float>(noisy[i]);
        out.target[r * e + i] = static_cast<float>(target[i]);
      }
      out.timesteps[r] = t.timestep;
      out.weights[r] = t.weight;
    }
    return out;
  }

}  // namespace dtrain::diffusion

DTRAIN_IMPL_END
