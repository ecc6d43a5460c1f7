#pragma once
// Owning device memory. Every device names its buffer type as
// `Dev::buffer<T>` = Buffer<T, its allocator>; the allocator decides where the
// bytes live (aligned host heap, cudaMalloc) and feeds the device's memory
// statistics. Buffers are move-only: exactly one owner frees the memory.
//
//   auto m = dtrain::make_buffer<float>(dev, n, dtrain::zero_init);
//   dev.for_each(n, SomeFunctor{m.data(), ...});
//   dtrain::MatView<float> w = m.view(rows, cols);

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "dtrain/core/error.hpp"
#include "dtrain/core/view.hpp"

namespace dtrain {

// Tag asking for zero-filled memory (on a GPU the fill is ordered on the
// device's stream, like any other work).
struct zero_init_t {
  explicit zero_init_t() = default;
};
inline constexpr zero_init_t zero_init{};

namespace detail {

// Bytes currently held through a device's allocator and the high-water mark.
// Atomic because buffers may be released on another thread (a loader worker).
class memory_stats {
 public:
  void on_allocate(std::size_t bytes) noexcept {
    const std::size_t now = current_.fetch_add(bytes) + bytes;
    std::size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  void on_release(std::size_t bytes) noexcept { current_.fetch_sub(bytes); }
  std::size_t allocated() const noexcept { return current_.load(); }
  std::size_t peak() const noexcept { return peak_.load(); }
  void reset_peak() noexcept { peak_.store(current_.load()); }

 private:
  std::atomic<std::size_t> current_{0};
  std::atomic<std::size_t> peak_{0};
};

}  // namespace detail

// What a buffer holds, for per-category memory accounting (StepStats::memory).
// The allocator a buffer was made with counts its bytes into its category.
enum class memory_category : unsigned char { params, grads, optimizer, master, gathered, activations, other };
inline constexpr std::size_t memory_category_count = 7;

// Bytes by category. Trainers report current bytes for the persistent
// categories and the peak for the transient ones (gathered, activations).
struct MemoryUsage {
  std::size_t params = 0;       // parameters as they persist on this rank (fp32 master when compute is fp32)
  std::size_t grads = 0;        // persistent gradient storage (accumulators, shards)
  std::size_t optimizer = 0;    // optimizer state (AdamW moments, SGD momentum)
  std::size_t master = 0;       // fp32 master weights kept beside a low-precision compute copy
  std::size_t gathered = 0;     // unit-sized buffers: gathered parameters, unsharded gradients
  std::size_t activations = 0;  // activations, their gradients and unit workspace
  std::size_t other = 0;        // small scratch (scalar staging)

  std::size_t& operator[](memory_category c) {
    switch (c) {
      case memory_category::params: return params;
      case memory_category::grads: return grads;
      case memory_category::optimizer: return optimizer;
      case memory_category::master: return master;
      case memory_category::gathered: return gathered;
      case memory_category::activations: return activations;
      case memory_category::other: break;
    }
    return other;
  }
  // params + grads + optimizer + master: what the ZeRO paper calls model states.
  std::size_t model_states() const { return params + grads + optimizer + master; }
  std::size_t total() const { return model_states() + gathered + activations + other; }
};

namespace detail {

// A device's memory statistics: the total and each category.
class device_memory {
 public:
  void on_allocate(memory_category c, std::size_t bytes) noexcept {
    total_.on_allocate(bytes);
    by_category_[static_cast<std::size_t>(c)].on_allocate(bytes);
  }
  void on_release(memory_category c, std::size_t bytes) noexcept {
    total_.on_release(bytes);
    by_category_[static_cast<std::size_t>(c)].on_release(bytes);
  }
  const memory_stats& total() const noexcept { return total_; }
  memory_stats& total() noexcept { return total_; }
  MemoryUsage current() const noexcept {
    return read([](const memory_stats& s) { return s.allocated(); });
  }
  MemoryUsage peak() const noexcept {
    return read([](const memory_stats& s) { return s.peak(); });
  }

 private:
  template <class F>
  MemoryUsage read(F f) const noexcept {
    MemoryUsage u;
    for (std::size_t c = 0; c < memory_category_count; ++c) u[static_cast<memory_category>(c)] = f(by_category_[c]);
    return u;
  }

