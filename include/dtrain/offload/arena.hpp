#pragma once
// Offloaded model states: the host memory they live in and the copies between
// it and the compute device (the Offload policy, policy/offload.hpp).
//
//   OffloadArena<Dev> arena(dev, offload_kind::optimizer);
//   auto master = arena.allocate<float>(n, memory_category::master);   // host, pinned on a GPU
//   arena.to_host(grad_host, grad_dev, n);  arena.wait_to_host();      // D2H, after the queued device work
//   arena.to_device(param_dev, param_host, n);                         // H2D, before later device work
//   arena.host().for_each(n, AdamW pass...)                            // the optimizer, on the host
//
// The arena owns a Host device of its own: its allocator counts the
// offloaded bytes by category (Trainer::host_memory()), apart from the
// compute device's, and its for_each runs the optimizer over the rank's cores
// with the vectorised host kernels. With a Host compute device the offloaded
// states are still separate buffers and every copy is really made, so the
// whole offload path runs, and is tested, without a GPU (OffloadCopies<Host>,
// backend/host/offload.hpp: plain copies); on a GPU the copies go through
// OffloadCopies<Cuda> (backend/cuda/offload.hpp): a copy stream of its own,
// ordered against the compute stream by events, so a unit's gradient shard
// travels to the host while backward goes on. Each backend's offload.hpp
// specialises OffloadCopies for its device.
//
// How each strategy uses it:
//   DDP        master, optimizer state and an fp32 gradient copy on the host;
//              after the all-reduce the gradient goes D2H; after the update
//              the compute-dtype parameters go H2D
//   ZeRO1      the master and gradient shards on the host; each unit's
//              reduced shard goes D2H as its reduce-scatter completes; the
//              updated compute-dtype shard goes H2D into its slot of the
//              replicated parameters just before the unit's all-gather
//   FSDP       as ZeRO1 for gradients; the compute-dtype shards stay on the
//              device (optimizer offload, uploaded after the update) or live
//              on the host and are uploaded unit by unit just before their
//              gather (ParamShards), within the prefetch look-ahead

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/policy/offload.hpp"

namespace dtrain {

// The device offloaded state lives on and the optimizer runs on there: the
// host backend's (backend/host/device.hpp), named here and included by the
// backends that instantiate an arena, so this generic header includes none.
class Host;

// The copies between a compute device and offloaded host memory, one
// specialisation per backend (backend/<name>/offload.hpp):
//   to_host(host_dst, dev_src, n)    D2H after the device work queued so far,
//                                    complete after wait_to_host()
//   wait_to_host()
//   to_device(dev_dst, host_src, n)  H2D, ordered before the device work
//                                    queued after it; the host source must
//                                    stay unchanged until the next wait_to_host()
//   pin(p, bytes), unpin(p)          pages the device copies from or to
template <class Dev>
class OffloadCopies {
  static_assert(sizeof(Dev) == 0,
                "dtrain: no OffloadCopies for this device: include its backend (<dtrain/trainer.hpp> includes the "
                "built-in ones) or specialise dtrain::OffloadCopies<Dev>");
};

// A host buffer of offloaded state: allocated through the arena's host
// device (counted by category in its statistics) and, on a GPU, pinned for
// asynchronous copies for as long as it lives. Move-only; `owner` holds the
// host device's buffer and its pinning, so this type does not name the
// host device.
template <class E>
class OffloadBuffer {
 public:
  OffloadBuffer() = default;
  OffloadBuffer(std::span<E> data, std::shared_ptr<void> owner) : data_(data), owner_(std::move(owner)) {}
  OffloadBuffer(OffloadBuffer&& o) noexcept : data_(std::exchange(o.data_, {})), owner_(std::move(o.owner_)) {}
  OffloadBuffer& operator=(OffloadBuffer&& o) noexcept {
    data_ = std::exchange(o.data_, {});
    owner_ = std::move(o.owner_);
    return *this;
  }

  E* data() noexcept { return data_.data(); }
  const E* data() const noexcept { return data_.data(); }
  std::size_t size() const noexcept { return data_.size(); }
  std::span<E> span() noexcept { return data_; }

 private:
  std::span<E> data_;
  std::shared_ptr<void> owner_;
};

template <class Dev, class HostDev = Host>
class OffloadArena {
 public:
  using host_device = HostDev;

  OffloadArena(Dev& dev, offload_kind kind);
  OffloadArena(const OffloadArena&) = delete;
  OffloadArena& operator=(const OffloadArena&) = delete;

