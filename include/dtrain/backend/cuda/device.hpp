#pragma once
// dtrain::Cuda: one GPU and one stream. Every kernel, copy, memset and cuBLAS
// call of the device is queued on that stream, so work is ordered without
// extra synchronisation; other streams (NCCL) order against it with events.
//
// Buffers come from cudaMalloc and are released with cudaFree. cudaFree waits
// for the whole GPU, which is what makes freeing safe while a communication
// stream may still read the memory; dtrain allocates at setup, not per step,
// so the wait is never on the hot path.
//
// for_each and sum launch kernels, so calling them needs a translation unit
// compiled by nvcc; everything else here is host code that g++ compiles too.
// The class exists only in builds with CUDA (DTRAIN_HAS_CUDA).

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>

#include "dtrain/backend/cuda/device_tuning.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/device/device.hpp"

#if defined(__CUDACC__)
#include "dtrain/backend/cuda/device_launch.cuh"
#endif

namespace dtrain {

namespace detail {

// What to do about a CUDA error: the fix a cuda_error carries.
DTRAIN_DECL std::string cuda_fix(cudaError_t status);

// `bytes` as "12.34 MiB".
DTRAIN_DECL std::string format_bytes(std::size_t bytes);

// The cuda_error of a failed call (cuda_check, cublas_check).
[[noreturn]] DTRAIN_DECL void cuda_failed(cudaError_t status, std::string_view call, std::source_location where);
[[noreturn]] DTRAIN_DECL void cublas_failed(cublasStatus_t status, std::string_view call, std::source_location where);

}  // namespace detail

// Throws dtrain::cuda_error naming the call, the CUDA error and the caller's
// location when `status` is not cudaSuccess.
inline void cuda_check(cudaError_t status, std::string_view call,
                       std::source_location where = std::source_location::current()) {
  if (status != cudaSuccess) detail::cuda_failed(status, call, where);
}

inline void cublas_check(cublasStatus_t status, std::string_view call,
                         std::source_location where = std::source_location::current()) {
  if (status != CUBLAS_STATUS_SUCCESS) detail::cublas_failed(status, call, where);
}

namespace detail {

template <class T>
consteval cudaDataType cuda_data_type() {
  if constexpr (std::is_same_v<T, float>)
    return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, bf16>)
    return CUDA_R_16BF;
  else
    return CUDA_R_16F;
}

template <class>
inline constexpr bool always_false = false;

}  // namespace detail

// Where dtrain has more than one GPU kernel for a job, which one runs. A new
// path is off by default until a run on a GPU has proven it (docs/gpu.md,
// "Kernel paths"); each has an environment switch, read when a Cuda device
// is created, and a setter for programs and tests.
//   rows: the row functors (LayerNorm, RMSNorm, the causal softmax,
//         cross-entropy) one thread per row (`thread`), or a group of
//         math::lanes threads per row (`lanes`, the same bits).
//         DTRAIN_ROW_KERNELS=thread|lanes.
//   attention: the attention units' GEMMs and causal softmax (`reference`),
//         or cuDNN's fused flash attention in bf16 and fp16 (`cudnn`, in
//         builds with cuDNN: DTRAIN_HAS_CUDNN; device/fused_attention.hpp).
//         DTRAIN_ATTENTION=reference|cudnn.
//   elementwise: the newer four-element forms of elementwise functors (the
//         parameter cast, the activations, the residual adds: one 8- or
//         16-byte access per buffer for four elements, the same arithmetic)
//         off (`scalar`) or on (`wide`). DTRAIN_ELEMENTWISE=scalar|wide.
enum class row_kernels { thread, lanes };
enum class attention_kernels { reference, cudnn };
enum class elementwise_kernels { scalar, wide };

namespace detail {
// The value of switch `var`, one of `names`, or `fallback` when unset.
template <class E, std::size_t N>
E env_switch(const char* var, const std::pair<std::string_view, E> (&names)[N], E fallback) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  std::string list;
  for (const auto& [name, value] : names) {
    if (name == v) return value;
    if (!list.empty()) list += '|';
    list += name;
  }
  throw config_error(std::string(var) + "='" + v + "' is not one of " + list,
                     "set " + std::string(var) + " to one of " + list + ", or unset it");
}
}  // namespace detail

struct CudaPaths {
  row_kernels rows = row_kernels::thread;
  attention_kernels attention = attention_kernels::reference;
  elementwise_kernels elementwise = elementwise_kernels::scalar;

  // The defaults, overridden by the environment.
  DTRAIN_DECL static CudaPaths from_env();
};

