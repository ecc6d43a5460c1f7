#pragma once
// Host collectives on Gloo over TCP, between processes on any machines: the
// blocking algorithms (GlooEngine) that HostCommunicator (comm/host.hpp) runs
// on its progress thread, across nodes or wherever shared memory cannot
// reach, and the completion handle every host collective returns.
//
// bf16/fp16 are reduced in fp32: the communicator widens the inputs, Gloo
// reduces, and the result is rounded once at the end, so the sum of many
// half-precision gradients does not lose bits at every hop of the ring.

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/tracker.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain {

namespace detail {

// Waiting first spins (yielding) for a short while before sleeping on the
// condition variable: a futex sleep/wake round trip on a busy machine can cost
// a scheduler tick (measured under load: a 1 MiB broadcast took ~4 ms through
// a sleeping hand-off, ~0.2 ms with a 200 us spin). A long spin steals the
// core from a rank still computing when ranks share few cores, so it is kept
// short (50 us: no measurable cost to a 2-rank step on 2 cores).
constexpr auto spin_before_sleep = std::chrono::microseconds(50);

template <class Ready>
bool spin_until(Ready&& ready) {
  const auto until = std::chrono::steady_clock::now() + spin_before_sleep;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

struct GlooWorkState {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  std::exception_ptr error;  // written before `done` is set

  void finish(std::exception_ptr e) {
    {
      std::lock_guard lock(mu);
      error = std::move(e);
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
};

// Gloo's rendezvous talks to our TCP store under the communicator's prefix.
class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<TcpStore> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_->get(prefix_ + key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_->timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& k : keys) store_->get(prefix_ + k, timeout);
  }

 private:
  std::shared_ptr<TcpStore> store_;
  std::string prefix_;
};

inline void add_into(float* acc, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
}

// Slot prefix for dtrain's own ring algorithms; Gloo's built-in ones use low values.
constexpr std::uint8_t ring_slot_prefix = 0x7d;

}  // namespace detail

namespace detail {
// Nanoseconds the calling thread (a rank's training thread) has spent
// blocked in HostWork::wait: the time it waited for its peers and the
// network (dtrain::fit's straggler report reads it).
inline thread_local std::uint64_t collective_wait_ns = 0;
}  // namespace detail

// The calling thread's time blocked waiting for host collectives, in ns.
inline std::uint64_t collective_wait_ns() { return detail::collective_wait_ns; }

// Completion handle of a host collective. wait() blocks until the collective
// finished and rethrows its error (comm_error, timeout_error).
class HostWork {
 public:
  HostWork() = default;
  explicit HostWork(std::shared_ptr<detail::GlooWorkState> s) : state_(std::move(s)) {}

  void wait() const {
    if (!state_) return;
    const auto finished = [&] { return state_->done.load(std::memory_order_acquire); };
    if (finished()) {
      if (state_->error) std::rethrow_exception(state_->error);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    if (!detail::spin_until(finished)) {
      std::unique_lock lock(state_->mu);
      state_->cv.wait(lock, finished);
    }
    detail::collective_wait_ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
    if (state_->error) std::rethrow_exception(state_->error);
  }
  bool done() const { return !state_ || state_->done.load(std::memory_order_acquire); }

 private:
  std::shared_ptr<detail::GlooWorkState> state_;
};
using GlooWork = HostWork;

namespace detail {

// Gloo's blocking collectives over the ranks of one World, on fp32 (sums)
// or raw bytes (gathers, broadcasts). Errors are ::gloo::Exception.
class GlooEngine {
 public:
  GlooEngine(World& world, const std::string& prefix)
      : rank_(world.rank()), size_(world.size()), timeout_(world.options().timeout) {
    if (size_ > 1) connect(world, prefix);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  void all_reduce(float* data, std::size_t n, std::uint32_t tag) {
    if (size_ == 1 || n == 0) return;
    ::gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    opts.setReduceFunction([](void* c, const void* a, const void* b, std::size_t k) {
      auto* out = static_cast<float*>(c);
      const auto* x = static_cast<const float*>(a);
      const auto* y = static_cast<const float*>(b);
      for (std::size_t i = 0; i < k; ++i) out[i] = x[i] + y[i];
    });
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    ::gloo::allreduce(opts);
  }

  // Ring reduce-scatter of W chunks of c floats: after W-1 steps chunk r on
  // rank r holds the sum over ranks. At step s rank r forwards its running
  // sum of chunk (r-s-1) to the right and adds the left neighbour's running
  // sum of chunk (r-s-2) into its own.
  void reduce_scatter(float* acc, std::size_t c, std::uint32_t tag) {
    if (size_ == 1 || c == 0) return;
    const int w = size_;
    const std::size_t bytes = c * sizeof(float);
    if (incoming_.size() < c) incoming_.resize(c);
    float* incoming = incoming_.data();
    auto send_buf = context_->createUnboundBuffer(acc, bytes * static_cast<std::size_t>(w));
    auto recv_buf = context_->createUnboundBuffer(incoming, bytes);
    const std::uint64_t slot = ::gloo::Slot::build(ring_slot_prefix, tag);
    const int right = (rank_ + 1) % w;
    const int left = (rank_ - 1 + w) % w;
    for (int s = 0; s < w - 1; ++s) {
      const auto send_idx = static_cast<std::size_t>((rank_ - s - 1 + 2 * w) % w);
      const auto recv_idx = static_cast<std::size_t>((rank_ - s - 2 + 2 * w) % w);
      send_buf->send(right, slot, send_idx * bytes, bytes);
      recv_buf->recv(left, slot, 0, bytes);
      recv_buf->waitRecv(timeout_);
      add_into(acc + recv_idx * c, incoming, c);
      send_buf->waitSend(timeout_);
    }
  }

  // out: size() blocks of `bytes`; in: this rank's block, or null when it
  // already sits in its place in out.
  void all_gather(const void* in, void* out, std::size_t bytes, std::uint32_t tag) {
    auto* o = static_cast<std::uint8_t*>(out);
    if (bytes == 0) return;
    if (size_ == 1) {
      if (in) std::memmove(o, in, bytes);
      return;
    }
    ::gloo::AllgatherOptions opts(context_);
    if (in) opts.setInput(static_cast<std::uint8_t*>(const_cast<void*>(in)), bytes);
    opts.setOutput(o, bytes * static_cast<std::size_t>(size_));
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    ::gloo::allgather(opts);
  }

  void broadcast(void* data, std::size_t bytes, int root, std::uint32_t tag) {
    if (bytes == 0 || size_ == 1) return;
    ::gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<std::uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    ::gloo::broadcast(opts);
  }

  void barrier(std::uint32_t tag) {
    if (size_ == 1) return;
    ::gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    ::gloo::barrier(opts);
  }

 private:
  void connect(World& world, const std::string& prefix) {
    // Gloo writes to its sockets without MSG_NOSIGNAL: a peer that dies while
    // this rank sends would kill it with SIGPIPE instead of failing the
    // collective with a message naming the lost connection. Ignored unless
    // the program set its own handler (PyTorch's processes ignore it too).
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
    // Gloo listens on the interface this rank reaches the master through,
    // unless GLOO_SOCKET_IFNAME names one (as in PyTorch).
    ::gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface)
      attr.iface = iface;
    else
      attr.hostname = world.store()->local_address();
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
    ctx->setTimeout(timeout_);
    GlooStoreAdapter store(world.store(), prefix + "mesh/");
    try {
      ctx->connectFullMesh(store, device);
    } catch (const timeout_error& e) {
      throw timeout_error("rank " + std::to_string(world.global_rank()) +
                              " could not connect its Gloo communicator: " + e.problem(),
                          "some rank never created its communicator (crashed earlier, or runs a "
                          "different program); check every rank's log");
    } catch (const ::gloo::Exception& e) {
      throw gloo_error(std::string("Gloo could not connect rank ") + std::to_string(world.global_rank()) + ": " +
                           e.what(),
                       "check that ranks can reach each other over TCP (firewall, GLOO_SOCKET_IFNAME)");
    }
    context_ = std::move(ctx);
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::Context> context_;
  std::vector<float> incoming_;  // the ring's receive chunk; grows, never shrinks
};

}  // namespace detail

}  // namespace dtrain
