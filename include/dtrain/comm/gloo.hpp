#pragma once
// Host collectives on Gloo over TCP: CPU ranks in one process (threads),
// across processes, and across machines.
//
// Gloo's algorithms are blocking, so each communicator owns one progress
// thread that runs collectives in the order they were issued; the caller gets
// a GlooWork to wait on and can keep computing meanwhile (DDP overlaps the
// gradient all-reduce with backward this way). Issue order must be the same
// on every rank, as with any collective library.
//
// bf16/fp16 are reduced in fp32: inputs are widened, reduced, and rounded
// once at the end, so the sum of many half-precision gradients does not lose
// bits at every hop of the ring.

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
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

// Completion handle of a host collective. wait() blocks until the collective
// finished and rethrows its error (comm_error, timeout_error).
class GlooWork {
 public:
  GlooWork() = default;
  explicit GlooWork(std::shared_ptr<detail::GlooWorkState> s) : state_(std::move(s)) {}

  void wait() const {
    if (!state_) return;
    const auto finished = [&] { return state_->done.load(std::memory_order_acquire); };
    if (!detail::spin_until(finished)) {
      std::unique_lock lock(state_->mu);
      state_->cv.wait(lock, finished);
    }
    if (state_->error) std::rethrow_exception(state_->error);
  }
  bool done() const { return !state_ || state_->done.load(std::memory_order_acquire); }

 private:
  std::shared_ptr<detail::GlooWorkState> state_;
};

class GlooCommunicator {
 public:
  // Collective over all ranks of `world`: every rank must construct it, in the
  // same order relative to its other communicators.
  explicit GlooCommunicator(World& world)
      : rank_(world.rank()), size_(world.size()), timeout_(world.options().timeout) {
    const std::string prefix = world.next_prefix("gloo");
    tracker_ = std::make_unique<detail::CollectiveTracker>(world.store(), prefix, rank_, size_, timeout_,
                                                           world.rank_namer());
    if (size_ > 1) connect(world, prefix);
    worker_ = std::thread([this] { run(); });
  }
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;
  ~GlooCommunicator() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  template <Dtype T>
  GlooWork all_reduce(std::span<T> buf, reduce_op op) {
    return submit("all_reduce", [this, buf, op](std::uint32_t tag) {
      if (buf.empty()) return;
      float* data = widen(buf);
      if (size_ > 1) {
        ::gloo::AllreduceOptions opts(context_);
        opts.setOutput(data, buf.size());
        opts.setReduceFunction([](void* c, const void* a, const void* b, std::size_t n) {
          auto* out = static_cast<float*>(c);
          const auto* x = static_cast<const float*>(a);
          const auto* y = static_cast<const float*>(b);
          for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
        });
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        ::gloo::allreduce(opts);
      }
      if (op == reduce_op::avg)
        for (std::size_t i = 0; i < buf.size(); ++i) data[i] /= static_cast<float>(size_);
      narrow(buf);
    });
  }

