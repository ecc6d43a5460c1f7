#pragma once
// The NCCL backend of the Communicator concept: collectives on device buffers,
// enqueued on a CUDA stream, returning an NcclWork that orders other streams
// after them. Host API only (compiles with g++ against cudart and NCCL).
//
//   NcclCommunicator  owning, move-only; one per rank (= one GPU)
//   NcclRef           non-owning view with the same collective API
//   NcclGroup         RAII ncclGroupStart/ncclGroupEnd
//   nccl_dtype_v<T>, nccl_op(op)   compile-time dtype and reduction maps
//
// Hangs become errors. Communicators run in NCCL's non-blocking mode, so no
// NCCL call (initialisation and lazy connection setup included) can block the
// caller past CommOptions::timeout. A watchdog thread per communicator polls
// the events of outstanding collectives and NCCL's asynchronous error; a
// collective older than the timeout, or an asynchronous error, aborts the
// communicator (ncclCommAbort makes NCCL's kernels on every stream give up)
// and marks it broken: every later call and every wait() then throws the
// diagnosis, which names the collective, its sequence number and the ranks
// that never reached it.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/tracker.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/backend/cuda/device.hpp"

namespace dtrain {

// ---- compile-time maps -------------------------------------------------------

template <class T>
struct nccl_dtype {
  static_assert(sizeof(T) == 0, "dtrain: NCCL collectives take fp32 (float), bf16 or fp16 elements");
};
template <>
struct nccl_dtype<float> {
  static constexpr ncclDataType_t value = ncclFloat32;
};
template <>
struct nccl_dtype<bf16> {
  static constexpr ncclDataType_t value = ncclBfloat16;
};
template <>
struct nccl_dtype<fp16> {
  static constexpr ncclDataType_t value = ncclFloat16;
};
template <class T>
inline constexpr ncclDataType_t nccl_dtype_v = nccl_dtype<std::remove_cv_t<T>>::value;

constexpr ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::avg: return ncclAvg;
  }
  return ncclSum;
}

namespace detail {

using nccl_clock = std::chrono::steady_clock;

inline constexpr const char* nccl_debug_hint =
    "rerun with NCCL_DEBUG=INFO (add NCCL_DEBUG_SUBSYS=INIT,NET for setup problems) to see NCCL's own "
    "diagnosis; dtrain-doctor checks this node's GPUs, driver and NCCL";

inline void nccl_log(std::string_view message) noexcept {
  std::fprintf(stderr, "dtrain: %.*s\n", static_cast<int>(message.size()), message.data());
}

inline std::string nccl_fix(ncclResult_t status) {
  const std::string debug = nccl_debug_hint;
  switch (status) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: an earlier kernel may have faulted (CUDA_LAUNCH_BLOCKING=1 "
             "locates it) or the device is unhealthy; " + debug;
    case ncclSystemError:
      return "a system call or socket failed: check the network interface (NCCL_SOCKET_IFNAME), firewalls "
             "between nodes, and /dev/shm size in containers (--shm-size); " + debug;
    case ncclRemoteError:
      return "a peer rank failed or exited: its log has the original error; " + debug;
    case ncclInvalidArgument:
      return "a buffer is not device memory of this communicator's GPU, or a count or root is out of range";
    case ncclInvalidUsage:
      return "ranks issued different collectives, or a call used a destroyed or aborted communicator; " + debug;
    default:
      return debug;
  }
}

inline nccl_error make_nccl_error(ncclResult_t status, std::string_view what, ncclComm_t comm,
                                  std::source_location where = std::source_location::current()) {
  std::string msg = std::string(what) + " failed: " + ncclGetErrorString(status);
  if (const char* last = ncclGetLastError(comm); last && *last) msg += " (" + std::string(last) + ")";
  return nccl_error(static_cast<int>(status), msg, nccl_fix(status), where);
}

inline void nccl_check(ncclResult_t status, std::string_view what,
                       std::source_location where = std::source_location::current()) {
  if (status != ncclSuccess) throw make_nccl_error(status, what, nullptr, where);
}

// A call NCCL refused to enqueue: the communicator stays usable.
constexpr bool nccl_argument_error(ncclResult_t status) {
  return status == ncclInvalidArgument || status == ncclInvalidUsage;
}

// Makes `device` current for a scope: streams, events and NCCL calls of one
// communicator must be created and used on its own GPU, whatever device the
// calling thread had selected.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) : device_(device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_) cuda_check(cudaSetDevice(device_), "cudaSetDevice");
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  ~CurrentDevice() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }

 private:
  int device_;
  int previous_ = 0;
};