  // The compute-dtype parameter shards live here too (Offload<ParamShards>).
  bool params() const { return kind_ == offload_kind::params; }
  // The host the offloaded states live on and the optimizer runs on.
  HostDev& host() { return host_; }
  MemoryUsage memory() const { return host_.memory_by_category(); }

  // n elements of host memory for `category`, zero-filled when asked; a
  // failure names the bytes and the category.
  template <class E>
  OffloadBuffer<E> allocate(std::size_t n, memory_category category, bool zero = false) {
    if (n == 0) return {};
    using host_buffer = typename HostDev::template buffer<E>;
    host_buffer b;
    try {
      b = zero ? make_buffer<E>(host_, n, zero_init, category) : make_buffer<E>(host_, n, category);
    } catch (const error&) {
      throw error("offload: allocating " + std::to_string(n * sizeof(E)) + " bytes of host memory for " +
                      category_name(category) + " failed (out of memory)",
                  "free host memory, use more ranks (sharded strategies split the states), or offload less "
                  "(Offload<OptimizerState> keeps the parameter shards on the device)");
    }
    auto held = std::make_shared<host_buffer>(std::move(b));
    E* p = held->data();
    copies_.pin(p, n * sizeof(E));
    OffloadCopies<Dev>* copies = &copies_;
    // Unpinned first, then (as the deleter goes) freed.
    return {held->span(), std::shared_ptr<void>(p, [copies, held](void* q) { copies->unpin(q); })};
  }

  // ---- optimizer state in files on a local disk (offload=nvme:DIR) ----
  //
  // Each state buffer is a file in `dir`, reserved in full up front
  // (posix_fallocate: a disk that fills later cannot fault the mapping) and
  // unlinked at once (nothing is left behind, even after a kill), then
  // mapped. The optimizer pass reads it in order: the kernel reads ahead
  // (MADV_SEQUENTIAL); after each pass the written pages are sent to the disk
  // (sync_file_range, write-behind) and the previous pass's clean pages are
  // dropped from memory, so the state's footprint in RAM stays bounded.

  // Checks `dir` (exists, a directory, writable) and keeps the state there.
  void use_state_dir(const std::filesystem::path& dir);
  bool state_on_disk() const { return !state_dir_.empty(); }
  const std::filesystem::path& state_dir() const { return state_dir_; }
  // Bytes of optimizer state held in files.
  std::size_t disk_bytes() const { return disk_bytes_; }

  // Fails before anything is written when `dir` lacks `bytes` of free space.
  void check_state_space(std::size_t bytes) const;

  // n zero floats in a file of state_dir(), mapped (see above).
  StateStorage allocate_state_file(std::size_t n);

  // After an optimizer pass over file-backed state: start writing what it
  // changed (write-behind), and drop from memory what earlier passes wrote
  // and the disk has since taken. `wait`: finish the writes first and drop
  // everything, so the next pass reads all of the state from the disk
  // (what a state larger than the memory meets; the benchmark measures it).
  void after_state_pass(bool wait = false);

  template <class E>
  void to_host(E* host_dst, const E* dev_src, std::size_t n) {
    copies_.to_host(host_dst, dev_src, n);
  }
  void wait_to_host() { copies_.wait_to_host(); }
  template <class E>
  void to_device(E* dev_dst, const E* host_src, std::size_t n) {
    copies_.to_device(dev_dst, host_src, n);
  }

  static const char* category_name(memory_category c);

 private:
  struct StateFile {
    int fd;
    void* map;
    std::size_t bytes;
  };