  memory_stats total_;
  std::array<memory_stats, memory_category_count> by_category_;
};

template <class A>
concept BufferAllocator = std::movable<A> && requires(A& a, void* p, std::size_t bytes) {
  { a.allocate(bytes) } -> std::same_as<void*>;
  { a.deallocate(p, bytes) }
  noexcept;
  a.fill_zero(p, bytes);
};

}  // namespace detail

template <class T, detail::BufferAllocator Alloc>
class Buffer {
  // Raw bytes are copied between host and device and reinterpreted by
  // kernels: only trivially copyable element types make sense here.
  static_assert(std::is_trivially_copyable_v<T>, "dtrain::Buffer holds trivially copyable elements only");

 public:
  using value_type = T;
  using allocator_type = Alloc;

  Buffer() = default;
  Buffer(Alloc alloc, std::size_t n) : alloc_(std::move(alloc)), size_(n) {
    if (n != 0) data_ = static_cast<T*>(alloc_.allocate(n * sizeof(T)));
  }
  Buffer(Alloc alloc, std::size_t n, zero_init_t) : Buffer(std::move(alloc), n) {
    if (n != 0) alloc_.fill_zero(data_, n * sizeof(T));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept
      : alloc_(std::move(other.alloc_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      alloc_ = std::move(other.alloc_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~Buffer() { release(); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  std::span<T> span() noexcept { return {data_, size_}; }
  std::span<const T> span() const noexcept { return {data_, size_}; }
  const Alloc& allocator() const noexcept { return alloc_; }

  // A row-major view of the first rows*cols elements. Viewing a prefix is
  // allowed so one buffer sized for the largest micro-batch serves them all.
  MatView<T> view(std::int64_t rows, std::int64_t cols) {
    check_view(rows, cols);
    return {data_, rows, cols};
  }
  MatView<const T> view(std::int64_t rows, std::int64_t cols) const {
    check_view(rows, cols);
    return {data_, rows, cols};
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) alloc_.deallocate(data_, size_bytes());
    data_ = nullptr;
    size_ = 0;
  }
  void check_view(std::int64_t rows, std::int64_t cols) const {
    if (rows < 0 || cols < 0 || static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) > size_)
      throw config_error("a buffer of " + std::to_string(size_) + " elements cannot be viewed as " +
                             std::to_string(rows) + " x " + std::to_string(cols),
                         "allocate the buffer for the largest shape it must hold");
  }

  Alloc alloc_{};
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// The device's buffer type, allocated through the device (so it is counted in
// the device's memory statistics, under `category`, and on a GPU lives on the
// device's GPU).
template <class T, class Dev>
typename Dev::template buffer<T> make_buffer(Dev& dev, std::size_t n,
                                             memory_category category = memory_category::other) {
  return typename Dev::template buffer<T>(dev.allocator(category), n);
}
template <class T, class Dev>
typename Dev::template buffer<T> make_buffer(Dev& dev, std::size_t n, zero_init_t z,
                                             memory_category category = memory_category::other) {
  return typename Dev::template buffer<T>(dev.allocator(category), n, z);
}

// Memory that lives outside a device's allocator: n zero-filled floats the
// device can address, and a token that keeps them alive. FlatOptimizer takes
// its state buffers from a StateAllocator when given one (the offload arena's
// files on a local disk: offload/arena.hpp).
struct StateStorage {
  float* data = nullptr;
  std::shared_ptr<void> owner;
};
using StateAllocator = std::function<StateStorage(std::size_t n)>;

namespace detail {

// Grow-only scratch memory shared by everything running on one device, for
// temporaries a unit needs only inside one call (e.g. LayerNorm's per-row
// statistics in backward). A pointer stays valid until the next request.
template <BufferAllocator Alloc>
class Workspace {
 public:
  template <class T>
  T* get(const Alloc& alloc, std::size_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    const std::size_t bytes = n * sizeof(T);
    if (bytes > bytes_.size()) {
      bytes_ = {};  // free first: never hold the old and the new block at once
      bytes_ = Buffer<std::byte, Alloc>(alloc, bytes);
    }
    return reinterpret_cast<T*>(bytes_.data());
  }

 private:
  Buffer<std::byte, Alloc> bytes_;
};

}  // namespace detail

}  // namespace dtrain