struct StreamDeleter {
  void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
};
struct EventDeleter {
  void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
};
struct DeviceFree {
  void operator()(void* p) const noexcept { cudaFree(p); }
};
using unique_stream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
using unique_event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;

// One issued collective: the event recorded after it, and when that happened.
struct NcclOp {
  explicit NcclOp(std::string_view name) : what(name) {
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    event.reset(e);
  }
  std::string_view what;  // always a string literal
  std::uint64_t seq = 0;
  unique_event event;
  nccl_clock::time_point issued{};
  std::atomic<bool> recorded{false};  // false while the NcclGroup that issued it is open
  // Set when the communicator was aborted before this collective completed.
  // Aborted kernels exit early, so the event completes anyway: this flag is
  // what tells a finished collective from an abandoned one.
  std::atomic<bool> failed{false};
};

class NcclCore;

// Collectives issued inside an open NcclGroup reach their streams only at
// ncclGroupEnd, so their events are recorded then. Groups are per thread in
// NCCL, hence thread_local here.
struct NcclPending {
  std::shared_ptr<NcclCore> core;
  std::shared_ptr<NcclOp> op;
  cudaStream_t stream;
};
struct NcclGroupState {
  int depth = 0;
  std::vector<NcclPending> pending;
};
inline NcclGroupState& nccl_group_state() {
  thread_local NcclGroupState state;
  return state;
}

// The shared state of one communicator. NcclWork handles keep it alive, so a
// work's stream and event outlive the NcclCommunicator that issued it.
class NcclCore : public std::enable_shared_from_this<NcclCore> {
 public:
  NcclCore(int rank, int size, int device, const ncclUniqueId& id, CommOptions options,
           std::shared_ptr<TcpStore> store, std::string prefix, CollectiveTracker::RankNamer namer)
      : rank_(rank),
        size_(size),
        device_(device),
        timeout_(options.timeout),
        tracker_(std::move(store), std::move(prefix), rank, size, options.timeout, std::move(namer)) {
    CurrentDevice on(device_);
    cudaStream_t s = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    own_stream_.reset(s);
    current_ = s;
    void* scratch = nullptr;
    cuda_check(cudaMalloc(&scratch, sizeof(float)), "cudaMalloc (barrier scratch)");
    scratch_.reset(scratch);
    cuda_check(cudaMemset(scratch, 0, sizeof(float)), "cudaMemset (barrier scratch)");
    init(id);
    watchdog_ = std::thread([this] { watch(); });
  }
  NcclCore(const NcclCore&) = delete;
  NcclCore& operator=(const NcclCore&) = delete;
  ~NcclCore() { close(); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return current_.load(); }
  void set_stream(cudaStream_t s) { current_.store(s); }
  float* scratch() const { return static_cast<float*>(scratch_.get()); }

  ncclComm_t native() {
    std::lock_guard lock(mu_);
    rethrow_if_broken_locked();
    return comm_;
  }

  void rethrow_if_broken() {
    if (!broken_.load()) return;
    std::lock_guard lock(mu_);
    rethrow_if_broken_locked();
  }

  // Enqueues `call(comm, stream)` as collective `what` (a string literal).
  template <class Call>
  std::shared_ptr<NcclOp> issue(std::string_view what, cudaStream_t stream, Call&& call) {
    CurrentDevice on(device_);
    auto op = std::make_shared<NcclOp>(what);
    {
      std::lock_guard lock(mu_);
      rethrow_if_broken_locked();
      op->seq = last_seq_ = tracker_.enter();
      const ncclResult_t status = await_locked(call(comm_, stream));
      if (nccl_argument_error(status)) throw make_nccl_error(status, what, comm_);
      if (status != ncclSuccess) {
        fail_status_locked(status, what, op->seq);
        rethrow_if_broken_locked();
      }
      if (auto& group = nccl_group_state(); group.depth > 0)
        group.pending.push_back({shared_from_this(), op, stream});
      else
        record_locked(op, stream);
    }
    cv_.notify_one();
    return op;
  }