  offload_kind kind_;
  HostDev host_;
  OffloadCopies<Dev> copies_;
  std::filesystem::path state_dir_;
  std::vector<StateFile> files_;
  std::size_t disk_bytes_ = 0;
};

template <class Dev, class HostDev>
OffloadArena<Dev, HostDev>::OffloadArena(Dev& dev, offload_kind kind) : kind_(kind), copies_(dev) {
  if (kind == offload_kind::none)
    throw error("OffloadArena without an offload", "construct one only when something is offloaded");
}

template <class Dev, class HostDev>
auto OffloadArena<Dev, HostDev>::use_state_dir(const std::filesystem::path& dir) -> void {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw config_error("offload directory '" + dir.string() + "' does not exist or is not a directory",
                       "create it on a local NVMe disk, or fix offload=nvme:DIR");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw config_error("offload directory '" + dir.string() + "' is not writable (" + std::strerror(errno) + ")",
                       "choose a directory this user can write, on a local disk");
  state_dir_ = dir;
}

template <class Dev, class HostDev>
auto OffloadArena<Dev, HostDev>::check_state_space(std::size_t bytes) const -> void {
  struct statvfs fs {};
  if (::statvfs(state_dir_.c_str(), &fs) != 0) return;  // the allocation below reports it
  const auto free_bytes = static_cast<std::size_t>(fs.f_bavail) * static_cast<std::size_t>(fs.f_frsize);
  if (free_bytes < bytes)
    throw config_error("offload directory '" + state_dir_.string() + "' has " + std::to_string(free_bytes) +
                           " bytes free, and this rank's optimizer state needs " + std::to_string(bytes),
                       "free space there, point offload=nvme:DIR at a larger local disk, or use more ranks with a "
                       "sharded strategy");
}

template <class Dev, class HostDev>
auto OffloadArena<Dev, HostDev>::allocate_state_file(std::size_t n) -> StateStorage {
  const std::size_t bytes = n * sizeof(float);
  std::string name = (state_dir_ / "dtrain-optimizer-state-XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0)
    throw config_error("offload: cannot create a file in '" + state_dir_.string() + "' (" + std::strerror(errno) + ")",
                       "check that the directory is writable and not full");
  ::unlink(name.c_str());
  if (bytes == 0) {
    ::close(fd);
    return {};
  }
  if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    ::close(fd);
    throw config_error("offload: reserving " + std::to_string(bytes) + " bytes of optimizer state in '" +
                           state_dir_.string() + "' failed (" + std::strerror(rc) + ")",
                       "free space there or point offload=nvme:DIR at a larger local disk");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    throw error(
        "offload: mapping " + std::to_string(bytes) + " bytes of optimizer state failed (" + std::strerror(e) + ")",
        "raise the limits on mapped memory (ulimit -v) or offload to host memory instead");
  }
  ::madvise(p, bytes, MADV_SEQUENTIAL);
  disk_bytes_ += bytes;
  files_.push_back({fd, p, bytes});
  auto* files = &files_;
  std::size_t* counted = &disk_bytes_;
  return {static_cast<float*>(p), std::shared_ptr<void>(p, [files, counted, bytes](void* q) {
            ::munmap(q, bytes);
            *counted -= bytes;
            for (auto it = files->begin(); it != files->end(); ++it)
              if (it->map == q) {
                ::close(it->fd);
                files->erase(it);
                break;
              }
          })};
}

template <class Dev, class HostDev>
auto OffloadArena<Dev, HostDev>::after_state_pass(bool wait) -> void {
  for (const StateFile& f : files_) {
    if (wait) ::fdatasync(f.fd);
    ::madvise(f.map, f.bytes, MADV_DONTNEED);          // unmapped from this process; the page cache keeps dirty data
    ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);  // clean pages leave memory
#if defined(__linux__)
    ::sync_file_range(f.fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
  }
}

template <class Dev, class HostDev>
auto OffloadArena<Dev, HostDev>::category_name(memory_category c) -> const char* {
  switch (c) {
    case memory_category::params: return "parameters";
    case memory_category::grads: return "gradients";
    case memory_category::optimizer: return "optimizer state";
    case memory_category::master: return "master weights";
    default: return "offload staging";
  }
}

// What a strategy class says it can offload: `static constexpr offload_kind
// max_offload` (none when it does not declare it). params includes optimizer.
template <class S>
constexpr offload_kind strategy_max_offload() {
  if constexpr (requires { S::max_offload; })
    return S::max_offload;
  else
    return offload_kind::none;
}

namespace detail {
// Trainer<..., Offload<What>> with a strategy that cannot offload that much.
template <offload_kind Want, offload_kind Max>
struct offload_strategy_diagnostic {
  static_assert(!(Want == offload_kind::params && Max == offload_kind::optimizer),
                "dtrain: Offload<ParamShards> needs a strategy that shards parameters (Strategy<FSDP<...>>); DDP "
                "and ZeRO1 keep the whole model on every device: use Offload<OptimizerState> with them");
  static_assert(!(Want != offload_kind::none && Max == offload_kind::none),
                "dtrain: this strategy cannot offload: its class declares no `static constexpr offload_kind "
                "max_offload` (offload/arena.hpp says what offloading asks of a strategy)");
};
}  // namespace detail

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_OFFLOAD_TEMPLATES(X, Dev) X(class OffloadArena<Dev>)

}  // namespace dtrain
