#pragma once
// DataLoader: turns a sampler's index stream into batches, gathered ahead of
// time by worker threads.
//
// Determinism: batch k is always sampler indices [k*B, (k+1)*B) of the
// stream, whatever num_workers is. Workers claim batch numbers and their
// indices in order under one lock, gather rows in parallel, and next() hands
// batches out strictly by number (a small reorder buffer absorbs workers
// finishing out of order). At most `prefetch` batches are claimed but not yet
// consumed, which bounds memory.
//
// Epochs: a source whose rows depend on the epoch they are drawn in (fresh
// random noise for each pass over the data, as diffusion training draws)
// also offers gather(indices, epochs), and the loader passes each index's
// sampler epoch; the rows are then a function of (index, epoch), the same in
// a resumed run whatever the workers, the batch size or the world size.
//
// Resumability: the loader works on its own copy of the sampler and writes
// the consumed position back to the caller's sampler in next(), so
// sampler.state() is always the point right after the last batch returned,
// never the workers' read-ahead: save it, and a new loader on a sampler
// restored with load_state() continues with exactly the next batch.

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/data/dataset.hpp"
#include "dtrain/data/sampler.hpp"

namespace dtrain {

// A data set the loader gathers batches from: its size (the sampler draws
// indices below it) and the batch of given rows. Dataset is one; train_gpt's
// token windows and train_policy's episodes are others.
template <class S>
concept BatchSource = requires(const S& s, std::span<const std::int64_t> indices) {
  { s.size() } -> std::convertible_to<std::int64_t>;
  { s.gather(indices) } -> std::same_as<Batch>;
};

// A source whose rows depend on the epoch each index is drawn in:
// gather(indices, epochs), epochs[i] the sampler epoch of indices[i].
template <class S>
concept EpochSource = BatchSource<S> && requires(const S& s, std::span<const std::int64_t> indices) {
  { s.gather(indices, indices) } -> std::same_as<Batch>;
};

struct LoaderOptions {
  std::int64_t batch_size = 0;
  // 0 gathers on the thread calling next().
  int num_workers = 2;
  // Batches gathered ahead of the consumer, at most.
  int prefetch = 4;
  // Runs on the gathering thread after a batch is gathered (normalisation,
  // augmentation). Must be safe to call from several threads at once when
  // num_workers > 1. An exception it throws reaches the caller of next().
  std::function<void(Batch&)> transform = {};
};

class DataLoader {
 public:
  // `source` and `sampler` must outlive the loader; while it lives, only the
  // loader moves the sampler (change its epoch or state before building one).
  template <BatchSource Source>
  DataLoader(const Source& source, DistributedSampler& sampler, LoaderOptions options)
      : gather_([&source](std::span<const std::int64_t> idx, std::span<const std::int64_t> epochs) {
          if constexpr (EpochSource<Source>)
            return source.gather(idx, epochs);
          else
            return (void)epochs, source.gather(idx);
        }),
        sampler_(sampler),
        options_(std::move(options)),
        source_(sampler) {
    start(static_cast<std::int64_t>(source.size()));
  }

  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Stops workers mid-stream without waiting for unconsumed batches.
  ~DataLoader() { stop(); }

  // The next batch of batch_size rows. Rethrows the exception that gathering
  // it raised; the loader is then spent and every later call rethrows it.
  DTRAIN_DECL Batch next();

  const LoaderOptions& options() const { return options_; }

 private:
  DTRAIN_DECL void start(std::int64_t source_size);

  struct Claim {
    std::int64_t number = 0;
    std::vector<std::int64_t> indices;
    std::vector<std::int64_t> epochs;  // each index's sampler epoch
    SamplerState state_after;
  };
  struct Slot {
    Batch batch;
    std::exception_ptr error;
    SamplerState state_after;
  };

  // Under mutex_ when workers exist: claimed_ and the sampler copy are what
  // fixes batch k's indices, so claims must be serial even though gathers are not.
  DTRAIN_DECL Claim claim();

  DTRAIN_DECL Slot produce(Claim c) const;

  DTRAIN_DECL Batch gather(std::vector<std::int64_t> indices, const std::vector<std::int64_t>& epochs) const;

  DTRAIN_DECL void work();

  DTRAIN_DECL Slot take();

  DTRAIN_DECL void stop() noexcept;

  std::function<Batch(std::span<const std::int64_t>, std::span<const std::int64_t>)> gather_;
  DistributedSampler& sampler_;
  LoaderOptions options_;
  DistributedSampler source_;  // the workers' read-ahead copy

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::thread> workers_;
  std::map<std::int64_t, Slot> ready_;
  std::int64_t claimed_ = 0;
  std::int64_t consumed_ = 0;
  bool stopping_ = false;
  std::exception_ptr failed_;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/data/loader.ipp"
#endif
