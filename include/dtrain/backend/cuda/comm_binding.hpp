#pragma once
// The CUDA binding of a strategy to its communicator: NCCL on a
// communication stream of its own, ordered behind the compute stream by
// events, so gradient all-reduces overlap with backward on earlier units.
//
//   compute stream:  bwd(unit 5) ─rec(e1)─ bwd(unit 4) ─ ... ─ wait(w1) ─ optimizer
//   comm stream:          wait(e1) ─ all_reduce(bucket 1) ─rec(w1)
//
// join() makes the compute stream (not the host) wait for the collective.
//
// With CommOptions::gpu = gpu_transport::host (DTRAIN_GPU_TRANSPORT=host)
// every collective instead runs on the host communicator over copies of the
// device buffers, synchronously: a check of the strategies on one GPU shared
// by several ranks, not a way to train fast.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA
#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <vector>

#include "dtrain/backend/host/comm.hpp"
#include "dtrain/backend/cuda/comm_nccl.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/comm/binding.hpp"

namespace dtrain {

// The communicator of a Cuda rank: NCCL, or (CommOptions::gpu =
// gpu_transport::host) the host communicator behind synchronous copies, so
// that ranks sharing one GPU can still run every strategy.
class CudaCommunicator {
 public:
  CudaCommunicator(World& world, Cuda& dev) {
    if (world.options().gpu == gpu_transport::host)
      host_ = std::make_unique<HostCommunicator>(world);
    else
      nccl_ = std::make_unique<NcclCommunicator>(world, dev.device_id());
  }
  bool on_host() const { return host_ != nullptr; }
  NcclCommunicator& nccl() { return *nccl_; }
  HostCommunicator& host() { return *host_; }
  // The stream NCCL collectives run on (the NCCL transport only).
  cudaStream_t stream() const { return nccl_->stream(); }

 private:
  std::unique_ptr<NcclCommunicator> nccl_;
  std::unique_ptr<HostCommunicator> host_;
};

// The GPU a rank of `world` computes on: its local rank, which must name a
// visible GPU under NCCL (NcclCommunicator says which and why not); under
// the host transport ranks beyond the visible GPUs share them round-robin.
inline int cuda_device_for(const World& world) {
  if (world.options().gpu != gpu_transport::host) return world.local_rank();
  int count = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  return count > 0 ? world.local_rank() % count : world.local_rank();
}

template <>
struct CommBinding<Cuda> {
  using comm_type = CudaCommunicator;
  using work_type = NcclWork;  // default-constructed (complete) for the host transport

  // NCCL creates its own stream: collectives never queue behind compute
  // kernels except where an event says they must.
  static std::unique_ptr<comm_type> make(World& world, Cuda& dev) { return std::make_unique<comm_type>(world, dev); }
  // The GPU this rank computes on.
  static int device_for(const World& world) { return cuda_device_for(world); }

  template <class T>
  static work_type all_reduce(comm_type& comm, Cuda& dev, std::span<T> data, reduce_op op) {
    if (comm.on_host()) return staged(dev, data, [&](std::span<T> h) { comm.host().all_reduce(h, op).wait(); });
    order_after_compute(comm, dev);
    return comm.nccl().all_reduce(data, op);
  }
  template <class T>
  static work_type broadcast(comm_type& comm, Cuda& dev, std::span<T> data, int root) {
    if (comm.on_host()) return staged(dev, data, [&](std::span<T> h) { comm.host().broadcast(h, root).wait(); });
    order_after_compute(comm, dev);
    return comm.nccl().broadcast(data, root);
  }
  template <class T>
  static work_type reduce_scatter(comm_type& comm, Cuda& dev, std::span<const T> in, std::span<T> out, reduce_op op) {
    if (comm.on_host()) {
      const std::vector<T> h = download(dev, in);
      return staged(dev, out, [&](std::span<T> o) {
        comm.host().reduce_scatter(std::span<const T>(h), o, op).wait();
      });
    }
    order_after_compute(comm, dev);
    return comm.nccl().template reduce_scatter<T>(in, out, op);
  }
  template <class T>
  static work_type all_gather(comm_type& comm, Cuda& dev, std::span<const T> in, std::span<T> out) {
    if (comm.on_host()) {
      // `in` may be a slice of `out` (in place): read it before `out` is written.
      const std::vector<T> h = download(dev, in);
      return staged(dev, out, [&](std::span<T> o) { comm.host().all_gather(std::span<const T>(h), o).wait(); });
    }
    order_after_compute(comm, dev);
    return comm.nccl().template all_gather<T>(in, out);
  }
  static void join(work_type& work, Cuda& dev) { work.wait(dev.stream()); }
  // Streams order everything: the next step can always be issued at once.
  static bool ready(const work_type&) { return true; }
  // Whether the collective has completed on the GPU (an event query).
  static bool done(const work_type& work) { return work.done(); }
  // `next`'s stream waits for `work` (a collective on another communicator).
  static void then(work_type& work, comm_type& next) {
    if (!next.on_host()) work.wait(next.stream());
  }
  static void host_barrier(comm_type& comm, Cuda&) {
    if (comm.on_host())
      comm.host().barrier().wait();
    else
      comm.nccl().barrier().synchronize();
  }

 private:
  // The communication stream waits for everything the compute stream has
  // queued so far (the gradients of the bucket about to be reduced).
  static void order_after_compute(comm_type& comm, Cuda& dev) {
    cudaEvent_t ready = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> guard(ready, &cudaEventDestroy);
    cuda_check(cudaEventRecord(ready, dev.stream()), "cudaEventRecord");
    // Destroying the event right after the wait is queued is allowed: the
    // runtime releases it once the wait is satisfied.
    cuda_check(cudaStreamWaitEvent(comm.stream(), ready, 0), "cudaStreamWaitEvent");
  }

  // The host transport: the device buffer's values after everything queued
  // on the compute stream (copy_to_host waits for the stream).
  template <class T>
  static std::vector<T> download(Cuda& dev, std::span<const T> data) {
    std::vector<T> h(data.size());
    dev.copy_to_host(h.data(), data.data(), data.size());
    return h;
  }
  // `data` down, `run` on the host copy, the result back up; complete on return.
  template <class T, class Run>
  static work_type staged(Cuda& dev, std::span<T> data, Run&& run) {
    std::vector<T> h = download(dev, std::span<const T>(data));
    run(std::span<T>(h));
    dev.copy_from_host(data.data(), h.data(), h.size());
    return {};
  }
};

}  // namespace dtrain
#endif
