#pragma once
// Sequence numbers for collectives, published to the rendezvous store so that
// a rank whose collective times out can say which ranks never reached it, and
// which ones it has stopped hearing from (a cut link, a dead node).
//
// Publishing every collective synchronously would put a store round trip on
// the hot path; instead the caller only bumps an atomic and a heartbeat thread
// publishes it every `interval` (an eighth of the timeout, at most a second),
// changed or not, over a connection of its own with a short timeout. The
// store stamps each write, so a rank whose last write is old is silent, not
// behind: a rank that arrived has published long before anyone times out.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
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
        name_(name ? std::move(name) : RankNamer([](int r) { return std::to_string(r); })),
        interval_(std::clamp(timeout / 8, std::chrono::milliseconds(10), std::chrono::milliseconds(1000))),
        probe_(std::clamp(timeout / 4, std::chrono::milliseconds(250), std::chrono::milliseconds(2000))),
        silent_after_(std::max(3 * interval_, std::chrono::milliseconds(2000)) + probe_) {
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
  // `cause`. `laggards`: add which ranks never reached it and which ones went
  // silent, as their heartbeats last told the store (right for timeouts; a
  // failure detected within milliseconds would see stale numbers, so it
  // leaves them out).
  std::string describe(std::string_view what, std::uint64_t seq, std::string_view cause, bool with_laggards = true) {
    std::string msg = std::string(what) + " (collective #" + std::to_string(seq) + " on rank " +
                      name_(rank_) + " of " + std::to_string(size_) + ") did not complete: " +
                      std::string(cause);
    if (with_laggards) msg += laggards(seq);
    return msg;
  }

 private:
  std::string key(int r) const { return prefix_ + "seq/" + std::to_string(r); }

  void run() {
    std::unique_ptr<TcpStore> beat;  // reconnected after a failure
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      try {
        if (!beat) beat = std::make_unique<TcpStore>(store_->host(), store_->port(), probe_);
        beat->set(key(rank_), std::to_string(entered_.load()));
      } catch (const std::exception&) {
        beat.reset();  // the store is unreachable for now: the collective's own timeout reports the failure
      }
      lock.lock();
      cv_.wait_for(lock, interval_, [this] { return stop_; });
    }
  }

  static std::string seconds(std::chrono::milliseconds t) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(t.count()) / 1000.0);
    return text;
  }

  // "; ranks that never reached it: ..." and/or "; ranks not heard from ...",
  // or why it cannot be told. Bounded by `probe_` per store exchange, over a
  // connection of its own (the heartbeat's may be stuck behind a dead link).
  std::string laggards(std::uint64_t seq) {
    if (!store_ || size_ == 1) return {};
    std::string behind, silent;
    try {
      TcpStore store(store_->host(), store_->port(), probe_);
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        const auto v = store.try_get_aged(key(r));
        const std::uint64_t reached = v ? std::stoull(v->value) : 0;
        if (v && v->age > silent_after_) {
          silent += (silent.empty() ? "" : ", ") + name_(r) + " (last heard " + seconds(v->age) + " ago, at #" +
                    std::to_string(reached) + ")";
        } else if (reached < seq) {
          behind += (behind.empty() ? "" : ", ") + name_(r) + " (at #" + std::to_string(reached) + ")";
        }
      }
    } catch (const std::exception&) {
      return "; which ranks did not arrive is unknown: the rendezvous store at " + store_->host() + ":" +
             std::to_string(store_->port()) + " did not answer within " + seconds(probe_) +
             " (this rank has lost its network connection to rank 0's node, or rank 0 has exited)";
    }
    std::string out;
    if (!behind.empty()) out += "; ranks that never reached it: " + behind;
    if (!silent.empty())
      out += "; ranks not heard from since: " + silent + " (their node is down or the network to it failed)";
    if (out.empty()) out = "; every rank reached it and is alive: its data did not get through (a network failure "
                           "between ranks?)";
    return out;
  }

  std::shared_ptr<TcpStore> store_;
  std::string prefix_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  RankNamer name_;
  std::chrono::milliseconds interval_;      // between heartbeats
  std::chrono::milliseconds probe_;         // bound on one store exchange of the tracker
  std::chrono::milliseconds silent_after_;  // a heartbeat older than this: the rank is silent
  std::atomic<std::uint64_t> entered_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread heartbeat_;
};

}  // namespace dtrain::detail
