#pragma once
// OffloadCopies<Cuda>: the copies between a GPU and offloaded host memory
// (offload/arena.hpp), on a copy stream of their own.
//
//   compute stream:  bwd(unit 5) ─rec(e)─ bwd(unit 4) ─ ...        ─wait(u)─ gather(unit 0)
//   copy stream:            wait(e) ─ D2H(grad shard 5) ─ ... ─ H2D(param shard 0) ─rec(u)
//
// to_host waits on the copy stream for what the compute stream has queued
// (the reduced shard), so the transfer overlaps the rest of backward;
// wait_to_host blocks the host until the copy stream is idle. to_device
// queues the upload on the copy stream and makes the compute stream wait
// for it, so only the work that reads the parameters waits. Offloaded host
// buffers are pinned (cudaHostRegister) for asynchronous, full-speed copies.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA
#include <cuda_runtime.h>

#include <cstddef>

#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/backend/host/device.hpp"  // the arena's host side: OffloadArena<Cuda> keeps its states on Host
#include "dtrain/offload/arena.hpp"

namespace dtrain {

template <>
class OffloadCopies<Cuda> {
 public:
  DTRAIN_DECL explicit OffloadCopies(Cuda& dev);
  OffloadCopies(const OffloadCopies&) = delete;
  OffloadCopies& operator=(const OffloadCopies&) = delete;
  DTRAIN_DECL ~OffloadCopies();

  template <class E>
  void to_host(E* host_dst, const E* dev_src, std::size_t n) {
    if (n == 0) return;
    order(dev_.stream(), copy_);
    cuda_check(cudaMemcpyAsync(host_dst, dev_src, n * sizeof(E), cudaMemcpyDeviceToHost, copy_),
               "cudaMemcpyAsync(offload D2H)");
  }
  void wait_to_host() { cuda_check(cudaStreamSynchronize(copy_), "cudaStreamSynchronize(offload copies)"); }

  template <class E>
  void to_device(E* dev_dst, const E* host_src, std::size_t n) {
    if (n == 0) return;
    cuda_check(cudaMemcpyAsync(dev_dst, host_src, n * sizeof(E), cudaMemcpyHostToDevice, copy_),
               "cudaMemcpyAsync(offload H2D)");
    order(copy_, dev_.stream());
  }

  void pin(void* p, std::size_t bytes) {
    cuda_check(cudaHostRegister(p, bytes, cudaHostRegisterDefault), "cudaHostRegister(offloaded state)");
  }
  void unpin(void* p) noexcept { cudaHostUnregister(p); }

 private:
  // `after` waits for everything queued on `before` so far.
  DTRAIN_DECL static void order(cudaStream_t before, cudaStream_t after);

  Cuda& dev_;
  cudaStream_t copy_ = nullptr;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/cuda/offload.ipp"
#endif

#endif  // DTRAIN_HAS_CUDA
