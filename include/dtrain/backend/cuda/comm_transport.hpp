#pragma once
// The communicator of a Cuda rank, whichever way its collectives travel:
// NCCL between GPUs (NcclTransport, comm_nccl_transport.hpp), or through
// host copies on the host communicator, so that several ranks can share one
// GPU (HostTransport, comm_host_transport.hpp; CommOptions::gpu =
// gpu_transport::host, DTRAIN_GPU_TRANSPORT=host). CommBinding<Cuda> holds
// one, chosen once when it makes the communicator (comm_binding.hpp), and
// its methods never ask which. The collectives are type-erased (pointer,
// count, element type): a collective costs far more than a virtual call,
// and each transport turns the element type back into its own typed call.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA

#include <cstddef>
#include <type_traits>

#include "dtrain/backend/cuda/comm_nccl.hpp"
#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/comm/communicator.hpp"
#include "dtrain/core/dtype.hpp"

namespace dtrain {

class CudaCommunicator {
 public:
  virtual ~CudaCommunicator() = default;

  // The collectives on `dev`'s memory, after the work queued on its compute
  // stream so far: `count` elements of `type` (fp32, bf16 or fp16). The
  // work says when the result is there (NcclWork; already complete when
  // the transport finished it before returning). reduce_scatter's input
  // holds size() outputs, all_gather's output size() inputs; all_gather
  // may run in place (`in` a slice of `out`).
  virtual NcclWork all_reduce(Cuda& dev, void* data, std::size_t count, element_type type, reduce_op op) = 0;
  virtual NcclWork broadcast(Cuda& dev, void* data, std::size_t count, element_type type, int root) = 0;
  virtual NcclWork reduce_scatter(Cuda& dev, const void* in, std::size_t in_count, void* out, std::size_t out_count,
                                  element_type type, reduce_op op) = 0;
  virtual NcclWork all_gather(Cuda& dev, const void* in, std::size_t in_count, void* out, std::size_t out_count,
                              element_type type) = 0;
  // Orders the collectives issued next on this communicator after `work`
  // (a collective of another communicator).
  virtual void order_after(NcclWork& work) = 0;
  // Blocks the calling thread until every rank got here.
  virtual void barrier() = 0;
};

namespace detail {
// f(std::type_identity<T>{}) for the dtype `type` names (CommBinding<Cuda>
// passes only the element types of Dtypes).
template <class F>
decltype(auto) with_dtype(element_type type, F&& f) {
  switch (type) {
    case element_type::bf16: return f(std::type_identity<bf16>{});
    case element_type::f16: return f(std::type_identity<fp16>{});
    default: return f(std::type_identity<float>{});
  }
}
}  // namespace detail

}  // namespace dtrain

#endif  // DTRAIN_HAS_CUDA
