// The definitions sampler.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/data/sampler.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL auto SplitMix64::below(std::uint64_t bound) -> std::uint64_t {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }
  DTRAIN_DECL std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch,
                                                          bool shuffle) {
    std::vector<std::int64_t> p(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = i;
    if (!shuffle) return p;
    SplitMix64 rng(splitmix64_mix(seed ^ splitmix64_mix(static_cast<std::uint64_t>(epoch))));
    for (std::int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(i) + 1));
      std::swap(p[static_cast<std::size_t>(i)], p[j]);
    }
    return p;
  }

  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL DistributedSampler::DistributedSampler(std::int64_t dataset_size, int rank, int world_size,
                                                   SamplerOptions options)
    : dataset_size_(dataset_size), rank_(rank), world_size_(world_size), options_(options) {
  if (world_size < 1)
    throw config_error("DistributedSampler: world size " + std::to_string(world_size) + " is not positive",
                       "pass the number of ranks (at least 1)");
  if (rank < 0 || rank >= world_size)
    throw config_error(
        "DistributedSampler: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_size) + ")",
        "pass this process's rank in the world");
  if (dataset_size < 1)
    throw config_error("DistributedSampler: the dataset is empty (" + std::to_string(dataset_size) + " rows)",
                       "load the dataset before building its sampler");
  if (options.drop_last && dataset_size < world_size)
    throw config_error("DistributedSampler: " + std::to_string(dataset_size) + " rows over " +
                           std::to_string(world_size) + " ranks with drop_last leaves every rank 0 samples",
                       "use drop_last = false, a larger dataset or fewer ranks");
  num_samples_ = options.drop_last ? dataset_size / world_size : (dataset_size + world_size - 1) / world_size;
  build_indices();
}

DTRAIN_DECL auto DistributedSampler::load_state(SamplerState state) -> void {
  if (state.epoch < 0 || state.position < 0 || state.position > num_samples_)
    throw config_error("DistributedSampler: state {epoch " + std::to_string(state.epoch) + ", position " +
                           std::to_string(state.position) + "} is outside [0, " + std::to_string(num_samples_) +
                           "] samples per epoch",
                       "restore a state saved by a sampler with the same dataset size, world size and drop_last");
  const bool new_epoch = state.epoch != epoch_;
  epoch_ = state.epoch;
  position_ = state.position;
  if (new_epoch) build_indices();
}

DTRAIN_DECL auto DistributedSampler::next(std::int64_t n) -> std::vector<std::int64_t> {
  if (n < 0)
    throw config_error("DistributedSampler::next: asked for " + std::to_string(n) + " samples",
                       "ask for a non-negative number of samples");
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(n));
  while (static_cast<std::int64_t>(out.size()) < n) {
    if (position_ == num_samples_) load_state({epoch_ + 1, 0});
    const std::int64_t take = std::min(n - static_cast<std::int64_t>(out.size()), num_samples_ - position_);
    const auto first = indices_.begin() + position_;
    out.insert(out.end(), first, first + take);
    position_ += take;
  }
  return out;
}

DTRAIN_DECL auto DistributedSampler::build_indices() -> void {
  const auto perm = detail::epoch_permutation(dataset_size_, options_.seed, epoch_, options_.shuffle);
  indices_.resize(static_cast<std::size_t>(num_samples_));
  for (std::int64_t i = 0; i < num_samples_; ++i) {
    const std::int64_t global = i * world_size_ + rank_;
    indices_[static_cast<std::size_t>(i)] = perm[static_cast<std::size_t>(global % dataset_size_)];
  }
}
}  // namespace dtrain
DTRAIN_IMPL_END