namespace detail {

// What a Cuda device and all its buffers share. Buffers hold it too, so a
// buffer that outlives its Cuda object still frees on the right device.
class cuda_state {
 public:
  DTRAIN_DECL cuda_state(int device, cudaStream_t stream);
  cuda_state(const cuda_state&) = delete;
  cuda_state& operator=(const cuda_state&) = delete;
  ~cuda_state() { release(); }

  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  cublasHandle_t blas() const noexcept { return blas_; }
  int sm_count() const noexcept { return sm_count_; }
  double* partials() const noexcept { return partials_; }
  double* host_partials() const noexcept { return host_partials_; }
  device_memory& stats() noexcept { return stats_; }
  CudaPaths& paths() noexcept { return paths_; }
  // Per-device state of a library part (cuDNN's handle and graphs): one X
  // per device (the Cuda objects sharing this state), made on first use
  // from this state, destroyed before the stream.
  template <class X, class Make>
  X& extension(Make make) {
    std::shared_ptr<void>& slot = extensions_[std::type_index(typeid(X))];
    if (!slot) slot = make();
    return *static_cast<X*>(slot.get());
  }
  // Device memory beside the units' workspace (a library's scratch, e.g.
  // cuDNN's), grown to the largest request and counted as activations.
  DTRAIN_DECL std::byte* extra_workspace(std::size_t bytes);

 private:
  // Destructors never throw: errors while tearing down (e.g. the driver
  // already unloading at process exit) are ignored.
  DTRAIN_DECL void release() noexcept;

  int device_;
  cudaStream_t stream_;
  bool owns_stream_;
  cublasHandle_t blas_ = nullptr;
  int sm_count_ = 0;
  double* partials_ = nullptr;
  double* host_partials_ = nullptr;
  device_memory stats_;
  CudaPaths paths_;
  std::map<std::type_index, std::shared_ptr<void>> extensions_;
  std::byte* extra_ = nullptr;
  std::size_t extra_bytes_ = 0;
};

class CudaAllocator {
 public:
  CudaAllocator() = default;
  CudaAllocator(std::shared_ptr<cuda_state> state, memory_category category)
      : state_(std::move(state)), category_(category) {}

  DTRAIN_DECL void* allocate(std::size_t bytes);
  DTRAIN_DECL void deallocate(void* p, std::size_t bytes) noexcept;
  void fill_zero(void* p, std::size_t bytes) {
    cuda_check(cudaMemsetAsync(p, 0, bytes, state_->stream()), "cudaMemsetAsync");
  }

 private:
  std::shared_ptr<cuda_state> state_;
  memory_category category_ = memory_category::other;
};

}  // namespace detail

class Cuda : public detail::DeviceMemory<Cuda, detail::CudaAllocator> {
 public:
  static constexpr const char* name = "cuda";
  // This backend's tuning table (backend/cuda/device_tuning.hpp).
  using tuning = detail::CudaTuning;
  static constexpr bool host_accessible = false;
  template <class T>
  using buffer = Buffer<T, detail::CudaAllocator>;

  // Makes `device_id` current on the calling thread and creates a stream and a
  // cuBLAS handle for it. Use the object from that thread (or make_current()).
  explicit Cuda(int device_id = 0) : Cuda(device_id, nullptr) {}
  // The same on a stream the caller owns and keeps alive (nullptr: create one).
  Cuda(int device_id, cudaStream_t stream) : state_(std::make_shared<detail::cuda_state>(device_id, stream)) {}

  int device_id() const noexcept { return state_->device(); }
  cudaStream_t stream() const noexcept { return state_->stream(); }
  cublasHandle_t cublas() const noexcept { return state_->blas(); }
  void make_current() const { cuda_check(cudaSetDevice(device_id()), "cudaSetDevice"); }
  detail::CudaAllocator allocator(memory_category category = memory_category::other) const {
    return detail::CudaAllocator(state_, category);
  }

  void synchronize() { cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }

  // The kernel paths this device runs (CudaPaths), changeable before use.
  const CudaPaths& paths() const noexcept { return state_->paths(); }
  void set_paths(const CudaPaths& p) noexcept { state_->paths() = p; }
  // See detail::cuda_state::extension / extra_workspace.
  template <class X>
  X& extension() {
    return state_->extension<X>([this] { return std::make_shared<X>(*state_); });
  }
  std::byte* extra_workspace(std::size_t bytes) { return state_->extra_workspace(bytes); }

  template <class T>
  void copy_to_host(T* dst, const T* src, std::size_t n) {
    copy_kind(dst, src, n, cudaMemcpyDeviceToHost);
    synchronize();
  }
  // Blocking so the caller may reuse the host memory at once, pinned or not.
  template <class T>
  void copy_from_host(T* dst, const T* src, std::size_t n) {
    copy_kind(dst, src, n, cudaMemcpyHostToDevice);
    synchronize();
  }
  template <class T>
  void copy(T* dst, const T* src, std::size_t n) {
    copy_kind(dst, src, n, cudaMemcpyDeviceToDevice);
  }
  template <class T>
  void zero(T* dst, std::size_t n) {
    if (n != 0) cuda_check(cudaMemsetAsync(dst, 0, n * sizeof(T), stream()), "cudaMemsetAsync");
  }

