// The definitions loader.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/data/loader.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL auto DataLoader::next()->Batch {
    if (failed_) std::rethrow_exception(failed_);
    Slot slot = options_.num_workers == 0 ? produce(claim()) : take();
    if (slot.error) {
      failed_ = slot.error;
      std::rethrow_exception(failed_);
    }
    sampler_.load_state(slot.state_after);
    return std::move(slot.batch);
  }

  DTRAIN_DECL auto DataLoader::start(std::int64_t source_size)->void {
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

  DTRAIN_DECL auto DataLoader::claim()->Claim {
    const SamplerState before = source_.state();
    Claim c{claimed_++, source_.next(options_.batch_size), {}, {}};
    c.state_after = source_.state();
    // index i sits at position before.position + i of the stream, epochs of num_samples() each
    const std::int64_t per = std::max<std::int64_t>(source_.num_samples(), 1);
    c.epochs.resize(c.indices.size());
    for (std::size_t i = 0; i < c.indices.size(); ++i)
      c.epochs[i] = before.epoch + (before.position + static_cast<std::int64_t>(i)) / per;
    return c;
  }

  DTRAIN_DECL auto DataLoader::produce(Claim c) const->Slot {
    Slot slot;
    slot.state_after = c.state_after;
    try {
      slot.batch = gather(std::move(c.indices), c.epochs);
      if (options_.transform) options_.transform(slot.batch);
    } catch (...) {
      slot.error = std::current_exception();
    }
    return slot;
  }

  DTRAIN_DECL auto DataLoader::gather(std::vector<std::int64_t> indices, const std::vector<std::int64_t>& epochs)
      const->Batch {
    Batch b = gather_(indices, epochs);
    b.indices = std::move(indices);
    return b;
  }

  DTRAIN_DECL auto DataLoader::work()->void {
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

  DTRAIN_DECL auto DataLoader::take()->Slot {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return ready_.contains(consumed_); });
    Slot slot = std::move(ready_.extract(consumed_).mapped());
    ++consumed_;
    lock.unlock();
    changed_.notify_all();  // a slot under the prefetch bound opened
    return slot;
  }

  DTRAIN_DECL auto DataLoader::stop() noexcept->void {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& w : workers_) w.join();
  }
}  // namespace dtrain
DTRAIN_IMPL_END
