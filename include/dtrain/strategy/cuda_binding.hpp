#pragma once
// The CUDA binding of a strategy to its communicator: NCCL on a
// communication stream of its own, ordered behind the compute stream by
// events, so gradient all-reduces overlap with backward on earlier units.
//
//   compute stream:  bwd(unit 5) ─rec(e1)─ bwd(unit 4) ─ ... ─ wait(w1) ─ optimizer
//   comm stream:          wait(e1) ─ all_reduce(bucket 1) ─rec(w1)
//
// join() makes the compute stream (not the host) wait for the collective.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA
#include <cuda_runtime.h>

#include <memory>
#include <span>

#include "dtrain/comm/nccl.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/device/cuda.hpp"
#include "dtrain/strategy/comm_binding.hpp"

namespace dtrain {

template <>
struct CommBinding<Cuda> {
  using comm_type = NcclCommunicator;
  using work_type = NcclWork;

  // The communicator creates its own stream: collectives never queue behind
  // compute kernels except where an event says they must.
  static std::unique_ptr<comm_type> make(World& world, Cuda& dev) {
    return std::make_unique<comm_type>(world, dev.device_id());
  }

  template <class T>
  static work_type all_reduce(comm_type& comm, Cuda& dev, std::span<T> data, reduce_op op) {
    order_after_compute(comm, dev);
    return comm.all_reduce(data, op);
  }
  template <class T>
  static work_type broadcast(comm_type& comm, Cuda& dev, std::span<T> data, int root) {
    order_after_compute(comm, dev);
    return comm.broadcast(data, root);
  }
  template <class T>
  static work_type reduce_scatter(comm_type& comm, Cuda& dev, std::span<const T> in, std::span<T> out, reduce_op op) {
    order_after_compute(comm, dev);
    return comm.template reduce_scatter<T>(in, out, op);
  }
  template <class T>
  static work_type all_gather(comm_type& comm, Cuda& dev, std::span<const T> in, std::span<T> out) {
    order_after_compute(comm, dev);
    return comm.template all_gather<T>(in, out);
  }
  static void join(work_type& work, Cuda& dev) { work.wait(dev.stream()); }
  // Streams order everything: the next step can always be issued at once.
  static bool ready(const work_type&) { return true; }
  // Whether the collective has completed on the GPU (an event query).
  static bool done(const work_type& work) { return work.done(); }
  // `next`'s stream waits for `work` (a collective on another communicator).
  static void then(work_type& work, comm_type& next) { work.wait(next.stream()); }
  static void host_barrier(comm_type& comm, Cuda&) { comm.barrier().synchronize(); }

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
};

}  // namespace dtrain
#endif
