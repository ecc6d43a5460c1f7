#pragma once
// dtrain::fit's training batches: this rank's sampler and the loader that
// draws from it, and the checkpoint loads that move the sampler (resume,
// rollback). While a loader runs only it moves the sampler, so a rewind
// stops the loader, moves the sampler and starts a new loader there.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/data/loader.hpp"
#include "dtrain/data/sampler.hpp"
#include "dtrain/run/fit_options.hpp"

namespace dtrain {

namespace detail {

class TrainBatches {
 public:
  // Draws nothing until start(): a resume moves the sampler first.
  template <BatchSource Train>
  TrainBatches(const Train& train, const World& world, const FitOptions& o)
      : sampler_(static_cast<std::int64_t>(train.size()), world, {.shuffle = o.shuffle, .seed = o.seed}),
        start_([this, &train, options = LoaderOptions{.batch_size = o.batch_size, .num_workers = o.num_workers}] {
          loader_.emplace(train, sampler_, options);
        }) {}
  TrainBatches(const TrainBatches&) = delete;
  TrainBatches& operator=(const TrainBatches&) = delete;

  // Loads checkpoint `dir` into the trainer and the sampler (collective).
  // Before start(); later through rewind().
  template <class Trainer>
  CheckpointInfo restore(Trainer& trainer, const std::filesystem::path& dir) {
    CheckpointInfo info = trainer.load(dir);
    if (info.sampler) sampler_.load_state(info.sampler->state_for(sampler_));
    return info;
  }

  // Saves a checkpoint of the trainer and the sampler's position into `dir` (collective).
  template <class Trainer>
  void save(Trainer& trainer, const std::filesystem::path& dir, bool consolidated) {
    trainer.save(dir, {.consolidated = consolidated, .sampler = &sampler_});
  }

  // Starts drawing where the sampler stands.
  void start() { start_(); }

  Batch next() { return loader_->next(); }

  // Goes back to checkpoint `dir`: the trainer, and batches drawn again from
  // its position. Returns the step training continues from.
  template <class Trainer>
  std::int64_t rewind(Trainer& trainer, const std::filesystem::path& dir) {
    loader_.reset();  // no worker reads the sampler while it is rewound
    restore(trainer, dir);
    start();
    return trainer.steps_taken();
  }

 private:
  DistributedSampler sampler_;
  std::function<void()> start_;
  std::optional<DataLoader> loader_;  // declared last: its workers stop before the sampler goes
};

}  // namespace detail
}  // namespace dtrain
