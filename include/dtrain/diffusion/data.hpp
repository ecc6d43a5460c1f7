#pragma once
// Cached inputs for diffusion fine-tuning, as OneTrainer and diffusers'
// scripts cache them: the VAE and the text encoders run once, before
// training, and the training step sees only their outputs.
//
// A records file is one safetensors file, every tensor's first dimension
// the N records (float tensors in F32, F16 or BF16):
//   latents                [N, C, H, W]  the VAE's latents, already scaled (times
//                                        the VAE's scaling_factor, as the
//                                        pipeline's UNet sees them)
//   encoder_hidden_states  [N, L, D]     the text encoder's hidden states
//   pooled                 [N, P]        SDXL: the pooled text embedding
//   time_ids               [N, 6]        SDXL: original size, crop, target size
//   encoder_attention_mask [N, L]        optional, int: 1 a token, 0 padding
//   noise                  [N, C, H, W]  optional: this noise instead of a draw
//   timesteps              [N]           optional: this timestep instead of a
//                                        draw (eps, v: an integer t < N_train;
//                                        flow: the model's timestep,
//                                        sigma x N_train, as diffusers'
//                                        scheduler.timesteps holds it)
// and, not per record, for classifier-free guidance training:
//   uncond_encoder_hidden_states [L, D] (and uncond_pooled [P]): the empty
//   caption's embedding, put in place of a dropped record's (zeros when
//   the file has none).
// noise and timesteps come together or not at all.
//
// NoisedRecords is the BatchSource over a records file (data/loader.hpp's
// EpochSource): gather(indices, epochs) returns, per record, the noisy
// latents "x" [n, C H W], the objective's target "y" [n, C H W], "timesteps"
// [n], "weight" [n] (Min-SNR; 1 otherwise), "encoder_hidden_states" and the
// rest. The draws of a record are a function of (seed, epoch, record):
// every pass over the data draws afresh, and a resumed run, any world size
// and any batch size draw the same. gather(indices) alone draws at a fixed
// epoch (evaluation's fixed noise and timesteps). A caption is dropped with
// probability drop_text at (seed, epoch, record). Records are read from the
// mapped file as they are gathered: the file is never held in memory whole.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/diffusion/schedule.hpp"
#include "dtrain/io/safetensors.hpp"

namespace dtrain::diffusion {

// What the model needs of the records: check_records refuses a file that
// does not fit it, naming the tensor and the fix.
struct RecordsShape {
  std::int64_t channels = 4;
  std::int64_t height = 0, width = 0;  // 0: any (the model is built for the file's)
  std::int64_t context_dim = 0;        // encoder_hidden_states' width (cross_attention_dim)
  std::int64_t pooled_dim = 0;         // > 0: pooled and time_ids are needed (SDXL)
};

struct RecordsOptions {
  Schedule schedule;  // the objective and its tables (make_schedule)
  Options draws{};    // timestep sampling, Min-SNR, noise offset
  std::uint64_t seed = 0;
  double drop_text = 0.0;              // classifier-free guidance: drop a caption with this probability
  std::int64_t first = 0, count = -1;  // the records [first, first + count) of the file (-1: to the end)
};

class NoisedRecords {
 public:
  // Opens and checks the file (a config_error naming the problem).
  DTRAIN_DECL NoisedRecords(const std::filesystem::path& file, RecordsOptions options);

  std::int64_t size() const { return count_; }
  std::int64_t records_in_file() const { return n_; }
  std::int64_t channels() const { return c_; }
  std::int64_t height() const { return h_; }
  std::int64_t width() const { return w_; }
  std::int64_t context_length() const { return l_; }
  std::int64_t context_dim() const { return d_; }
  std::int64_t pooled_dim() const { return p_; }
  bool has_own_draws() const { return own_draws_; }
  const std::filesystem::path& path() const { return file_.path(); }

  // Refuses records the model described by `want` cannot take.
  DTRAIN_DECL void check(const RecordsShape& want, const std::string& model) const;

  // Draws at a fixed epoch (evaluation).
  Batch gather(std::span<const std::int64_t> indices) const {
    const std::vector<std::int64_t> fixed(indices.size(), evaluation_epoch);
    return gather(indices, fixed);
  }
  DTRAIN_DECL Batch gather(std::span<const std::int64_t> indices, std::span<const std::int64_t> epochs) const;

  // The epoch evaluation draws at.
  static constexpr std::int64_t evaluation_epoch = -1;

 private:
  // `rows` rows of tensor `name` from record `first`, as float.
  DTRAIN_DECL void read_rows(const std::string& name, std::int64_t first, std::int64_t rows, float* out) const;
  DTRAIN_DECL Timestep given_timestep(double value, std::int64_t record) const;

  SafetensorsFile file_;
  RecordsOptions o_;
  std::int64_t n_ = 0, first_ = 0, count_ = 0;
  std::int64_t c_ = 0, h_ = 0, w_ = 0, l_ = 0, d_ = 0, p_ = 0;
  bool own_draws_ = false, mask_ = false, uncond_ = false;
  std::vector<float> uncond_states_, uncond_pooled_;
};

}  // namespace dtrain::diffusion

#if DTRAIN_DEFINE_IMPL
#include "dtrain/diffusion/data.ipp"
#endif
