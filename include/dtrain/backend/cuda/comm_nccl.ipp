// The definitions comm_nccl.hpp declares with DTRAIN_DECL (the error map,
// the communicator's set-up and teardown, its watchdog, the collectives'
// argument checks): included at the end of the header when
// DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are compiled into every
// user translation unit (header-only) or once, into dtrain::runtime
// (separate compilation; g++ compiles them: NCCL's host API).
#pragma once

#include "dtrain/backend/cuda/comm_nccl.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::string nccl_fix(ncclResult_t status) {
    const std::string debug = nccl_debug_hint;
    switch (status) {
      case ncclUnhandledCudaError:
        return "a CUDA call inside NCCL failed: an earlier kernel may have faulted (CUDA_LAUNCH_BLOCKING=1 "
               "locates it) or the device is unhealthy; " +
               debug;
      case ncclSystemError:
        return "a system call or socket failed: check the network interface (NCCL_SOCKET_IFNAME), firewalls "
               "between nodes, and /dev/shm size in containers (--shm-size); " +
               debug;
      case ncclRemoteError: return "a peer rank failed or exited: its log has the original error; " + debug;
      case ncclInvalidArgument:
        return "a buffer is not device memory of this communicator's GPU, or a count or root is out of range";
      case ncclInvalidUsage:
        return "ranks issued different collectives, or a call used a destroyed or aborted communicator; " + debug;
      default: return debug;
    }
  }

  DTRAIN_DECL nccl_error make_nccl_error(ncclResult_t status, std::string_view what, ncclComm_t comm,
                                         std::source_location where) {
    std::string msg = std::string(what) + " failed: " + ncclGetErrorString(status);
    if (const char* last = ncclGetLastError(comm); last && *last) msg += " (" + std::string(last) + ")";
    return nccl_error(static_cast<int>(status), msg, nccl_fix(status), where);
  }

  DTRAIN_DECL CurrentDevice::CurrentDevice(int device) : device_(device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_) cuda_check(cudaSetDevice(device_), "cudaSetDevice");
  }

  DTRAIN_DECL NcclOp::NcclOp(std::string_view name) : what(name) {
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    event.reset(e);
  }

  DTRAIN_DECL NcclGroupState& nccl_group_state() {
    thread_local NcclGroupState state;
    return state;
  }

  DTRAIN_DECL NcclCore::NcclCore(int rank, int size, int device, const ncclUniqueId& id, CommOptions options,
                                 std::shared_ptr<TcpStore> store, std::string prefix,
                                 CollectiveTracker::RankNamer namer)
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

  DTRAIN_DECL ncclComm_t NcclCore::native() {
    std::lock_guard lock(mu_);
    rethrow_if_broken_locked();
    return comm_;
  }

  DTRAIN_DECL void NcclCore::rethrow_if_broken() {
    if (!broken_.load()) return;
    std::lock_guard lock(mu_);
    rethrow_if_broken_locked();
  }

  DTRAIN_DECL void NcclCore::end_group() {
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

  DTRAIN_DECL void NcclCore::close() noexcept {
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

  DTRAIN_DECL void NcclCore::init(const ncclUniqueId& id) {
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
    const std::string where =
        "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " on GPU " + std::to_string(device_);
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

  DTRAIN_DECL ncclResult_t NcclCore::poll_settled(nccl_clock::time_point deadline) noexcept {
    auto backoff = std::chrono::microseconds(1);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t status = ncclCommGetAsyncError(comm_, &state);
      if (status != ncclSuccess) return status;
      if (state != ncclInProgress) return state;
      if (nccl_clock::now() >= deadline) return ncclInProgress;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, CudaTuning::settle_backoff_max);
    }
  }

  DTRAIN_DECL ncclResult_t NcclCore::await_locked(ncclResult_t status) noexcept {
    return status == ncclInProgress ? poll_settled(nccl_clock::now() + timeout_) : status;
  }

  DTRAIN_DECL void NcclCore::fail_status_locked(ncclResult_t status, std::string_view what, std::uint64_t seq) {
    if (status == ncclInProgress)
      fail_locked(timeout_error(
          tracker_.describe(what, seq,
                            "NCCL did not finish setting it up within " + std::to_string(timeout_.count()) + " ms"),
          timeout_fix()));
    else
      fail_locked(nccl_error(static_cast<int>(status),
                             tracker_.describe(what, seq, std::string("NCCL reported ") + ncclGetErrorString(status)),
                             nccl_fix(status)));
  }

  DTRAIN_DECL void NcclCore::record_locked(const std::shared_ptr<NcclOp>& op, cudaStream_t stream) {
    cuda_check(cudaEventRecord(op->event.get(), stream), "cudaEventRecord after a collective");
    op->issued = nccl_clock::now();
    op->recorded.store(true);
    outstanding_.push_back(op);
  }

  DTRAIN_DECL void NcclCore::rethrow_if_broken_locked() const {
    if (failure_) std::rethrow_exception(failure_);
    if (closed_) throw comm_error("a collective was issued on a destroyed NcclCommunicator");
  }

  DTRAIN_DECL std::string NcclCore::timeout_fix() {
    return "a rank stopped issuing collectives, issued them in a different order, or crashed: look at the "
           "ranks named above and their logs; if the work is legitimately slow raise CommOptions::timeout "
           "(DTRAIN_COMM_TIMEOUT_S); " +
           std::string(nccl_debug_hint);
  }

  template <class Error>
  void NcclCore::fail_locked(const Error& err) noexcept {
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

  DTRAIN_DECL std::chrono::milliseconds NcclCore::poll_interval() const {
    return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(timeout_ / CudaTuning::watchdog_polls),
                      CudaTuning::watchdog_poll_min, CudaTuning::watchdog_poll_max);
  }

  DTRAIN_DECL void NcclCore::watch() {
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

  DTRAIN_DECL void NcclCore::poll_locked() {
    cudaError_t query = cudaSuccess;
    std::erase_if(outstanding_, [&](const std::shared_ptr<NcclOp>& op) {
      const cudaError_t s = cudaEventQuery(op->event.get());
      if (s != cudaSuccess && s != cudaErrorNotReady) query = s;
      return s == cudaSuccess;
    });
    if (query != cudaSuccess) {
      fail_locked(cuda_error(std::string("a collective's completion could not be queried: ") + cudaGetErrorName(query) +
                                 ": " + cudaGetErrorString(query),
                             "a kernel on this GPU faulted (rerun with CUDA_LAUNCH_BLOCKING=1 to find it)"));
      return;
    }
    if (outstanding_.empty()) return;
    const NcclOp& oldest = *outstanding_.front();
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
      fail_locked(nccl_error(
          static_cast<int>(state),
          tracker_.describe(oldest.what, oldest.seq, std::string("NCCL reported ") + ncclGetErrorString(state)),
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

  }  // namespace detail

  DTRAIN_DECL void NcclWork::wait(cudaStream_t stream) {
    if (!op_ || finished()) return;
    cuda_check(cudaStreamWaitEvent(stream, op_->event.get(), 0), "cudaStreamWaitEvent");
  }

  DTRAIN_DECL void NcclWork::synchronize() {
    auto backoff = std::chrono::microseconds(1);
    while (!done()) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, detail::CudaTuning::synchronize_backoff_max);
    }
  }

  DTRAIN_DECL bool NcclWork::finished() const {
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

  DTRAIN_DECL NcclGroup::NcclGroup() {
    detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
    ++detail::nccl_group_state().depth;
  }

  DTRAIN_DECL NcclGroup::~NcclGroup() {
    if (ended_) return;
    try {
      end();
    } catch (const std::exception& e) {
      detail::nccl_log(std::string("ending an NCCL group while leaving its scope failed: ") + e.what());
    }
  }

  DTRAIN_DECL void NcclGroup::end() {
    if (ended_) throw config_error("NcclGroup::end() called twice", "end a group once");
    ended_ = true;
    detail::NcclCore::end_group();
  }

  DTRAIN_DECL ncclUniqueId make_nccl_unique_id() {
    ncclUniqueId id;
    detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    return id;
  }

  DTRAIN_DECL NcclCommunicator& NcclCommunicator::operator=(NcclCommunicator&& other) noexcept {
    if (this != &other) {
      release();
      core_ = std::move(other.core_);
    }
    return *this;
  }

  DTRAIN_DECL NcclCommunicator::NcclCommunicator(int rank, int size, const ncclUniqueId& id, int device,
                                                 const CommOptions& options, std::shared_ptr<TcpStore> store,
                                                 std::string prefix, detail::CollectiveTracker::RankNamer namer) {
    check_device(device);
    core_ = std::make_shared<detail::NcclCore>(rank, size, device, id, options, std::move(store), std::move(prefix),
                                               std::move(namer));
  }

  DTRAIN_DECL auto NcclCommunicator::bootstrap(World & world)->Bootstrap {
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

  DTRAIN_DECL void NcclCommunicator::check_device(int device) {
    int count = 0;
    cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (device >= 0 && device < count) return;
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw config_error("GPU " + std::to_string(device) + " does not exist: this process sees " + std::to_string(count) +
                           " (CUDA_VISIBLE_DEVICES=" + (visible ? visible : "<unset>") + ")",
                       "use one GPU per rank, usually the local rank (world.local_rank()); run dtrain-doctor "
                       "to list the GPUs");
  }

  DTRAIN_DECL detail::NcclCore& NcclCommunicator::core() const {
    if (!core_) throw config_error("use of a moved-from NcclCommunicator");
    return *core_;
  }

  DTRAIN_DECL void NcclCommunicator::release() noexcept {
    if (core_) core_->close();
    core_.reset();
  }

  namespace detail {

  DTRAIN_DECL void check_root(int root, int size) {
    if (root < 0 || root >= size)
      throw config_error("broadcast root " + std::to_string(root) + " is outside the world of " + std::to_string(size),
                         "pass a root rank in [0, size())");
  }

  DTRAIN_DECL void check_sizes(std::string_view what, std::string_view big_name, std::size_t big,
                               std::string_view small_name, std::size_t small, int size) {
    if (big == small * static_cast<std::size_t>(size)) return;
    throw config_error(std::string(what) + ": the " + std::string(big_name) + " has " + std::to_string(big) +
                           " elements but the " + std::string(small_name) + " has " + std::to_string(small) + ", and " +
                           std::to_string(small) + " x world size " + std::to_string(size) + " = " +
                           std::to_string(small * static_cast<std::size_t>(size)),
                       "the " + std::string(big_name) + " must hold exactly world size times the " +
                           std::string(small_name) + " elements");
  }

  }  // namespace detail

}  // namespace dtrain

DTRAIN_IMPL_END
