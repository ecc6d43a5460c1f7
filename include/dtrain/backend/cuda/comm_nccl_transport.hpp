#pragma once
// NCCL as a Cuda rank's communicator (CudaCommunicator): collectives on a
// communication stream of NCCL's own, ordered behind the compute stream by
// events, so gradient all-reduces overlap with backward on earlier units.
//
//   compute stream:  bwd(unit 5) ─rec(e1)─ bwd(unit 4) ─ ... ─ wait(w1) ─ optimizer
//   comm stream:          wait(e1) ─ all_reduce(bucket 1) ─rec(w1)
//
// Joining a collective (CommBinding<Cuda>::join) makes the compute stream,
// not the host, wait for it.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA

#include <cstddef>

#include "dtrain/backend/cuda/comm_nccl.hpp"
#include "dtrain/backend/cuda/comm_transport.hpp"
#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/comm/world.hpp"

namespace dtrain {

class NcclTransport final : public CudaCommunicator {
 public:
  // NCCL on `dev`'s GPU, over `world`'s ranks (one GPU per rank).
  DTRAIN_DECL NcclTransport(World& world, Cuda& dev);

  DTRAIN_DECL NcclWork all_reduce(Cuda& dev, void* data, std::size_t count, element_type type, reduce_op op) override;
  DTRAIN_DECL NcclWork broadcast(Cuda& dev, void* data, std::size_t count, element_type type, int root) override;
  DTRAIN_DECL NcclWork reduce_scatter(Cuda& dev, const void* in, std::size_t in_count, void* out, std::size_t out_count,
                                      element_type type, reduce_op op) override;
  DTRAIN_DECL NcclWork all_gather(Cuda& dev, const void* in, std::size_t in_count, void* out, std::size_t out_count,
                                  element_type type) override;
  // NCCL's stream waits for `work`'s event.
  void order_after(NcclWork& work) override { work.wait(nccl_.stream()); }
  // A one-element all-reduce the host waits for.
  void barrier() override { nccl_.barrier().synchronize(); }

 private:
  // The communication stream waits for everything the compute stream has
  // queued so far (the gradients of the bucket about to be reduced).
  DTRAIN_DECL void order_after_compute(Cuda& dev);

  NcclCommunicator nccl_;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/cuda/comm_nccl_transport.ipp"
#endif

#endif  // DTRAIN_HAS_CUDA
