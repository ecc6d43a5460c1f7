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
      : gather_([&source](std::span<const std::int64_t> idx) { return source.gather(idx); }),
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
  Batch next() {
    if (failed_) std::rethrow_exception(failed_);
    Slot slot = options_.num_workers == 0 ? produce(claim()) : take();
    if (slot.error) {
      failed_ = slot.error;
      std::rethrow_exception(failed_);
    }
    sampler_.load_state(slot.state_after);
    return std::move(slot.batch);
  }

  const LoaderOptions& options() const { return options_; }

 private:
  void start(std::int64_t source_size) {
    if (options_.batch_size < 1)
      throw config_error("DataLoader: batch_size " + std::to_string(options_.batch_size) + " is not positive",
                         "set LoaderOptions::batch_size to the per-rank micro-batch size");
    if (options_.num_workers < 0 || options_.prefetch < 1)
      throw config_error("DataLoader: num_workers " + std::to_string(options_.num_workers) + " / prefetch " +
                             std::to_string(options_.prefetch) + " is invalid",
                         "use num_workers >= 0 and prefetch >= 1");
    if (sampler_.dataset_size() > source_size)
      throw config_error("DataLoader: the sampler draws from " + std::to_string(sampler_.dataset_size()) +
                             " rows but the data set has " + std::to_string(source_size),
                         "build the sampler with the data set's size()");
    workers_.reserve(static_cast<std::size_t>(options_.num_workers));
    try {
      for (int i = 0; i < options_.num_workers; ++i) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }

  struct Claim {
    std::int64_t number = 0;
    std::vector<std::int64_t> indices;
    SamplerState state_after;
  };
  struct Slot {
    Batch batch;
    std::exception_ptr error;
    SamplerState state_after;
  };

  // Under mutex_ when workers exist: claimed_ and the sampler copy are what
  // fixes batch k's indices, so claims must be serial even though gathers are not.
  Claim claim() {
    Claim c{claimed_++, source_.next(options_.batch_size), {}};
    c.state_after = source_.state();
    return c;
  }

  Slot produce(Claim c) const {
    Slot slot;
    slot.state_after = c.state_after;
    try {
      slot.batch = gather(std::move(c.indices));
      if (options_.transform) options_.transform(slot.batch);
    } catch (...) {
      slot.error = std::current_exception();
    }
    return slot;
  }

  Batch gather(std::vector<std::int64_t> indices) const {
    Batch b = gather_(indices);
    b.indices = std::move(indices);
    return b;
  }

  void work() {
    for (;;) {
      Claim c;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || claimed_ < consumed_ + options_.prefetch; });
        if (stopping_) return;
        c = claim();
      }
      const std::int64_t number = c.number;
      Slot slot = produce(std::move(c));
      {
        std::lock_guard lock(mutex_);
        ready_.emplace(number, std::move(slot));
      }
      changed_.notify_all();
    }
  }

  Slot take() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return ready_.contains(consumed_); });
    Slot slot = std::move(ready_.extract(consumed_).mapped());
    ++consumed_;
    lock.unlock();
    changed_.notify_all();  // a slot under the prefetch bound opened
    return slot;
  }

  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& w : workers_) w.join();
  }

  std::function<Batch(std::span<const std::int64_t>)> gather_;
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
