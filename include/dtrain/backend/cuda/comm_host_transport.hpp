#pragma once
// The GPU host transport (CommOptions::gpu = gpu_transport::host,
// DTRAIN_GPU_TRANSPORT=host): a Cuda rank's communicator (CudaCommunicator)
// that runs every collective on the host communicator over copies of the
// device buffers, synchronously. NCCL allows one rank per GPU; this lets
// several ranks share one GPU, so a one-GPU machine can check the sharded
// strategies on the GPU and compare their results bit for bit with the
// host's reductions: a check, not a way to train fast. Every collective has
// finished when it returns (its work is already complete), so nothing is
// ever ordered after it.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA

#include <cstddef>

#include "dtrain/backend/cuda/comm_transport.hpp"
#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/backend/host/comm.hpp"
#include "dtrain/comm/world.hpp"

namespace dtrain {

class HostTransport final : public CudaCommunicator {
 public:
  // The host communicator over `world`'s ranks.
  DTRAIN_DECL explicit HostTransport(World& world);

  DTRAIN_DECL NcclWork all_reduce(Cuda& dev, void* data, std::size_t count, element_type type, reduce_op op) override;
  DTRAIN_DECL NcclWork broadcast(Cuda& dev, void* data, std::size_t count, element_type type, int root) override;
  DTRAIN_DECL NcclWork reduce_scatter(Cuda& dev, const void* in, std::size_t in_count, void* out, std::size_t out_count,
                                      element_type type, reduce_op op) override;
  DTRAIN_DECL NcclWork all_gather(Cuda& dev, const void* in, std::size_t in_count, void* out, std::size_t out_count,
                                  element_type type) override;
  // Its collectives are complete on return: nothing to order.
  void order_after(NcclWork&) override {}
  void barrier() override { host_.barrier().wait(); }

 private:
  HostCommunicator host_;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/cuda/comm_host_transport.ipp"
#endif

#endif  // DTRAIN_HAS_CUDA
