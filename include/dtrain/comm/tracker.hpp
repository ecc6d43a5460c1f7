#pragma once
// Sequence numbers for collectives, published to the rendezvous store so that
// a rank whose collective times out can say which ranks never reached it.
//
// Publishing every collective synchronously would put a store round trip on
// the hot path; instead the caller only bumps an atomic and a heartbeat thread
// publishes it every `interval` (an eighth of the timeout, at most a second).
// A rank that arrived has therefore published long before anyone times out.

#include <algorithm>
#include <atomic>
#include <functional>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "dtrain/comm/store.hpp"

namespace dtrain::detail {

class CollectiveTracker {
 public:
  // name(r): how messages call rank r of this communicator (World::describe_rank).
  using RankNamer = std::function<std::string(int)>;

  CollectiveTracker(std::shared_ptr<TcpStore> store, std::string prefix, int rank, int size,
                    std::chrono::milliseconds timeout, RankNamer name = {})
      : store_(std::move(store)),
        prefix_(std::move(prefix)),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        name_(name ? std::move(name) : RankNamer([](int r) { return std::to_string(r); })) {
    if (store_ && size_ > 1) heartbeat_ = std::thread([this] { run(); });
  }
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;
  ~CollectiveTracker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  // Called by the rank's thread when it enters a collective; returns its sequence number.
  std::uint64_t enter() { return entered_.fetch_add(1) + 1; }

  std::chrono::milliseconds timeout() const { return timeout_; }

  // The full diagnosis for collective `seq` named `what`, which failed with
  // `cause`. `laggards`: add which ranks never reached it, as the heartbeat
  // last published (right for timeouts; a failure detected within
  // milliseconds would see stale numbers, so it leaves them out).
  std::string describe(std::string_view what, std::uint64_t seq, std::string_view cause, bool with_laggards = true) {
    std::string msg = std::string(what) + " (collective #" + std::to_string(seq) + " on rank " +
                      name_(rank_) + " of " + std::to_string(size_) + ") did not complete: " +
                      std::string(cause);
    const std::string missing = with_laggards ? laggards(seq) : std::string();
    if (!missing.empty()) msg += "; ranks that never reached it: " + missing;
    return msg;
  }

 private:
  std::string key(int r) const { return prefix_ + "seq/" + std::to_string(r); }

  void publish() {
    const std::uint64_t now = entered_.load();
    if (now != published_) {
      store_->set(key(rank_), std::to_string(now));
      published_ = now;
    }
  }

  void run() {
    const auto interval = std::clamp(timeout_ / 8, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      try {
        publish();
      } catch (const std::exception&) {
        // The store is gone (rank 0 exited): the collective's own timeout reports the failure.
      }
      lock.lock();
      cv_.wait_for(lock, interval, [this] { return stop_; });
    }
  }

  std::string laggards(std::uint64_t seq) {
    if (!store_ || size_ == 1) return {};
    std::string out;
    try {
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const auto v = store_->try_get(key(r));
        const std::uint64_t reached = v ? std::stoull(*v) : 0;
        if (reached < seq)
          out += (out.empty() ? "" : ", ") + name_(r) + " (at #" + std::to_string(reached) + ")";
      }
    } catch (const std::exception& e) {
      return "unknown (the rendezvous store is unreachable: " + std::string(e.what()) + ")";
    }
    return out;
  }

  std::shared_ptr<TcpStore> store_;
  std::string prefix_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  RankNamer name_;
  std::atomic<std::uint64_t> entered_{0};
  std::uint64_t published_ = 0;  // heartbeat thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;
};

}  // namespace dtrain::detail
