#pragma once
// DistributedSampler: which dataset rows this rank reads, epoch by epoch.
//
// Every rank computes the same permutation of [0, N) from (seed, epoch) and
// takes a strided slice of it (rank r gets positions r, r+W, r+2W, ...), so
// the ranks' shards are disjoint and together cover the dataset, as in
// PyTorch's DistributedSampler. The permutation comes from our own splitmix64
// generator and Fisher-Yates shuffle (never std::shuffle or a <random>
// distribution, whose output differs between standard libraries), so it is
// the same on every machine, compiler and rank.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/random.hpp"

namespace dtrain {

struct SamplerOptions {
  bool shuffle = true;
  std::uint64_t seed = 0;
  // false: wrap around to the start of the permutation so every rank gets
  // ceil(N / W) samples (a few rows are then seen twice per epoch);
  // true: drop the tail so every rank gets floor(N / W).
  bool drop_last = false;
};

// Where the sampler stands: `position` samples of epoch `epoch` have been
// taken. Saved in checkpoints; load_state() resumes exactly there.
struct SamplerState {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};

// Anything that knows this process's rank and the world size (dtrain::World,
// a Communicator).
template <class W>
concept RankInfo = requires(const W& w) {
  { w.rank() } -> std::convertible_to<int>;
  { w.size() } -> std::convertible_to<int>;
};

namespace detail {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t state) : state_(state) {}
  std::uint64_t next() { return splitmix64_mix(state_ += 0x9e3779b97f4a7c15ull); }

  // Uniform in [0, bound) without modulo bias: reject the lowest
  // (2^64 mod bound) outputs so every residue is equally likely.
  DTRAIN_DECL std::uint64_t below(std::uint64_t bound);

 private:
  std::uint64_t state_;
};

// The permutation of [0, n) for (seed, epoch), identical on every rank.
// Generator state: splitmix64_mix(seed ^ splitmix64_mix(epoch)); Fisher-Yates
// from the back: for i = n-1 .. 1, swap p[i] with p[below(i + 1)].
DTRAIN_DECL std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch,
                                                        bool shuffle);

}  // namespace detail

class DistributedSampler {
 public:
  DTRAIN_DECL DistributedSampler(std::int64_t dataset_size, int rank, int world_size, SamplerOptions options = {});

  template <RankInfo World>
  DistributedSampler(std::int64_t dataset_size, const World& world, SamplerOptions options = {})
      : DistributedSampler(dataset_size, static_cast<int>(world.rank()), static_cast<int>(world.size()), options) {}

  // Starts epoch `epoch` from its first sample.
  void set_epoch(std::int64_t epoch) { load_state({epoch, 0}); }

  // Resumes at a saved state. position == num_samples() is valid (the epoch
  // was used up; the next sample comes from epoch + 1).
  DTRAIN_DECL void load_state(SamplerState state);

  SamplerState state() const { return {epoch_, position_}; }
  std::int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch, in order (num_samples() of them).
  std::span<const std::int64_t> indices() const { return indices_; }
  // Samples per rank per epoch.
  std::int64_t num_samples() const { return num_samples_; }
  std::int64_t dataset_size() const { return dataset_size_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const SamplerOptions& options() const { return options_; }

  // The next n indices, moving into the next epoch (epoch + 1) when this one
  // is used up; n may span several epochs.
  DTRAIN_DECL std::vector<std::int64_t> next(std::int64_t n);

 private:
  // Padding repeats the permutation's head (cyclically, for tiny datasets);
  // rank r then takes every W-th entry starting at r.
  DTRAIN_DECL void build_indices();

  std::int64_t dataset_size_;
  int rank_;
  int world_size_;
  SamplerOptions options_;
  std::int64_t num_samples_ = 0;
  std::int64_t epoch_ = 0;
  std::int64_t position_ = 0;
  std::vector<std::int64_t> indices_;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/data/sampler.ipp"
#endif