  // Ends the outermost group of this thread: launches the grouped collectives
  // and records their events. Throws on failure, after recording what it can.
  static void end_group() {
    auto& group = nccl_group_state();
    --group.depth;
    if (group.depth > 0) {
      nccl_check(ncclGroupEnd(), "ncclGroupEnd");
      return;
    }
    const auto pending = std::exchange(group.pending, {});
    std::vector<NcclCore*> cores;
    for (const auto& p : pending) cores.push_back(p.core.get());
    std::sort(cores.begin(), cores.end());
    cores.erase(std::unique(cores.begin(), cores.end()), cores.end());
    // Address order: two threads ending groups over the same communicators
    // cannot deadlock; each watchdog only ever takes its own lock.
    std::vector<std::unique_lock<std::mutex>> locks;
    for (auto* c : cores) locks.emplace_back(c->mu_);
    // A group that failed on this rank leaves it out of step with its peers,
    // so any failure breaks every communicator in the group.
    const ncclResult_t status = ncclGroupEnd();
    std::exception_ptr first;
    for (auto* c : cores) {
      const ncclResult_t settled = c->await_locked(status);
      if (settled == ncclSuccess) continue;
      c->fail_status_locked(settled, "an NCCL group", c->last_seq_);
      if (!first) first = c->failure_;
    }
    if (!first && status != ncclSuccess && status != ncclInProgress)
      first = std::make_exception_ptr(make_nccl_error(status, "ncclGroupEnd", nullptr));
    for (const auto& p : pending) {
      if (p.core->broken_.load()) continue;
      CurrentDevice on(p.core->device_);
      p.core->record_locked(p.op, p.stream);
    }
    locks.clear();
    for (auto* c : cores) c->cv_.notify_one();
    if (first) std::rethrow_exception(first);
  }

  // Stops the watchdog and releases the NCCL communicator: ncclCommFinalize
  // flushes outstanding collectives (bounded by the timeout) before
  // ncclCommDestroy; a broken or stuck communicator is aborted instead.
  void close() noexcept {
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    std::lock_guard lock(mu_);
    if (!comm_) return;
    std::string why;
    try {
      CurrentDevice on(device_);
      ncclResult_t status = ncclCommFinalize(comm_);
      if (status == ncclInProgress || status == ncclSuccess) status = poll_settled(nccl_clock::now() + timeout_);
      if (status == ncclSuccess) {
        ncclCommDestroy(comm_);
        comm_ = nullptr;
        return;
      }
      why = status == ncclInProgress ? "they did not finish within " + std::to_string(timeout_.count()) + " ms"
                                     : std::string(ncclGetErrorString(status));
    } catch (const std::exception& e) {
      why = e.what();
    }
    // Works still held by the caller must not report the abandoned
    // collectives as complete.
    fail_locked(comm_error("the NCCL communicator of rank " + std::to_string(rank_) +
                               " was destroyed before its collectives finished: " + why,
                           "wait for (synchronize) outstanding collectives before destroying the communicator; " +
                               std::string(nccl_debug_hint)));
  }

