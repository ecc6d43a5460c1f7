// The definitions comm_nccl_transport.hpp declares with DTRAIN_DECL:
// included at the end of the header when DTRAIN_DEFINE_IMPL
// (core/macros.hpp), so they are compiled into every user translation unit
// (header-only) or once, into dtrain::runtime (separate compilation).
#pragma once

#include <memory>
#include <span>

#include "dtrain/backend/cuda/comm_nccl_transport.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL NcclTransport::NcclTransport(World & world, Cuda & dev) : nccl_(world, dev.device_id()) {}

  DTRAIN_DECL NcclWork NcclTransport::all_reduce(Cuda & dev, void* data, std::size_t count, element_type type,
                                                 reduce_op op) {
    order_after_compute(dev);
    return detail::with_dtype(type, [&]<class T>(std::type_identity<T>) {
      return nccl_.all_reduce(std::span<T>(static_cast<T*>(data), count), op);
    });
  }

  DTRAIN_DECL NcclWork NcclTransport::broadcast(Cuda & dev, void* data, std::size_t count, element_type type,
                                                int root) {
    order_after_compute(dev);
    return detail::with_dtype(type, [&]<class T>(std::type_identity<T>) {
      return nccl_.broadcast(std::span<T>(static_cast<T*>(data), count), root);
    });
  }

  DTRAIN_DECL NcclWork NcclTransport::reduce_scatter(Cuda & dev, const void* in, std::size_t in_count, void* out,
                                                     std::size_t out_count, element_type type, reduce_op op) {
    order_after_compute(dev);
    return detail::with_dtype(type, [&]<class T>(std::type_identity<T>) {
      return nccl_.template reduce_scatter<T>(std::span<const T>(static_cast<const T*>(in), in_count),
                                              std::span<T>(static_cast<T*>(out), out_count), op);
    });
  }

  DTRAIN_DECL NcclWork NcclTransport::all_gather(Cuda & dev, const void* in, std::size_t in_count, void* out,
                                                 std::size_t out_count, element_type type) {
    order_after_compute(dev);
    return detail::with_dtype(type, [&]<class T>(std::type_identity<T>) {
      return nccl_.template all_gather<T>(std::span<const T>(static_cast<const T*>(in), in_count),
                                          std::span<T>(static_cast<T*>(out), out_count));
    });
  }

  DTRAIN_DECL void NcclTransport::order_after_compute(Cuda & dev) {
    cudaEvent_t ready = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    const std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)> guard(ready, &cudaEventDestroy);
    cuda_check(cudaEventRecord(ready, dev.stream()), "cudaEventRecord");
    // Destroying the event right after the wait is queued is allowed: the
    // runtime releases it once the wait is satisfied.
    cuda_check(cudaStreamWaitEvent(nccl_.stream(), ready, 0), "cudaStreamWaitEvent");
  }

}  // namespace dtrain

DTRAIN_IMPL_END
