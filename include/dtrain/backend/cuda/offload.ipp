// The definitions offload.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/backend/cuda/offload.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL OffloadCopies<Cuda>::OffloadCopies(Cuda & dev) : dev_(dev) {
    dev_.make_current();
    cuda_check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate(offload copies)");
  }

  DTRAIN_DECL OffloadCopies<Cuda>::~OffloadCopies() {
    if (copy_ != nullptr) {
      cudaStreamSynchronize(copy_);
      cudaStreamDestroy(copy_);
    }
  }

  DTRAIN_DECL void OffloadCopies<Cuda>::order(cudaStream_t before, cudaStream_t after) {
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cuda_check(cudaEventRecord(e, before), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(after, e, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(e);  // released by the runtime once the wait is satisfied
  }

}  // namespace dtrain

DTRAIN_IMPL_END