 private:
  void init(const ncclUniqueId& id) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t status = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (status != ncclSuccess && status != ncclInProgress) {
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      throw make_nccl_error(status, "ncclCommInitRankConfig (rank " + std::to_string(rank_) + ")", nullptr);
    }
    const ncclResult_t settled = poll_settled(nccl_clock::now() + timeout_);
    if (settled == ncclSuccess) return;
    const std::string where = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " on GPU " +
                              std::to_string(device_);
    auto failure = settled == ncclInProgress
                       ? std::make_exception_ptr(timeout_error(
                             "NCCL initialisation of " + where + " did not finish within " +
                                 std::to_string(timeout_.count()) + " ms",
                             "every rank must construct its NcclCommunicator, in the same order relative to its "
                             "other communicators; a rank that crashed or never started keeps the others "
                             "waiting (see every rank's log); " +
                                 std::string(nccl_debug_hint)))
                       : std::make_exception_ptr(make_nccl_error(settled, "NCCL initialisation of " + where, comm_));
    ncclCommAbort(comm_);
    comm_ = nullptr;
    std::rethrow_exception(failure);
  }

  // Non-blocking NCCL: a call may return ncclInProgress and finish in the
  // background; the communicator's asynchronous state says when it is done.
  ncclResult_t poll_settled(nccl_clock::time_point deadline) noexcept {
    auto backoff = std::chrono::microseconds(1);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t status = ncclCommGetAsyncError(comm_, &state);
      if (status != ncclSuccess) return status;
      if (state != ncclInProgress) return state;
      if (nccl_clock::now() >= deadline) return ncclInProgress;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(10000));
    }
  }

  // The final status of a call: waits out ncclInProgress (ncclInProgress
  // again means the timeout passed).
  ncclResult_t await_locked(ncclResult_t status) noexcept {
    return status == ncclInProgress ? poll_settled(nccl_clock::now() + timeout_) : status;
  }

  void fail_status_locked(ncclResult_t status, std::string_view what, std::uint64_t seq) {
    if (status == ncclInProgress)
      fail_locked(timeout_error(tracker_.describe(what, seq, "NCCL did not finish setting it up within " +
                                                                 std::to_string(timeout_.count()) + " ms"),
                                timeout_fix()));
    else
      fail_locked(nccl_error(static_cast<int>(status),
                             tracker_.describe(what, seq, std::string("NCCL reported ") + ncclGetErrorString(status)),
                             nccl_fix(status)));
  }

  void record_locked(const std::shared_ptr<NcclOp>& op, cudaStream_t stream) {
    cuda_check(cudaEventRecord(op->event.get(), stream), "cudaEventRecord after a collective");
    op->issued = nccl_clock::now();
    op->recorded.store(true);
    outstanding_.push_back(op);
  }

  void rethrow_if_broken_locked() const {
    if (failure_) std::rethrow_exception(failure_);
    if (closed_) throw comm_error("a collective was issued on a destroyed NcclCommunicator");
  }

  static std::string timeout_fix() {
    return "a rank stopped issuing collectives, issued them in a different order, or crashed: look at the "
           "ranks named above and their logs; if the work is legitimately slow raise CommOptions::timeout "
           "(DTRAIN_COMM_TIMEOUT_S); " +
           std::string(nccl_debug_hint);
  }

  // Marks the communicator broken for good and aborts it, so NCCL's kernels
  // stop waiting for peers and the GPU is not left spinning.
  template <class Error>
  void fail_locked(const Error& err) noexcept {
    if (failure_) return;
    failure_ = std::make_exception_ptr(err);
    broken_.store(true);
    for (const auto& op : outstanding_)
      if (cudaEventQuery(op->event.get()) != cudaSuccess) op->failed.store(true);
    outstanding_.clear();
    nccl_log("aborting the NCCL communicator of rank " + std::to_string(rank_) + ": " + err.problem());
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  std::chrono::milliseconds poll_interval() const {
    return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(timeout_ / 20),
                      std::chrono::milliseconds(1), std::chrono::milliseconds(100));
  }

  void watch() {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    std::unique_lock lock(mu_);
    while (!closed_) {
      if (outstanding_.empty() || failure_) {
        cv_.wait(lock, [this] { return closed_ || (!outstanding_.empty() && !failure_); });
        continue;
      }
      poll_locked();
      cv_.wait_for(lock, poll_interval(), [this] { return closed_; });
    }
  }

  void poll_locked() {
    cudaError_t query = cudaSuccess;
    std::erase_if(outstanding_, [&](const std::shared_ptr<NcclOp>& op) {
      const cudaError_t s = cudaEventQuery(op->event.get());
      if (s != cudaSuccess && s != cudaErrorNotReady) query = s;
      return s == cudaSuccess;
    });
    if (query != cudaSuccess) {
      fail_locked(cuda_error(std::string("a collective's completion could not be queried: ") +
                                 cudaGetErrorName(query) + ": " + cudaGetErrorString(query),
                             "a kernel on this GPU faulted (rerun with CUDA_LAUNCH_BLOCKING=1 to find it)"));
      return;
    }
    if (outstanding_.empty()) return;
    const NcclOp& oldest = *outstanding_.front();
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
      fail_locked(nccl_error(static_cast<int>(state),
                             tracker_.describe(oldest.what, oldest.seq,
                                               std::string("NCCL reported ") + ncclGetErrorString(state)),
                             nccl_fix(state)));
      return;
    }
    const auto age = nccl_clock::now() - oldest.issued;
    if (age > timeout_)
      fail_locked(timeout_error(
          tracker_.describe(oldest.what, oldest.seq,
                            "not complete after " +
                                std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(age).count()) +
                                " ms (timeout " + std::to_string(timeout_.count()) + " ms)"),
          timeout_fix()));
  }

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  CollectiveTracker tracker_;
  unique_stream own_stream_;
  std::unique_ptr<void, DeviceFree> scratch_;
  std::atomic<cudaStream_t> current_{nullptr};
  std::mutex mu_;  // guards comm_ and everything below; held around every NCCL call on comm_
  std::condition_variable cv_;
  ncclComm_t comm_ = nullptr;
  std::uint64_t last_seq_ = 0;
  std::vector<std::shared_ptr<NcclOp>> outstanding_;  // in issue order
  std::exception_ptr failure_;
  std::atomic<bool> broken_{false};
  bool closed_ = false;
  std::thread watchdog_;
};

}  // namespace detail

