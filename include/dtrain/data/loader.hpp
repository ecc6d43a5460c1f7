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
#include "dtrain/data/dataset.hpp"
#include "dtrain/data/sampler.hpp"

namespace dtrain {

struct Batch {
  std::vector<float> x;            // [rows, features], row-major
  std::vector<std::int32_t> y;     // [rows]
  std::int64_t rows = 0;
  std::int64_t features = 0;
  std::vector<std::int64_t> indices;  // the dataset rows gathered, in order
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
  // `dataset` and `sampler` must outlive the loader; while it lives, only the
  // loader moves the sampler (change its epoch or state before building one).
  DataLoader(const Dataset& dataset, DistributedSampler& sampler, LoaderOptions options)
      : dataset_(dataset), sampler_(sampler), options_(std::move(options)), source_(sampler) {
    if (options_.batch_size < 1)
      throw config_error("DataLoader: batch_size " + std::to_string(options_.batch_size) + " is not positive",
                         "set LoaderOptions::batch_size to the per-rank micro-batch size");
    if (options_.num_workers < 0 || options_.prefetch < 1)
      throw config_error("DataLoader: num_workers " + std::to_string(options_.num_workers) + " / prefetch " +
                             std::to_string(options_.prefetch) + " is invalid",
                         "use num_workers >= 0 and prefetch >= 1");
    if (sampler.dataset_size() > dataset.rows)
      throw config_error("DataLoader: the sampler draws from " + std::to_string(sampler.dataset_size()) +
                             " rows but the dataset has " + std::to_string(dataset.rows),
                         "build the sampler with dataset.size()");
    if (static_cast<std::int64_t>(dataset.x.size()) != dataset.rows * dataset.features ||
        static_cast<std::int64_t>(dataset.y.size()) != dataset.rows)
      throw config_error("DataLoader: the dataset's x/y sizes do not match its rows and features",
                         "call dataset.validate(num_classes) after building it");
    workers_.reserve(static_cast<std::size_t>(options_.num_workers));
    try {
      for (int i = 0; i < options_.num_workers; ++i) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
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
    Batch b;
    b.rows = static_cast<std::int64_t>(indices.size());
    b.features = dataset_.features;
    const auto f = static_cast<std::size_t>(dataset_.features);
    b.x.resize(indices.size() * f);
    b.y.resize(indices.size());
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const auto row = static_cast<std::size_t>(indices[i]);
      std::copy_n(dataset_.x.begin() + static_cast<std::ptrdiff_t>(row * f), f,
                  b.x.begin() + static_cast<std::ptrdiff_t>(i * f));
      b.y[i] = dataset_.y[row];
    }
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

  const Dataset& dataset_;
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
