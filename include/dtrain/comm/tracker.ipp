// The definitions tracker.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/comm/tracker.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::detail {
  DTRAIN_DECL CollectiveTracker::~CollectiveTracker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  DTRAIN_DECL auto CollectiveTracker::describe(std::string_view what, std::uint64_t seq, std::string_view cause,
                                               bool with_laggards, std::span<const int> peers)
      ->std::string {
    std::string msg = std::string(what) + " (collective #" + std::to_string(seq) + " on rank " + name_(rank_) + " of " +
                      std::to_string(size_) + ") did not complete: " + std::string(cause);
    if (with_laggards) msg += laggards(seq, peers);
    return msg;
  }

  DTRAIN_DECL auto CollectiveTracker::run()->void {
    std::unique_ptr<TcpStore> beat;  // reconnected after a failure
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      try {
        if (!beat) beat = std::make_unique<TcpStore>(store_->host(), store_->port(), probe_, store_->token());
        beat->set(key(rank_), std::to_string(entered_.load()));
      } catch (const std::exception&) {
        beat.reset();  // the store is unreachable for now: the collective's own timeout reports the failure
      }
      lock.lock();
      cv_.wait_for(lock, interval_, [this] { return stop_; });
    }
  }

  DTRAIN_DECL auto CollectiveTracker::rank_list(std::span<const int> ranks) const->std::string {
    constexpr std::size_t shown = 8;
    std::string out;
    for (std::size_t i = 0; i < std::min(ranks.size(), shown); ++i) out += (i ? ", " : "") + name_(ranks[i]);
    if (ranks.size() > shown) out += ", ... (" + std::to_string(ranks.size()) + " ranks)";
    return out;
  }

  DTRAIN_DECL auto CollectiveTracker::seconds(std::chrono::milliseconds t)->std::string {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(t.count()) / 1000.0);
    return text;
  }

  DTRAIN_DECL auto CollectiveTracker::laggards(std::uint64_t seq, std::span<const int> peers)->std::string {
    if (!store_ || size_ == 1) return {};
    std::string behind, silent;
    try {
      TcpStore store(store_->host(), store_->port(), probe_, store_->token());
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
    if (out.empty())
      out =
          "; every rank reached it and is alive: its data did not get through (a network failure "
          "between ranks?)";
    return out;
  }
}  // namespace dtrain::detail
DTRAIN_IMPL_END