// ---- work --------------------------------------------------------------------

// Completion of one collective. Default-constructed (and returned for length-0
// collectives): already complete.
class NcclWork {
 public:
  NcclWork() = default;
  NcclWork(std::shared_ptr<detail::NcclCore> core, std::shared_ptr<detail::NcclOp> op)
      : core_(std::move(core)), op_(std::move(op)) {}

  // Makes the communicator's current stream wait for the collective; does
  // not block the host.
  void wait() {
    if (core_) wait(core_->stream());
  }
  // Makes `stream` (on the communicator's GPU) wait for the collective.
  void wait(cudaStream_t stream) {
    if (!op_ || finished()) return;
    cuda_check(cudaStreamWaitEvent(stream, op_->event.get(), 0), "cudaStreamWaitEvent");
  }
  // Blocks the host until the collective completed.
  void synchronize() {
    auto backoff = std::chrono::microseconds(1);
    while (!done()) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(500));
    }
  }
  // Whether the collective completed; throws if it never will (its
  // communicator broke first).
  bool done() const { return !op_ || finished(); }

  // The collective's sequence number on this rank (0 for a no-op).
  std::uint64_t sequence() const { return op_ ? op_->seq : 0; }

 private:
  bool finished() const {
    if (!op_->recorded.load()) {
      core_->rethrow_if_broken();
      throw config_error("wait on a collective whose NcclGroup is still open",
                         "NCCL launches grouped collectives when the group ends: wait after the NcclGroup's "
                         "scope (or its end())");
    }
    // Query before reading `failed`: an event seen complete before the abort
    // marked the op belongs to a collective that really finished.
    const cudaError_t s = cudaEventQuery(op_->event.get());
    if (op_->failed.load() || s != cudaSuccess) core_->rethrow_if_broken();
    if (s == cudaSuccess) return true;
    if (s != cudaErrorNotReady) cuda_check(s, "cudaEventQuery on a collective");
    return false;
  }

  std::shared_ptr<detail::NcclCore> core_;
  std::shared_ptr<detail::NcclOp> op_;
};

// ---- group guard -------------------------------------------------------------

// Collectives issued by this thread between construction and end() launch
// together (fused, and across communicators of one thread without deadlock).
// Leaving the scope ends the group; if that happens during an exception (or
// ending fails in the destructor) the error is logged, not thrown.
class NcclGroup {
 public:
  NcclGroup() {
    detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
    ++detail::nccl_group_state().depth;
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() {
    if (ended_) return;
    try {
      end();
    } catch (const std::exception& e) {
      detail::nccl_log(std::string("ending an NCCL group while leaving its scope failed: ") + e.what());
    }
  }

  void end() {
    if (ended_) throw config_error("NcclGroup::end() called twice", "end a group once");
    ended_ = true;
    detail::NcclCore::end_group();
  }

 private:
  bool ended_ = false;
};

// ---- collectives -------------------------------------------------------------

namespace detail {

// The collective API shared by NcclCommunicator and NcclRef; `Self::core()`
// names the communicator state. Every collective has an overload taking the
// stream to run on; without it the communicator's current stream is used.
template <class Self>
class NcclCollectives {
 public:
  int rank() const { return core().rank(); }
  int size() const { return core().size(); }
  int device() const { return core().device(); }

  // The stream collectives run on unless given one, and that NcclWork::wait()
  // orders. Default: a non-blocking stream the communicator owns.
  cudaStream_t stream() const { return core().stream(); }
  void set_stream(cudaStream_t stream) { core().set_stream(stream); }

