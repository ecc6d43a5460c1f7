#pragma once
// dtrain::fit's resume (FitOptions::resume): the checkpoints it names, tried
// in order. With "latest", a checkpoint that fails verification is reported
// and the one before it tried: a damaged newest checkpoint costs the steps
// since the previous one, not the run.

#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/run/fit_options.hpp"

namespace dtrain {

namespace detail {

class Resumer {
 public:
  // Loads a checkpoint into the run (collective): Trainer::load and the
  // sampler's position, TrainBatches::restore in fit.
  using Load = std::function<CheckpointInfo(const std::filesystem::path&)>;

  DTRAIN_DECL Resumer(const FitOptions& o, bool rank0);

  // The checkpoints to try, in order: with "latest" every complete one in
  // checkpoint_dir, newest first; else the one named, or none.
  const std::vector<std::filesystem::path>& candidates() const { return candidates_; }

  // Loads the first candidate that loads and returns it (nullopt: there
  // were none). A checkpoint_error moves on to the next candidate; the last
  // one's is rethrown. A load agrees on its errors, so every rank tries the
  // same candidates.
  DTRAIN_DECL std::optional<std::filesystem::path> resume(const Load& load) const;

 private:
  const FitOptions& o_;
  bool rank0_;
  std::vector<std::filesystem::path> candidates_;
};

}  // namespace detail
}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/run/fit_resume.ipp"
#endif