  template <Dtype T>
  GlooWork reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    check_sizes("reduce_scatter", "input", in.size(), "output", out.size());
    return submit("reduce_scatter", [this, in, out, op](std::uint32_t tag) {
      const std::size_t c = out.size();
      if (c == 0) return;
      std::vector<float>& acc = grow(wide_, in.size());
      for (std::size_t i = 0; i < in.size(); ++i) acc[i] = static_cast<float>(in[i]);
      if (size_ > 1) ring_reduce_scatter(acc.data(), c, tag);
      const float* mine = acc.data() + static_cast<std::size_t>(rank_) * c;
      const float scale = op == reduce_op::avg ? 1.f / static_cast<float>(size_) : 1.f;
      for (std::size_t i = 0; i < c; ++i) out[i] = dtype_cast<T>(mine[i] * scale);
    });
  }

  template <Dtype T>
  GlooWork all_gather(std::span<const T> in, std::span<T> out) {
    check_sizes("all_gather", "output", out.size(), "input", in.size());
    return submit("all_gather", [this, in, out](std::uint32_t tag) {
      if (in.empty()) return;
      if (size_ == 1) {
        std::memmove(out.data(), in.data(), in.size_bytes());
        return;
      }
      ::gloo::AllgatherOptions opts(context_);
      // In place (FSDP writes its shard into its own slot of the gathered
      // buffer): Gloo then takes this rank's part from the output.
      if (in.data() != out.data() + static_cast<std::size_t>(rank_) * in.size())
        opts.setInput(reinterpret_cast<std::uint8_t*>(const_cast<T*>(in.data())), in.size_bytes());
      opts.setOutput(reinterpret_cast<std::uint8_t*>(out.data()), out.size_bytes());
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::allgather(opts);
    });
  }

  template <Dtype T>
  GlooWork broadcast(std::span<T> buf, int root) {
    if (root < 0 || root >= size_)
      throw config_error("broadcast root " + std::to_string(root) + " is not a rank of this world of " +
                             std::to_string(size_),
                         "pass a root in [0, world size)");
    return submit("broadcast", [this, buf, root](std::uint32_t tag) {
      if (buf.empty() || size_ == 1) return;
      ::gloo::BroadcastOptions opts(context_);
      opts.setOutput(reinterpret_cast<std::uint8_t*>(buf.data()), buf.size_bytes());
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::broadcast(opts);
    });
  }

  GlooWork barrier() {
    return submit("barrier", [this](std::uint32_t tag) {
      if (size_ == 1) return;
      ::gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::barrier(opts);
    });
  }

 private:
  struct Task {
    std::function<void(std::uint32_t)> run;
    std::shared_ptr<detail::GlooWorkState> state;
    const char* name;
    std::uint64_t seq;
  };

  void connect(World& world, const std::string& prefix) {
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
    detail::GlooStoreAdapter store(world.store(), prefix + "mesh/");
    try {
      ctx->connectFullMesh(store, device);
    } catch (const timeout_error& e) {
      throw timeout_error("rank " + std::to_string(rank_) + " could not connect its Gloo communicator: " +
                              e.problem(),
                          "some rank never created its communicator (crashed earlier, or runs a "
                          "different program); check every rank's log");
    } catch (const ::gloo::Exception& e) {
      throw gloo_error(std::string("Gloo could not connect rank ") + std::to_string(rank_) + ": " + e.what(),
                       "check that ranks can reach each other over TCP (firewall, GLOO_SOCKET_IFNAME)");
    }
    context_ = std::move(ctx);
  }

  void check_sizes(const char* what, const char* big_name, std::size_t big, const char* small_name,
                   std::size_t small_n) const {
    if (big != small_n * static_cast<std::size_t>(size_))
      throw config_error(std::string(what) + ": " + big_name + " has " + std::to_string(big) + " elements but " +
                             small_name + " has " + std::to_string(small_n) + " and the world has " +
                             std::to_string(size_) + " ranks",
                         std::string(big_name) + " must hold exactly world size x " + small_name + " elements");
  }

  // Scratch lives as long as the communicator and only grows: a training
  // step issues the same collectives every time, and fresh allocations of
  // gradient-sized buffers cost page faults on every call.
  static std::vector<float>& grow(std::vector<float>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v;
  }
  template <class T>
  float* widen(std::span<T> buf) {
    if constexpr (std::is_same_v<T, float>) {
      return buf.data();
    } else {
      float* wide = grow(wide_, buf.size()).data();
      for (std::size_t i = 0; i < buf.size(); ++i) wide[i] = static_cast<float>(buf[i]);
      return wide;
    }
  }
  template <class T>
  void narrow(std::span<T> buf) {
    if constexpr (!std::is_same_v<T, float>)
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = T(wide_[i]);
  }

  // Ring reduce-scatter of W chunks of c floats: after W-1 steps chunk r on
  // rank r holds the sum over ranks. At step s rank r forwards its running
  // sum of chunk (r-s-1) to the right and adds the left neighbour's running
  // sum of chunk (r-s-2) into its own.
  void ring_reduce_scatter(float* acc, std::size_t c, std::uint32_t tag) {
    const int w = size_;
    const std::size_t bytes = c * sizeof(float);
    float* incoming = grow(incoming_, c).data();
    auto send_buf = context_->createUnboundBuffer(acc, bytes * static_cast<std::size_t>(w));
    auto recv_buf = context_->createUnboundBuffer(incoming, bytes);
    const std::uint64_t slot = ::gloo::Slot::build(detail::ring_slot_prefix, tag);
    const int right = (rank_ + 1) % w;
    const int left = (rank_ - 1 + w) % w;
    for (int s = 0; s < w - 1; ++s) {
      const auto send_idx = static_cast<std::size_t>((rank_ - s - 1 + 2 * w) % w);
      const auto recv_idx = static_cast<std::size_t>((rank_ - s - 2 + 2 * w) % w);
      send_buf->send(right, slot, send_idx * bytes, bytes);
      recv_buf->recv(left, slot, 0, bytes);
      recv_buf->waitRecv(timeout_);
      detail::add_into(acc + recv_idx * c, incoming, c);
      send_buf->waitSend(timeout_);
    }
  }

  GlooWork submit(const char* name, std::function<void(std::uint32_t)> fn) {
    auto state = std::make_shared<detail::GlooWorkState>();
    const std::uint64_t seq = tracker_->enter();
    {
      std::lock_guard lock(mu_);
      queue_.push_back({std::move(fn), state, name, seq});
      queued_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    return GlooWork(state);
  }

  void run() {
    for (;;) {
      Task task;
      detail::spin_until([&] { return queued_.load(std::memory_order_acquire) > 0; });
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop requested and nothing left to run
        task = std::move(queue_.front());
        queue_.pop_front();
        queued_.fetch_sub(1, std::memory_order_relaxed);
      }
      task.state->finish(execute(task));
    }
  }

  std::exception_ptr execute(const Task& task) {
    if (broken_) return broken_;
    try {
      task.run(static_cast<std::uint32_t>(task.seq));
      return nullptr;
    } catch (const ::gloo::Exception& e) {
      const std::string cause = e.what();
      const std::string msg = tracker_->describe(task.name, task.seq, cause);
      const char* fix =
          "a rank is stuck, crashed or runs different code; see the other ranks' logs. "
          "The timeout is CommOptions::timeout (env DTRAIN_COMM_TIMEOUT_S)";
      if (cause.find("imed out") != std::string::npos)
        broken_ = std::make_exception_ptr(timeout_error(msg, fix));
      else
        broken_ = std::make_exception_ptr(gloo_error(msg, fix));
      return broken_;
    } catch (...) {
      return std::current_exception();
    }
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<::gloo::Context> context_;
  std::unique_ptr<detail::CollectiveTracker> tracker_;
  std::exception_ptr broken_;  // worker thread only: the first failure poisons the communicator
  std::vector<float> wide_;      // worker thread only: fp32 staging of half inputs, reduce-scatter sums
  std::vector<float> incoming_;  // worker thread only: the ring's receive chunk
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::atomic<std::size_t> queued_{0};
  bool stop_ = false;
  std::thread worker_;
};

static_assert(Communicator<GlooCommunicator>);

}  // namespace dtrain
