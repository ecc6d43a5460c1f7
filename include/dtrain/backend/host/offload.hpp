#pragma once
// OffloadCopies<Host>: the copies between a Host compute device and its
// offloaded host memory (offload/arena.hpp). Both are plain host memory, so
// a copy is a memcpy, done when it returns, and nothing is pinned; the
// offloaded states are still separate buffers and every copy is really
// made, so the whole offload path runs, and is tested, without a GPU.

#include <cstddef>
#include <cstring>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/offload/arena.hpp"

namespace dtrain {

template <>
class OffloadCopies<Host> {
 public:
  explicit OffloadCopies(Host&) {}

  template <class E>
  void to_host(E* host_dst, const E* dev_src, std::size_t n) {
    if (n) std::memcpy(static_cast<void*>(host_dst), dev_src, n * sizeof(E));
  }
  void wait_to_host() {}
  template <class E>
  void to_device(E* dev_dst, const E* host_src, std::size_t n) {
    if (n) std::memcpy(static_cast<void*>(dev_dst), host_src, n * sizeof(E));
  }
  void pin(void*, std::size_t) {}
  void unpin(void*) noexcept {}
};

}  // namespace dtrain
