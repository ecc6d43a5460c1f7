// The definitions comm_host_transport.hpp declares with DTRAIN_DECL:
// included at the end of the header when DTRAIN_DEFINE_IMPL
// (core/macros.hpp), so they are compiled into every user translation unit
// (header-only) or once, into dtrain::runtime (separate compilation).
#pragma once

#include <span>
#include <vector>

#include "dtrain/backend/cuda/comm_host_transport.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  // The device buffer's values after everything queued on the compute stream
  // (copy_to_host waits for the stream).
  template <class T>
  std::vector<T> download(Cuda& dev, const T* data, std::size_t count) {
    std::vector<T> h(count);
    dev.copy_to_host(h.data(), data, count);
    return h;
  }

  // `data` down, `run` on the host copy, the result back up; complete on return.
  template <class T, class Run>
  NcclWork staged(Cuda& dev, T* data, std::size_t count, Run&& run) {
    std::vector<T> h = download<T>(dev, data, count);
    run(std::span<T>(h));
    dev.copy_from_host(data, h.data(), h.size());
    return {};
  }

  }  // namespace detail

  DTRAIN_DECL HostTransport::HostTransport(World & world) : host_(world) {}

  DTRAIN_DECL NcclWork HostTransport::all_reduce(Cuda & dev, void* data, std::size_t count, element_type type,
                                                 reduce_op op) {
    return detail::with_dtype(type, [&]<class T>(std::type_identity<T>) {
      return detail::staged(dev, static_cast<T*>(data), count, [&](std::span<T> h) { host_.all_reduce(h, op).wait(); });
    });
  }

  DTRAIN_DECL NcclWork HostTransport::broadcast(Cuda & dev, void* data, std::size_t count, element_type type,
                                                int root) {
    return detail::with_dtype(type, [&]<class T>(std::type_identity<T>) {
      return detail::staged(dev, static_cast<T*>(data), count,
                            [&](std::span<T> h) { host_.broadcast(h, root).wait(); });
    });
  }

  DTRAIN_DECL NcclWork HostTransport::reduce_scatter(Cuda & dev, const void* in, std::size_t in_count, void* out,
                                                     std::size_t out_count, element_type type, reduce_op op) {
    return detail::with_dtype(type, [&]<class T>(std::type_identity<T>) {
      const std::vector<T> h = detail::download(dev, static_cast<const T*>(in), in_count);
      return detail::staged(dev, static_cast<T*>(out), out_count,
                            [&](std::span<T> o) { host_.reduce_scatter(std::span<const T>(h), o, op).wait(); });
    });
  }

  DTRAIN_DECL NcclWork HostTransport::all_gather(Cuda & dev, const void* in, std::size_t in_count, void* out,
                                                 std::size_t out_count, element_type type) {
    return detail::with_dtype(type, [&]<class T>(std::type_identity<T>) {
      // `in` may be a slice of `out` (in place): read it before `out` is written.
      const std::vector<T> h = detail::download(dev, static_cast<const T*>(in), in_count);
      return detail::staged(dev, static_cast<T*>(out), out_count,
                            [&](std::span<T> o) { host_.all_gather(std::span<const T>(h), o).wait(); });
    });
  }

}  // namespace dtrain

DTRAIN_IMPL_END
