#pragma once
// The CUDA binding of a strategy to its communicator (comm/binding.hpp says
// what a binding provides): a CudaCommunicator (comm_transport.hpp), NCCL
// on a communication stream ordered behind the compute stream by events
// (comm_nccl_transport.hpp), or with CommOptions::gpu = gpu_transport::host
// the host communicator behind synchronous copies (comm_host_transport.hpp).
// The transport is chosen once, when the communicator is made; the
// collectives below only pass it the buffers. join() makes the compute
// stream (not the host) wait for a collective.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA

#include <memory>
#include <span>

#include "dtrain/backend/cuda/comm_nccl.hpp"
#include "dtrain/backend/cuda/comm_transport.hpp"
#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/comm/binding.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/element.hpp"

namespace dtrain {

// The GPU a rank of `world` computes on: its local rank, which must name a
// visible GPU under NCCL (NcclCommunicator says which and why not); under
// the host transport ranks beyond the visible GPUs share them round-robin.
DTRAIN_DECL int cuda_device_for(const World& world);

template <>
struct CommBinding<Cuda> {
  using comm_type = CudaCommunicator;
  using work_type = NcclWork;  // default-constructed (complete) from the host transport

  // NCCL (its own stream: collectives never queue behind compute kernels
  // except where an event says they must), or the host transport.
  DTRAIN_DECL static std::unique_ptr<comm_type> make(World& world, Cuda& dev);
  // The GPU this rank computes on.
  static int device_for(const World& world) { return cuda_device_for(world); }

  template <Dtype T>
  static work_type all_reduce(comm_type& comm, Cuda& dev, std::span<T> data, reduce_op op) {
    return comm.all_reduce(dev, data.data(), data.size(), element_type_of<T>(), op);
  }
  template <Dtype T>
  static work_type broadcast(comm_type& comm, Cuda& dev, std::span<T> data, int root) {
    return comm.broadcast(dev, data.data(), data.size(), element_type_of<T>(), root);
  }
  template <Dtype T>
  static work_type reduce_scatter(comm_type& comm, Cuda& dev, std::span<const T> in, std::span<T> out, reduce_op op) {
    return comm.reduce_scatter(dev, in.data(), in.size(), out.data(), out.size(), element_type_of<T>(), op);
  }
  template <Dtype T>
  static work_type all_gather(comm_type& comm, Cuda& dev, std::span<const T> in, std::span<T> out) {
    return comm.all_gather(dev, in.data(), in.size(), out.data(), out.size(), element_type_of<T>());
  }
  static void join(work_type& work, Cuda& dev) { work.wait(dev.stream()); }
  // Streams order everything: the next step can always be issued at once.
  static bool ready(const work_type&) { return true; }
  // Whether the collective has completed on the GPU (an event query).
  static bool done(const work_type& work) { return work.done(); }
  // `next` issues its collectives after `work` (a collective on another communicator).
  static void then(work_type& work, comm_type& next) { next.order_after(work); }
  static void host_barrier(comm_type& comm, Cuda&) { comm.barrier(); }
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/cuda/comm_binding.ipp"
#endif

#endif  // DTRAIN_HAS_CUDA