  // The raw NCCL communicator, for calls dtrain does not wrap.
  ncclComm_t native() const { return core().native(); }

  template <class T>
  NcclWork all_reduce(std::span<T> buf, reduce_op op) {
    return all_reduce(buf, op, stream());
  }
  template <class T>
  NcclWork all_reduce(std::span<T> buf, reduce_op op, cudaStream_t stream) {
    static_assert(!std::is_const_v<T>, "all_reduce works in place: pass a span of non-const elements");
    if (buf.empty()) return noop();
    return issue("all_reduce", stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(buf.data(), buf.data(), buf.size(), nccl_dtype_v<T>, nccl_op(op), c, s);
    });
  }

  template <class T>
  NcclWork broadcast(std::span<T> buf, int root) {
    return broadcast(buf, root, stream());
  }
  template <class T>
  NcclWork broadcast(std::span<T> buf, int root, cudaStream_t stream) {
    static_assert(!std::is_const_v<T>, "broadcast works in place: pass a span of non-const elements");
    if (root < 0 || root >= size())
      throw config_error("broadcast root " + std::to_string(root) + " is outside the world of " +
                             std::to_string(size()),
                         "pass a root rank in [0, size())");
    if (buf.empty()) return noop();
    return issue("broadcast", stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(buf.data(), buf.data(), buf.size(), nccl_dtype_v<T>, root, c, s);
    });
  }

  template <class T>
  NcclWork reduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, reduce_op op) {
    return reduce_scatter<T>(in, out, op, stream());
  }
  template <class T>
  NcclWork reduce_scatter(std::type_identity_t<std::span<const T>> in, std::span<T> out, reduce_op op,
                          cudaStream_t stream) {
    check_sizes("reduce_scatter", "input", in.size(), "output", out.size());
    if (out.empty()) return noop();
    return issue("reduce_scatter", stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in.data(), out.data(), out.size(), nccl_dtype_v<T>, nccl_op(op), c, s);
    });
  }

  template <class T>
  NcclWork all_gather(std::type_identity_t<std::span<const T>> in, std::span<T> out) {
    return all_gather<T>(in, out, stream());
  }
  template <class T>
  NcclWork all_gather(std::type_identity_t<std::span<const T>> in, std::span<T> out, cudaStream_t stream) {
    check_sizes("all_gather", "output", out.size(), "input", in.size());
    if (in.empty()) return noop();
    return issue("all_gather", stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(in.data(), out.data(), in.size(), nccl_dtype_v<T>, c, s);
    });
  }

  // A one-element all-reduce: completes on every rank only once all ranks
  // issued it. synchronize() on the work makes it a host barrier.
  NcclWork barrier() { return barrier(stream()); }
  NcclWork barrier(cudaStream_t stream) {
    float* flag = core().scratch();
    return issue("barrier", stream, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(flag, flag, 1, ncclFloat32, ncclSum, c, s);
    });
  }

 private:
  NcclCore& core() const { return static_cast<const Self&>(*this).core(); }

  NcclWork noop() const {
    core().rethrow_if_broken();
    return {};
  }

  template <class Call>
  NcclWork issue(std::string_view what, cudaStream_t stream, Call&& call) {
    NcclCore& c = core();
    auto op = c.issue(what, stream, std::forward<Call>(call));
    return NcclWork(c.shared_from_this(), std::move(op));
  }

  // The larger buffer must hold exactly size() copies of the smaller one.
  void check_sizes(std::string_view what, std::string_view big_name, std::size_t big, std::string_view small_name,
                   std::size_t small) const {
    if (big == small * static_cast<std::size_t>(size())) return;
    throw config_error(std::string(what) + ": the " + std::string(big_name) + " has " + std::to_string(big) +
                           " elements but the " + std::string(small_name) + " has " + std::to_string(small) +
                           ", and " + std::to_string(small) + " x world size " + std::to_string(size()) + " = " +
                           std::to_string(small * static_cast<std::size_t>(size())),
                       "the " + std::string(big_name) + " must hold exactly world size times the " +
                           std::string(small_name) + " elements");
  }
};

}  // namespace detail

// ---- communicators -----------------------------------------------------------

class NcclCommunicator;

// A non-owning view of an NcclCommunicator: cheap to copy, valid while the
// communicator lives.
class NcclRef : public detail::NcclCollectives<NcclRef> {
 public:
  explicit NcclRef(detail::NcclCore& core) : core_(&core) {}