  // Row-major C = alpha * op(A) * op(B) + beta * C. cuBLAS is column-major and
  // a row-major matrix is its column-major transpose, so we ask for
  // C^T = op(B)^T * op(A)^T: swap the operands and m/n, keep the flags.
  // CUBLAS_COMPUTE_32F accumulates in fp32 for every dtype and, with the
  // handle's default math mode, keeps fp32 GEMMs in true fp32 (no TF32), so
  // results match the host.
  template <class T>
  void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const T* A,
            std::int64_t lda, const T* B, std::int64_t ldb, float beta, T* C, std::int64_t ldc) {
    static_assert(Dtype<T>, "gemm supports fp32, bf16 and fp16");
    if (m == 0 || n == 0) return;
    constexpr cudaDataType type = detail::cuda_data_type<T>();
    cublas_check(cublasGemmEx_64(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                                 m, k, &alpha, B, type, ldb, A, type, lda, &beta, C, type, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }

  // `batch` independent row-major GEMMs, matrix i at i * stride elements of
  // A, B and C (the same operand swap as gemm).
  template <class T>
  void gemm_batched(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const T* A,
                    std::int64_t lda, std::int64_t stride_a, const T* B, std::int64_t ldb, std::int64_t stride_b,
                    float beta, T* C, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
    static_assert(Dtype<T>, "gemm_batched supports fp32, bf16 and fp16");
    if (m == 0 || n == 0 || batch == 0) return;
    constexpr cudaDataType type = detail::cuda_data_type<T>();
    cublas_check(cublasGemmStridedBatchedEx_64(cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                               trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, B, type, ldb,
                                               stride_b, A, type, lda, stride_a, &beta, C, type, ldc, stride_c, batch,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
  }

  template <class F>
  void for_each([[maybe_unused]] std::size_t n, [[maybe_unused]] F f) {
#if defined(__CUDACC__)
    static_assert(std::is_trivially_copyable_v<F>, "a functor passed to a kernel must be trivially copyable");
    const unsigned max_blocks = static_cast<unsigned>(state_->sm_count()) * tuning::blocks_per_sm;
    if constexpr (detail::LaneRowFunctor<F>) {
      if (paths().rows == row_kernels::lanes) {
        cuda_check(detail::launch_lane_rows(stream(), n, f, max_blocks), "for_each (lane rows) kernel launch");
        return;
      }
    }
    cuda_check(detail::launch_for_each(stream(), n, f, max_blocks, paths().elementwise == elementwise_kernels::wide),
               "for_each kernel launch");
#else
    static_assert(detail::always_false<F>,
                  "dtrain::Cuda::for_each launches a CUDA kernel: compile this translation unit with nvcc");
#endif
  }

  template <class F>
  double sum([[maybe_unused]] std::size_t n, [[maybe_unused]] F f) {
#if defined(__CUDACC__)
    static_assert(std::is_trivially_copyable_v<F>, "a functor passed to a kernel must be trivially copyable");
    if (n == 0) return 0.0;
    unsigned blocks = 0;
    if constexpr (detail::LaneRowFunctor<F>) {
      if (paths().rows == row_kernels::lanes) {
        cuda_check(detail::launch_lane_row_sums(stream(), n, f, state_->partials()), "sum (lane rows) kernel launch");
        blocks = detail::grid_size(n * F::row_lanes, tuning::max_partial_sums);
      }
    }
    if (blocks == 0) {
      cuda_check(detail::launch_partial_sums(stream(), n, f, state_->partials()), "sum kernel launch");
      blocks = detail::grid_size(n, tuning::max_partial_sums);
    }
    cuda_check(cudaMemcpyAsync(state_->host_partials(), state_->partials(), blocks * sizeof(double),
                               cudaMemcpyDeviceToHost, stream()),
               "cudaMemcpyAsync(sum partials)");
    synchronize();
    double total = 0.0;
    for (unsigned b = 0; b < blocks; ++b) total += state_->host_partials()[b];
    return total;
#else
    static_assert(detail::always_false<F>,
                  "dtrain::Cuda::sum launches a CUDA kernel: compile this translation unit with nvcc");
    return 0.0;
#endif
  }

  // (workspace and the memory reports: detail::DeviceMemory)

 private:
  friend class detail::DeviceMemory<Cuda, detail::CudaAllocator>;
  detail::device_memory& device_stats() const noexcept { return state_->stats(); }

  template <class T>
  void copy_kind(T* dst, const T* src, std::size_t n, cudaMemcpyKind kind) {
    if (n != 0) cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), kind, stream()), "cudaMemcpyAsync");
  }

  std::shared_ptr<detail::cuda_state> state_;
};

static_assert(ComputeDevice<Cuda>);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/cuda/device.ipp"
#endif

// The attention units' fused path on this device (FusedAttention<Cuda>),
// seen wherever Cuda can be named.
#include "dtrain/backend/cuda/device_attention.hpp"

#endif  // DTRAIN_HAS_CUDA
