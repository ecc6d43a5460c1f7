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

#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/backend/cuda/device_tuning.hpp"
#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/tracker.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"

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

// What to do about an NCCL error: the fix an nccl_error carries.
DTRAIN_DECL std::string nccl_fix(ncclResult_t status);

DTRAIN_DECL nccl_error make_nccl_error(ncclResult_t status, std::string_view what, ncclComm_t comm,
                                       std::source_location where = std::source_location::current());

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
  DTRAIN_DECL explicit CurrentDevice(int device);
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
  DTRAIN_DECL explicit NcclOp(std::string_view name);
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
DTRAIN_DECL NcclGroupState& nccl_group_state();

// The shared state of one communicator. NcclWork handles keep it alive, so a
// work's stream and event outlive the NcclCommunicator that issued it.
class NcclCore : public std::enable_shared_from_this<NcclCore> {
 public:
  DTRAIN_DECL NcclCore(int rank, int size, int device, const ncclUniqueId& id, CommOptions options,
                       std::shared_ptr<TcpStore> store, std::string prefix, CollectiveTracker::RankNamer namer);
  NcclCore(const NcclCore&) = delete;
  NcclCore& operator=(const NcclCore&) = delete;
  ~NcclCore() { close(); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return current_.load(); }
  void set_stream(cudaStream_t s) { current_.store(s); }
  float* scratch() const { return static_cast<float*>(scratch_.get()); }

  DTRAIN_DECL ncclComm_t native();

  DTRAIN_DECL void rethrow_if_broken();

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
  DTRAIN_DECL static void end_group();

  // Stops the watchdog and releases the NCCL communicator: ncclCommFinalize
  // flushes outstanding collectives (bounded by the timeout) before
  // ncclCommDestroy; a broken or stuck communicator is aborted instead.
  DTRAIN_DECL void close() noexcept;

 private:
  DTRAIN_DECL void init(const ncclUniqueId& id);

  // Non-blocking NCCL: a call may return ncclInProgress and finish in the
  // background; the communicator's asynchronous state says when it is done.
  DTRAIN_DECL ncclResult_t poll_settled(nccl_clock::time_point deadline) noexcept;

  // The final status of a call: waits out ncclInProgress (ncclInProgress
  // again means the timeout passed).
  DTRAIN_DECL ncclResult_t await_locked(ncclResult_t status) noexcept;

  DTRAIN_DECL void fail_status_locked(ncclResult_t status, std::string_view what, std::uint64_t seq);

  DTRAIN_DECL void record_locked(const std::shared_ptr<NcclOp>& op, cudaStream_t stream);

  DTRAIN_DECL void rethrow_if_broken_locked() const;

  DTRAIN_DECL static std::string timeout_fix();

  // Marks the communicator broken for good and aborts it, so NCCL's kernels
  // stop waiting for peers and the GPU is not left spinning.
  template <class Error>
  void fail_locked(const Error& err) noexcept;

  DTRAIN_DECL std::chrono::milliseconds poll_interval() const;

  DTRAIN_DECL void watch();

  DTRAIN_DECL void poll_locked();

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
  DTRAIN_DECL void wait(cudaStream_t stream);
  // Blocks the host until the collective completed.
  DTRAIN_DECL void synchronize();
  // Whether the collective completed; throws if it never will (its
  // communicator broke first).
  bool done() const { return !op_ || finished(); }

  // The collective's sequence number on this rank (0 for a no-op).
  std::uint64_t sequence() const { return op_ ? op_->seq : 0; }

 private:
  DTRAIN_DECL bool finished() const;

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
  DTRAIN_DECL NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  DTRAIN_DECL ~NcclGroup();

  DTRAIN_DECL void end();

 private:
  bool ended_ = false;
};

// ---- collectives -------------------------------------------------------------

namespace detail {

// The checks of the collectives' arguments, before anything is issued.
// A broadcast root must be a rank of the world of `size`.
DTRAIN_DECL void check_root(int root, int size);
// The larger buffer must hold exactly `size` copies of the smaller one.
DTRAIN_DECL void check_sizes(std::string_view what, std::string_view big_name, std::size_t big,
                             std::string_view small_name, std::size_t small, int size);

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
    check_root(root, size());
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
    check_sizes("reduce_scatter", "input", in.size(), "output", out.size(), size());
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
    check_sizes("all_gather", "output", out.size(), "input", in.size(), size());
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
DTRAIN_DECL ncclUniqueId make_nccl_unique_id();

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
  DTRAIN_DECL NcclCommunicator& operator=(NcclCommunicator&& other) noexcept;
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

  DTRAIN_DECL NcclCommunicator(int rank, int size, const ncclUniqueId& id, int device, const CommOptions& options,
                               std::shared_ptr<TcpStore> store, std::string prefix,
                               detail::CollectiveTracker::RankNamer namer);

  // Rank 0 creates the id and publishes it; the others fetch it.
  DTRAIN_DECL static Bootstrap bootstrap(World& world);

  DTRAIN_DECL static void check_device(int device);

  DTRAIN_DECL detail::NcclCore& core() const;

  DTRAIN_DECL void release() noexcept;

  std::shared_ptr<detail::NcclCore> core_;
};

static_assert(Communicator<NcclCommunicator>);
static_assert(Communicator<NcclRef>);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/cuda/comm_nccl.ipp"
#endif

#endif  // DTRAIN_HAS_CUDA
