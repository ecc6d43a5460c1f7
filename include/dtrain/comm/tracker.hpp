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
#include "dtrain/core/macros.hpp"

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
  DTRAIN_DECL ~CollectiveTracker();

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
  DTRAIN_DECL std::string describe(std::string_view what, std::uint64_t seq, std::string_view cause,
                                   bool with_laggards = true, std::span<const int> peers = {});

 private:
  std::string key(int r) const { return prefix_ + "seq/" + std::to_string(r); }

  DTRAIN_DECL void run();

  // "0, 4, 8", or the first eight and the count.
  DTRAIN_DECL std::string rank_list(std::span<const int> ranks) const;

  DTRAIN_DECL static std::string seconds(std::chrono::milliseconds t);

  // "; ranks that never reached it: ..." and/or "; ranks not heard from ...",
  // or why it cannot be told. Bounded by `probe_` per store exchange, over a
  // connection of its own (the heartbeat's may be stuck behind a dead link).
  DTRAIN_DECL std::string laggards(std::uint64_t seq, std::span<const int> peers);

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

#if DTRAIN_DEFINE_IMPL
#include "dtrain/comm/tracker.ipp"
#endif
