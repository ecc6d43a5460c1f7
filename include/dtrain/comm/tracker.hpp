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
#include <span>
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
  // `peers`: the ranks this one was exchanging with over TCP in the
  // collective, named when the store cannot tell which of them lagged (this
  // rank is cut off from rank 0's node): they are the ones it lost.
  std::string describe(std::string_view what, std::uint64_t seq, std::string_view cause, bool with_laggards = true,
                       std::span<const int> peers = {}) {
    std::string msg = std::string(what) + " (collective #" + std::to_string(seq) + " on rank " +
                      name_(rank_) + " of " + std::to_string(size_) + ") did not complete: " +
                      std::string(cause);
    if (with_laggards) msg += laggards(seq, peers);
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

  // "0, 4, 8", or the first eight and the count.
  std::string rank_list(std::span<const int> ranks) const {
    constexpr std::size_t shown = 8;
    std::string out;
    for (std::size_t i = 0; i < std::min(ranks.size(), shown); ++i) out += (i ? ", " : "") + name_(ranks[i]);
    if (ranks.size() > shown) out += ", ... (" + std::to_string(ranks.size()) + " ranks)";
    return out;
  }

  static std::string seconds(std::chrono::milliseconds t) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(t.count()) / 1000.0);
    return text;
  }

  // "; ranks that never reached it: ..." and/or "; ranks not heard from ...",
  // or why it cannot be told. Bounded by `probe_` per store exchange, over a
  // connection of its own (the heartbeat's may be stuck behind a dead link).
  std::string laggards(std::uint64_t seq, std::span<const int> peers) {
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
      std::string out = "; which ranks did not arrive is unknown: the rendezvous store at " + store_->host() + ":" +
                        std::to_string(store_->port()) + " did not answer within " + seconds(probe_) +
                        " (this rank has lost its network connection to rank 0's node, or rank 0 has exited)";
      if (!peers.empty()) out += "; the ranks it was exchanging with over Gloo (TCP): " + rank_list(peers);
      return out;
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
