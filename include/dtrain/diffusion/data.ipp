// The definitions data.hpp declares with DTRAIN_DECL: included at the end of
// the header when DTRAIN_DEFINE_IMPL (core/macros.hpp).
#pragma once

#include <algorithm>
#include <cmath>

#include "dtrain/diffusion/data.hpp"
#include "dtrain/io/files.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::diffusion {
  namespace detail {

  inline std::string shape_of(const std::vector<std::int64_t>& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  }

  inline bool float_type(element_type t) {
    return t == element_type::f32 || t == element_type::f16 || t == element_type::bf16 || t == element_type::f64;
  }

  }  // namespace detail

  DTRAIN_DECL NoisedRecords::NoisedRecords(const std::filesystem::path& file, RecordsOptions options)
      : file_(SafetensorsFile::open(file)), o_(std::move(options)) {
    const std::string where = "the records file \"" + file.string() + "\"";
    const std::string layout =
        "give latents [N, C, H, W] and encoder_hidden_states [N, L, D] (and for SDXL pooled [N, P] and time_ids "
        "[N, 6]); examples/diffusion/cache_latents.py writes such a file";
    const auto need = [&](bool ok, const std::string& what) {
      if (!ok) throw config_error(where + ": " + what, layout);
    };
    const auto shape = [&](const char* name) { return file_.tensor(name).shape; };
    const auto floats = [&](const char* name, std::size_t rank) {
      need(file_.contains(name), "no \"" + std::string(name) + "\" tensor");
      const SafetensorsTensor t = file_.tensor(name);
      need(detail::float_type(t.dtype) && t.shape.size() == rank,
           "\"" + std::string(name) + "\" is " + std::string(element_name(t.dtype)) + " " + detail::shape_of(t.shape) +
               ", not a float tensor of " + std::to_string(rank) + " dimensions");
    };
    floats("latents", 4);
    const auto lat = shape("latents");
    n_ = lat[0];
    c_ = lat[1];
    h_ = lat[2];
    w_ = lat[3];
    need(n_ > 0, "no records (latents is " + detail::shape_of(lat) + ")");
    floats("encoder_hidden_states", 3);
    const auto ehs = shape("encoder_hidden_states");
    need(ehs[0] == n_,
         "encoder_hidden_states has " + std::to_string(ehs[0]) + " records, latents " + std::to_string(n_));
    l_ = ehs[1];
    d_ = ehs[2];
    const bool pooled = file_.contains("pooled"), ids = file_.contains("time_ids");
    need(pooled == ids, "pooled and time_ids come together (SDXL's added conditioning), not one alone");
    if (pooled) {
      floats("pooled", 2);
      floats("time_ids", 2);
      need(shape("pooled")[0] == n_ && shape("time_ids")[0] == n_ && shape("time_ids")[1] == 6,
           "pooled is " + detail::shape_of(shape("pooled")) + " and time_ids " + detail::shape_of(shape("time_ids")) +
               " for " + std::to_string(n_) + " records (time_ids: 6 per record)");
      p_ = shape("pooled")[1];
    }
    if ((mask_ = file_.contains("encoder_attention_mask"))) {
      const auto m = file_.tensor("encoder_attention_mask");
      need(m.dtype == element_type::i32 || m.dtype == element_type::i64 || m.dtype == element_type::u8 ||
               m.dtype == element_type::i8,
           "encoder_attention_mask is " + std::string(element_name(m.dtype)) + ", not integers");
      need(m.shape == std::vector<std::int64_t>{n_, l_},
           "encoder_attention_mask is " + detail::shape_of(m.shape) + ", not [N, L] = " + detail::shape_of({n_, l_}));
    }
    const bool noise = file_.contains("noise"), steps = file_.contains("timesteps");
    need(noise == steps, "noise and timesteps come together (a record's own draws), not one alone");
    if ((own_draws_ = noise)) {
      floats("noise", 4);
      floats("timesteps", 1);
      need(shape("noise") == lat,
           "noise is " + detail::shape_of(shape("noise")) + ", latents " + detail::shape_of(lat));
      need(shape("timesteps")[0] == n_,
           "timesteps has " + std::to_string(shape("timesteps")[0]) + " records, not " + std::to_string(n_));
      const std::vector<float> t = file_.read_f32("timesteps");
      for (std::int64_t r = 0; r < n_; ++r) given_timestep(t[static_cast<std::size_t>(r)], r);
    }
    if ((uncond_ = file_.contains("uncond_encoder_hidden_states"))) {
      floats("uncond_encoder_hidden_states", 2);
      need(shape("uncond_encoder_hidden_states") == std::vector<std::int64_t>{l_, d_},
           "uncond_encoder_hidden_states is " + detail::shape_of(shape("uncond_encoder_hidden_states")) +
               ", not [L, D] = " + detail::shape_of({l_, d_}));
      uncond_states_ = file_.read_f32("uncond_encoder_hidden_states");
      if (file_.contains("uncond_pooled")) {
        floats("uncond_pooled", 1);
        need(shape("uncond_pooled")[0] == p_, "uncond_pooled is " + detail::shape_of(shape("uncond_pooled")) +
                                                  ", not [P] = [" + std::to_string(p_) + "]");
        uncond_pooled_ = file_.read_f32("uncond_pooled");
      }
    }
    if (uncond_pooled_.empty()) uncond_pooled_.assign(static_cast<std::size_t>(p_), 0.f);
    if (uncond_states_.empty()) uncond_states_.assign(static_cast<std::size_t>(l_ * d_), 0.f);
    first_ = o_.first;
    count_ = o_.count < 0 ? n_ - first_ : o_.count;
    if (first_ < 0 || count_ < 1 || first_ + count_ > n_)
      throw config_error(where + ": records [" + std::to_string(first_) + ", " + std::to_string(first_ + count_) +
                             ") of " + std::to_string(n_),
                         "give a range inside the file, with at least one record");
    if (!(o_.drop_text >= 0.0 && o_.drop_text <= 1.0))
      throw config_error("drop_text " + std::to_string(o_.drop_text) + " is not a probability",
                         "give a value in [0, 1], e.g. 0.1 (10% of captions dropped)");
    o_.draws.channels = c_;
  }

  DTRAIN_DECL void NoisedRecords::check(const RecordsShape& want, const std::string& model) const {
    const std::string where = "the records file \"" + path().string() + "\"";
    if (c_ != want.channels)
      throw config_error(where + ": latents of " + std::to_string(c_) + " channels; " + model + " takes " +
                             std::to_string(want.channels) + " (in_channels)",
                         "cache the latents with the VAE of the model's own pipeline");
    if (want.height > 0 && (h_ != want.height || w_ != want.width))
      throw config_error(where + ": latents of " + std::to_string(h_) + " x " + std::to_string(w_) + "; " + model +
                             " is built for " + std::to_string(want.height) + " x " + std::to_string(want.width),
                         "cache the images at the size the model is built for");
    if (want.context_dim > 0 && d_ != want.context_dim)
      throw config_error(where + ": encoder_hidden_states are " + std::to_string(d_) + " wide; " + model +
                             " attends to text of " + std::to_string(want.context_dim) + " (cross_attention_dim)",
                         "cache the text with the text encoder(s) of the model's own pipeline");
    if (want.pooled_dim > 0 && p_ != want.pooled_dim)
      throw config_error(where +
                             (p_ == 0 ? std::string(": no pooled and time_ids; ")
                                      : ": pooled embeddings of " + std::to_string(p_) + "; ") +
                             model + " (SDXL's text_time conditioning) needs pooled [N, " +
                             std::to_string(want.pooled_dim) + "] and time_ids [N, 6]",
                         "cache SDXL's pooled text embedding and its time ids beside the latents");
    if (want.pooled_dim == 0 && p_ > 0)
      throw config_error(
          where + ": pooled and time_ids are for SDXL's text_time conditioning, which " + model + " has not",
          "cache the records for this model, without pooled and time_ids");
  }

  DTRAIN_DECL void NoisedRecords::read_rows(const std::string& name, std::int64_t first, std::int64_t rows, float* out)
      const {
    const SafetensorsTensor t = file_.tensor(name);
    std::int64_t per = 1;
    for (std::size_t d = 1; d < t.shape.size(); ++d) per *= t.shape[d];
    const std::size_t size = element_bytes(t.dtype);
    const auto bytes =
        t.bytes.subspan(static_cast<std::size_t>(first * per) * size, static_cast<std::size_t>(rows * per) * size);
    std::vector<float> v;
    switch (t.dtype) {
      case element_type::f32: v = dtrain::detail::decode_to_float<float>(bytes, [](float x) { return x; }); break;
      case element_type::f64:
        v = dtrain::detail::decode_to_float<double>(bytes, [](double x) { return static_cast<float>(x); });
        break;
      case element_type::f16:
        v = dtrain::detail::decode_to_float<std::uint16_t>(bytes, dtrain::detail::fp16_bits_to_float);
        break;
      default: v = dtrain::detail::decode_to_float<std::uint16_t>(bytes, dtrain::detail::bf16_bits_to_float);
    }
    std::copy(v.begin(), v.end(), out);
  }

  DTRAIN_DECL Timestep NoisedRecords::given_timestep(double value, std::int64_t record) const {
    const Schedule& s = o_.schedule;
    const std::string where = "the records file \"" + path().string() + "\": record " + std::to_string(record) +
                              "'s timestep " + std::to_string(value);
    if (s.config.objective != Objective::flow) {
      const double t = std::round(value);
      if (!(std::abs(value - t) <= 1e-6) || t < 0 || t >= static_cast<double>(s.config.num_train_timesteps))
        throw config_error(
            where + " is not an integer timestep in [0, " + std::to_string(s.config.num_train_timesteps) + ")",
            "give each record's DDPM timestep t (an integer below num_train_timesteps)");
      return ddpm_timestep(s, o_.draws, static_cast<std::int64_t>(t));
    }
    std::size_t best = 0;
    for (std::size_t i = 1; i < s.timesteps.size(); ++i)
      if (std::abs(s.timesteps[i] - value) < std::abs(s.timesteps[best] - value)) best = i;
    if (!(std::abs(s.timesteps[best] - value) <= 1e-3 * std::max(1.0, std::abs(value))))
      throw config_error(where + " is not one of the flow schedule's timesteps (sigma x num_train_timesteps)",
                         "give each record a timestep of the scheduler's table (diffusers' scheduler.timesteps)");
    return {.index = static_cast<std::int64_t>(best),
            .timestep = s.timesteps[best],
            .sigma = s.sigmas[best],
            .weight = 1.0};
  }

  DTRAIN_DECL Batch NoisedRecords::gather(std::span<const std::int64_t> indices, std::span<const std::int64_t> epochs)
      const {
    const auto n = static_cast<std::int64_t>(indices.size());
    const std::int64_t e = c_ * h_ * w_, text = l_ * d_;
    const auto ue = static_cast<std::size_t>(e);
    std::vector<float> x(static_cast<std::size_t>(n * e)), y(x.size()), states(static_cast<std::size_t>(n * text));
    std::vector<float> timesteps(static_cast<std::size_t>(n)), weights(static_cast<std::size_t>(n));
    std::vector<float> pooled(static_cast<std::size_t>(n * p_)), ids(static_cast<std::size_t>(p_ > 0 ? n * 6 : 0));
    std::vector<std::int32_t> mask;
    std::vector<float> row(ue), given(ue);
    std::vector<double> clean(ue), noise(ue), noisy(ue), target(ue);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (indices[k] < 0 || indices[k] >= count_)
        throw config_error("NoisedRecords: index " + std::to_string(indices[k]) + " of " + std::to_string(count_),
                           "draw indices below size()");
      const std::int64_t record = first_ + indices[k], epoch = epochs[k];
      const std::uint64_t stream = record_stream(o_.seed, 0, epoch, record);
      read_rows("latents", record, 1, row.data());
      std::copy(row.begin(), row.end(), clean.begin());
      Timestep t;
      if (own_draws_) {
        read_rows("noise", record, 1, given.data());
        std::copy(given.begin(), given.end(), noise.begin());
        float value = 0.f;
        read_rows("timesteps", record, 1, &value);
        t = given_timestep(value, record);
      } else {
        t = draw_timestep(o_.schedule, o_.draws, stream);
        draw_noise(o_.draws, stream, noise);
      }
      noise_and_target(o_.schedule, t, clean, noise, noisy, target);
      for (std::size_t j = 0; j < ue; ++j) {
        x[k * ue + j] = static_cast<float>(noisy[j]);
        y[k * ue + j] = static_cast<float>(target[j]);
      }
      timesteps[k] = static_cast<float>(t.timestep);
      weights[k] = static_cast<float>(t.weight);
      const bool dropped =
          epoch != evaluation_epoch && o_.drop_text > 0.0 && drop_text(o_.seed, epoch, record, o_.drop_text);
      float* s = states.data() + k * static_cast<std::size_t>(text);
      if (dropped)
        std::copy(uncond_states_.begin(), uncond_states_.end(), s);
      else
        read_rows("encoder_hidden_states", record, 1, s);
      if (p_ > 0) {
        float* p = pooled.data() + k * static_cast<std::size_t>(p_);
        if (dropped)
          std::copy(uncond_pooled_.begin(), uncond_pooled_.end(), p);
        else
          read_rows("pooled", record, 1, p);
        read_rows("time_ids", record, 1, ids.data() + k * 6);
      }
      if (mask_) {
        const SafetensorsTensor m = file_.tensor("encoder_attention_mask");
        const std::size_t size = element_bytes(m.dtype);
        for (std::int64_t j = 0; j < l_; ++j) {
          std::int64_t v = 1;
          const std::size_t at = static_cast<std::size_t>(record * l_ + j) * size;
          if (!dropped) {
            switch (m.dtype) {
              case element_type::i64: v = dtrain::detail::load_element<std::int64_t>(m.bytes, at / size); break;
              case element_type::i32: v = dtrain::detail::load_element<std::int32_t>(m.bytes, at / size); break;
              case element_type::i8: v = dtrain::detail::load_element<std::int8_t>(m.bytes, at / size); break;
              default: v = dtrain::detail::load_element<std::uint8_t>(m.bytes, at / size);
            }
          }
          mask.push_back(v != 0 ? 1 : 0);
        }
      }
    }
    Batch b;
    b.set("x", HostTensor::of(std::move(x), {n, e}));
    b.set("y", HostTensor::of(std::move(y), {n, e}));
    b.set("timesteps", HostTensor::of(std::move(timesteps), {n}));
    b.set("weight", HostTensor::of(std::move(weights), {n}));
    b.set("encoder_hidden_states", HostTensor::of(std::move(states), {n, l_, d_}));
    if (p_ > 0) {
      b.set("pooled", HostTensor::of(std::move(pooled), {n, p_}));
      b.set("time_ids", HostTensor::of(std::move(ids), {n, 6}));
    }
    if (mask_) b.set("encoder_attention_mask", HostTensor::of(std::move(mask), {n, l_}));
    return b;
  }

}  // namespace dtrain::diffusion

DTRAIN_IMPL_END
