#pragma once
// Host collectives on Gloo over TCP, between processes on any machines: the
// blocking algorithms (GlooEngine) that HostCommunicator (backend/host/comm.hpp) runs
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

#include "dtrain/backend/host/device_tuning.hpp"
#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/tracker.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

namespace detail {

// Waiting first spins (yielding) for HostTuning::gloo_spin before sleeping
// on the condition variable.
template <class Ready>
bool spin_until(Ready&& ready) {
  const auto until = std::chrono::steady_clock::now() + HostTuning::gloo_spin;
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

  DTRAIN_DECL void finish(std::exception_ptr e);
};

// Gloo's rendezvous talks to our TCP store under the communicator's prefix.
class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<TcpStore> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}
  DTRAIN_DECL void set(const std::string& key, const std::vector<char>& data) override;
  DTRAIN_DECL std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_->timeout()); }
  DTRAIN_DECL void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<TcpStore> store_;
  std::string prefix_;
};

// acc += x, element by element: the reduce-scatter's sum. Inline here, at
// the build's optimisation level (a loop to vectorise), not in the .ipp.
inline void add_into(float* acc, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
}

// Slot prefix for dtrain's own ring algorithms; Gloo's built-in ones use low values.
constexpr std::uint8_t ring_slot_prefix = 0x7d;
// The slots of the token handshake every Gloo connection starts with
// (GlooEngine::authenticate): nonces, then proofs.
constexpr std::uint8_t auth_slot_prefix = 0x7e;

}  // namespace detail

// Completion handle of a host collective. wait() blocks until the collective
// finished and rethrows its error (comm_error, timeout_error).
class HostWork {
 public:
  HostWork() = default;
  explicit HostWork(std::shared_ptr<detail::GlooWorkState> s) : state_(std::move(s)) {}

  DTRAIN_DECL void wait() const;
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
  DTRAIN_DECL GlooEngine(World& world, const std::string& prefix);

  int rank() const { return rank_; }
  int size() const { return size_; }

  DTRAIN_DECL void all_reduce(float* data, std::size_t n, std::uint32_t tag);

  // Ring reduce-scatter of W chunks of c floats: after W-1 steps chunk r on
  // rank r holds the sum over ranks. At step s rank r forwards its running
  // sum of chunk (r-s-1) to the right and adds the left neighbour's running
  // sum of chunk (r-s-2) into its own.
  DTRAIN_DECL void reduce_scatter(float* acc, std::size_t c, std::uint32_t tag);

  // out: size() blocks of `bytes`; in: this rank's block, or null when it
  // already sits in its place in out.
  DTRAIN_DECL void all_gather(const void* in, void* out, std::size_t bytes, std::uint32_t tag);

  DTRAIN_DECL void broadcast(void* data, std::size_t bytes, int root, std::uint32_t tag);

  DTRAIN_DECL void barrier(std::uint32_t tag);

 private:
  DTRAIN_DECL void connect(World& world, const std::string& prefix);

  // Before any collective, each pair of ranks proves the job token to each
  // other over its Gloo connection (comm/auth.hpp): a stranger that took a
  // rank's place on a connection (Gloo's listeners accept any TCP client)
  // is found here, before a byte of the job crosses it.
  DTRAIN_DECL void authenticate(const World& world);

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::Context> context_;
  std::vector<float> incoming_;  // the ring's receive chunk; grows, never shrinks
};

}  // namespace detail

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/host/comm_gloo.ipp"
#endif
