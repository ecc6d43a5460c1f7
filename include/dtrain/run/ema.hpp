#pragma once
// dtrain::ParamEma: an exponential moving average of a trainer's trainable
// parameters, as diffusers' EMAModel keeps one for Stable Diffusion
// fine-tuning (and OneTrainer's EMA with an update interval):
//
//   every `every`-th optimizer step, update k (k = 1, 2, ...):
//     ema = ema - (1 - d_k) (ema - param),
//     d_k = 0 for k = 1 (the average starts as the parameters), else
//           min(decay, k / (9 + k))   (diffusers' warm-up of the decay)
//
// in float32 on rank 0 (the other ranks keep nothing), from the parameters
// gathered one unit at a time (Trainer::visit_parameters: a collective, so
// every rank calls update). Frozen parameters are not averaged.
//
//   dtrain::ParamEma ema({.decay = 0.9999, .every = 1});
//   ... after each trainer.step(...): ema.update(trainer);
//   ema.save("ema.safetensors");           // rank 0: "<unit>.<param>", F32
//   trainer.load_params("ema.safetensors", {.strict = false});  // the average into the model
//
// save/load keep the update count in the file's metadata, so a resumed run
// continues the same average (load on every rank: rank 0 reads the file).

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/io/safetensors.hpp"

namespace dtrain {

struct EmaOptions {
  double decay = 0.9999;   // the decay the warm-up rises to
  std::int64_t every = 1;  // update every N optimizer steps
};

class ParamEma {
 public:
  explicit ParamEma(EmaOptions o) : o_(o) {
    if (!(o.decay >= 0.0 && o.decay < 1.0))
      throw config_error("EMA decay " + std::to_string(o.decay) + " is outside [0, 1)",
                         "give a decay below 1, e.g. 0.9999 (diffusers' default) or 0.999");
    if (o.every < 1)
      throw config_error("EMA every " + std::to_string(o.every) + " steps", "give an interval of at least 1 step");
  }

  const EmaOptions& options() const { return o_; }
  std::int64_t updates() const { return updates_; }
  // Rank 0's average by parameter name ("<unit>.<param>"); empty elsewhere.
  const std::map<std::string, std::vector<float>>& values() const { return values_; }

  // The decay of update k (1-based), diffusers' get_decay without warm-up options.
  static double decay_at(std::int64_t k, double decay) {
    if (k <= 1) return 0.0;
    const double kd = static_cast<double>(k);
    return std::min(decay, kd / (9.0 + kd));
  }

  // Whether the optimizer step `step` (1-based) updates the average.
  bool due(std::int64_t step) const { return step % o_.every == 0; }

  // Updates the average from the trainer's parameters. Collective.
  template <class Trainer>
  void update(Trainer& trainer) {
    const bool keeper = trainer.world().rank() == 0;
    const double d = decay_at(updates_ + 1, o_.decay);
    trainer.visit_parameters([&](const auto& slot, std::vector<float>&& p) {
      if (!keeper || !slot.spec.trainable) return;
      shapes_[slot.name] = slot.spec.shape;
      auto [it, fresh] = values_.try_emplace(slot.name);
      std::vector<float>& e = it->second;
      if (fresh || e.size() != p.size()) {
        e = std::move(p);
        return;
      }
      const double keep = 1.0 - d;
      for (std::size_t i = 0; i < e.size(); ++i)
        e[i] = static_cast<float>(static_cast<double>(e[i]) - keep * (static_cast<double>(e[i]) - p[i]));
    });
    ++updates_;
  }

  // Rank 0 writes the average (F32, "<unit>.<param>"; the update count and
  // the options in the metadata) atomically; other ranks write nothing.
  template <class Trainer>
  void save(Trainer& trainer, const std::filesystem::path& file) const {
    if (trainer.world().rank() != 0) return;
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    w.set_metadata("dtrain_ema_updates", std::to_string(updates_));
    w.set_metadata("dtrain_ema_decay", std::to_string(o_.decay));
    w.set_metadata("dtrain_ema_every", std::to_string(o_.every));
    for (const auto& [name, v] : values_) w.add(name, shapes_.at(name), v);
    w.write(file);
  }

  // Continues the average a save wrote (rank 0 reads it; every rank learns
  // the update count). Collective.
  template <class Trainer>
  void load(Trainer& trainer, const std::filesystem::path& file) {
    std::int64_t updates = 0;
    if (trainer.world().rank() == 0) {
      const SafetensorsFile f = SafetensorsFile::open(file);
      const auto m = f.metadata().find("dtrain_ema_updates");
      if (m == f.metadata().end())
        throw checkpoint_error("\"" + file.string() + "\" has no dtrain_ema_updates: not an EMA file",
                               "give the ema.safetensors a run with EMA saved");
      updates = std::stoll(m->second);
      values_.clear();
      shapes_.clear();
      for (const auto& n : f.names()) {
        values_[n] = f.read_f32(n);
        shapes_[n] = f.tensor(n).shape;
      }
    }
    updates_ = trainer.world().all_gather("dtrain-ema-load", updates).at(0);
  }

 private:
  EmaOptions o_;
  std::int64_t updates_ = 0;
  std::map<std::string, std::vector<float>> values_;
  std::map<std::string, std::vector<std::int64_t>> shapes_;
};

}  // namespace dtrain