 private:
  friend class detail::NcclCollectives<NcclRef>;
  detail::NcclCore& core() const { return *core_; }
  detail::NcclCore* core_;
};

// A fresh id for a new communicator; every rank must use the same one.
inline ncclUniqueId make_nccl_unique_id() {
  ncclUniqueId id;
  detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

// One rank's NCCL communicator, on one GPU. Owning and move-only; the
// destructor flushes outstanding collectives (or aborts a broken
// communicator) and never throws.
class NcclCommunicator : public detail::NcclCollectives<NcclCommunicator> {
 public:
  // Joins the world's ranks: rank 0 creates the NCCL id and shares it through
  // the rendezvous store; every rank must construct its communicators in the
  // same order.
  NcclCommunicator(World& world, int device) : NcclCommunicator(world, device, bootstrap(world)) {}

  // For ranks that are threads of one process sharing `id` (no store: a
  // timeout names the collective but not the missing ranks).
  NcclCommunicator(int rank, int size, const ncclUniqueId& id, int device, CommOptions options = {})
      : NcclCommunicator(rank, size, id, device, options, nullptr, {}, {}) {}

  NcclCommunicator(NcclCommunicator&&) noexcept = default;
  NcclCommunicator& operator=(NcclCommunicator&& other) noexcept {
    if (this != &other) {
      release();
      core_ = std::move(other.core_);
    }
    return *this;
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() { release(); }

  NcclRef ref() const { return NcclRef(core()); }
  operator NcclRef() const { return ref(); }

 private:
  friend class detail::NcclCollectives<NcclCommunicator>;

  struct Bootstrap {
    ncclUniqueId id;
    std::string prefix;  // this communicator's keys in the rendezvous store
  };

  NcclCommunicator(World& world, int device, Bootstrap boot)
      : NcclCommunicator(world.rank(), world.size(), boot.id, device, world.options(), world.store(),
                         std::move(boot.prefix), world.rank_namer()) {}

  NcclCommunicator(int rank, int size, const ncclUniqueId& id, int device, const CommOptions& options,
                   std::shared_ptr<TcpStore> store, std::string prefix, detail::CollectiveTracker::RankNamer namer) {
    check_device(device);
    core_ = std::make_shared<detail::NcclCore>(rank, size, device, id, options, std::move(store), std::move(prefix),
                                               std::move(namer));
  }

  // Rank 0 creates the id and publishes it; the others fetch it.
  static Bootstrap bootstrap(World& world) {
    Bootstrap boot{{}, world.next_prefix("nccl")};
    if (world.size() == 1) {
      boot.id = make_nccl_unique_id();
      return boot;
    }
    const std::string key = boot.prefix + "unique_id";
    if (world.rank() == 0) {
      boot.id = make_nccl_unique_id();
      world.store()->set(key, std::string_view(boot.id.internal, sizeof boot.id.internal));
      return boot;
    }
    const std::string bytes = world.store()->get(key);
    if (bytes.size() != sizeof boot.id.internal)
      throw comm_error("the NCCL id from rank 0 has " + std::to_string(bytes.size()) + " bytes instead of " +
                           std::to_string(sizeof boot.id.internal),
                       "all ranks must run the same dtrain build against the same NCCL version");
    std::string_view(bytes).copy(boot.id.internal, sizeof boot.id.internal);
    return boot;
  }

  static void check_device(int device) {
    int count = 0;
    cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (device >= 0 && device < count) return;
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw config_error("GPU " + std::to_string(device) + " does not exist: this process sees " +
                           std::to_string(count) + " (CUDA_VISIBLE_DEVICES=" + (visible ? visible : "<unset>") + ")",
                       "use one GPU per rank, usually the local rank (world.local_rank()); run dtrain-doctor "
                       "to list the GPUs");
  }

  detail::NcclCore& core() const {
    if (!core_) throw config_error("use of a moved-from NcclCommunicator");
    return *core_;
  }

  void release() noexcept {
    if (core_) core_->close();
    core_.reset();
  }

  std::shared_ptr<detail::NcclCore> core_;
};

static_assert(Communicator<NcclCommunicator>);
static_assert(Communicator<NcclRef>);

}  // namespace dtrain

#endif  // DTRAIN_HAS_CUDA
