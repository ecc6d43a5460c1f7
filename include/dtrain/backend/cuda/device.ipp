// The definitions device.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation; g++ compiles them: host code only).
#pragma once

#include "dtrain/backend/cuda/device.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::string cuda_fix(cudaError_t status) {
    switch (status) {
      case cudaErrorMemoryAllocation:
        return "free GPU memory: a smaller (micro-)batch, FSDP<FullShard>, or activation checkpointing";
      case cudaErrorNoDevice:
      case cudaErrorInvalidDevice: return "check CUDA_VISIBLE_DEVICES and that each local rank has its own visible GPU";
      case cudaErrorInsufficientDriver:
      case cudaErrorUnsupportedPtxVersion: return "install an NVIDIA driver that supports this CUDA toolkit";
      case cudaErrorNoKernelImageForDevice:
      case cudaErrorInvalidKernelImage:
        return "the program holds no code for this GPU: rebuild it for the GPU's compute capability "
               "(dtrain's build: -DDTRAIN_CUDA_ARCHITECTURES=native; your own: CMAKE_CUDA_ARCHITECTURES)";
      default:
        return "run with CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer to find the failing kernel; "
               "after an illegal address or launch failure the GPU context is unusable: restart the process";
    }
  }

  DTRAIN_DECL std::string format_bytes(std::size_t bytes) {
    char text[64];
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return text;
  }

  DTRAIN_DECL void cuda_failed(cudaError_t status, std::string_view call, std::source_location where) {
    throw cuda_error(std::string(call) + " failed: " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status),
                     cuda_fix(status), where);
  }

  DTRAIN_DECL void cublas_failed(cublasStatus_t status, std::string_view call, std::source_location where) {
    throw cuda_error(std::string(call) + " failed: " + cublasGetStatusString(status),
                     status == CUBLAS_STATUS_ALLOC_FAILED
                         ? cuda_fix(cudaErrorMemoryAllocation)
                         : "check the matrix sizes and leading dimensions; run under compute-sanitizer",
                     where);
  }

  }  // namespace detail

  DTRAIN_DECL CudaPaths CudaPaths::from_env() {
    CudaPaths p;
    p.rows = detail::env_switch("DTRAIN_ROW_KERNELS",
                                {std::pair{std::string_view("thread"), row_kernels::thread},
                                 std::pair{std::string_view("lanes"), row_kernels::lanes}},
                                p.rows);
    p.attention = detail::env_switch("DTRAIN_ATTENTION",
                                     {std::pair{std::string_view("reference"), attention_kernels::reference},
                                      std::pair{std::string_view("cudnn"), attention_kernels::cudnn}},
                                     p.attention);
    p.elementwise = detail::env_switch("DTRAIN_ELEMENTWISE",
                                       {std::pair{std::string_view("scalar"), elementwise_kernels::scalar},
                                        std::pair{std::string_view("wide"), elementwise_kernels::wide}},
                                       p.elementwise);
    return p;
  }

  namespace detail {

  DTRAIN_DECL cuda_state::cuda_state(int device, cudaStream_t stream)
      : device_(device), stream_(stream), owns_stream_(stream == nullptr), paths_(CudaPaths::from_env()) {
    int count = 0;
    cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (device < 0 || device >= count)
      throw cuda_error(
          "GPU " + std::to_string(device) + " requested but " + std::to_string(count) + " are visible to this process",
          cuda_fix(cudaErrorInvalidDevice));
    try {
      cuda_check(cudaSetDevice(device), "cudaSetDevice");
      // Non-blocking: the legacy default stream must not serialise our work.
      if (owns_stream_) cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      cublas_check(cublasCreate(&blas_), "cublasCreate");
      cublas_check(cublasSetStream(blas_, stream_), "cublasSetStream");
      cuda_check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device),
                 "cudaDeviceGetAttribute(multiProcessorCount)");
      constexpr std::size_t partials_bytes = CudaTuning::max_partial_sums * sizeof(double);
      cuda_check(cudaMalloc(&partials_, partials_bytes), "cudaMalloc(sum partials)");
      cuda_check(cudaMallocHost(&host_partials_, partials_bytes), "cudaMallocHost(sum partials)");
    } catch (...) {
      release();
      throw;
    }
  }

  DTRAIN_DECL std::byte* cuda_state::extra_workspace(std::size_t bytes) {
    if (bytes <= extra_bytes_) return extra_;
    if (extra_ != nullptr) {
      cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      cudaFree(extra_);
      stats_.on_release(memory_category::activations, extra_bytes_);
      extra_ = nullptr;
      extra_bytes_ = 0;
    }
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes of library workspace)");
    stats_.on_allocate(memory_category::activations, bytes);
    extra_ = static_cast<std::byte*>(p);
    extra_bytes_ = bytes;
    return extra_;
  }

  DTRAIN_DECL void cuda_state::release() noexcept {
    extensions_.clear();
    if (extra_ != nullptr) cudaFree(extra_);
    if (host_partials_ != nullptr) cudaFreeHost(host_partials_);
    if (partials_ != nullptr) cudaFree(partials_);
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (owns_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  DTRAIN_DECL void* CudaAllocator::allocate(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // out of memory is not sticky: clear it so later calls do not report it
      std::size_t free = 0, total = 0;
      (void)cudaMemGetInfo(&free, &total);  // best effort: the message shows 0 if even this fails
      throw cuda_error("cudaMalloc of " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                           " bytes) failed on GPU " + std::to_string(state_->device()) +
                           ": out of memory; the GPU has " + format_bytes(free) + " free of " + format_bytes(total) +
                           ", dtrain buffers hold " + format_bytes(state_->stats().total().allocated()) + " (peak " +
                           format_bytes(state_->stats().total().peak()) + ")",
                       cuda_fix(status));
    }
    cuda_check(status, "cudaMalloc(" + std::to_string(bytes) + " bytes)");
    state_->stats().on_allocate(category_, bytes);
    return p;
  }

  DTRAIN_DECL void CudaAllocator::deallocate(void* p, std::size_t bytes) noexcept {
    cudaFree(p);
    state_->stats().on_release(category_, bytes);
  }

  }  // namespace detail

}  // namespace dtrain

DTRAIN_IMPL_END
