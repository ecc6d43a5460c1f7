// The definitions comm_binding.hpp declares with DTRAIN_DECL: included at
// the end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they
// are compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation). Only they see the transports'
// classes.
#pragma once

#include "dtrain/backend/cuda/comm_binding.hpp"
#include "dtrain/backend/cuda/comm_host_transport.hpp"
#include "dtrain/backend/cuda/comm_nccl_transport.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL int cuda_device_for(const World& world) {
    if (world.options().gpu != gpu_transport::host) return world.local_rank();
    int count = 0;
    cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    return count > 0 ? world.local_rank() % count : world.local_rank();
  }

  DTRAIN_DECL auto CommBinding<Cuda>::make(World & world, Cuda & dev)->std::unique_ptr<comm_type> {
    if (world.options().gpu == gpu_transport::host) return std::make_unique<HostTransport>(world);
    return std::make_unique<NcclTransport>(world, dev);
  }

}  // namespace dtrain

DTRAIN_IMPL_END
