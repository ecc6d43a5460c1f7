#pragma once
// The Device slot: where a rank computes. Device<Cuda> or Device<Host>.
//
// The device types themselves (backend/cuda/device.hpp, backend/host/device.hpp) pull in the
// CUDA runtime, cuBLAS and OpenBLAS; a policy only names them, so forward
// declarations keep this header, and everything that composes policies, light.

namespace dtrain {

class Host;
class Cuda;

namespace detail {
template <class D>
inline constexpr bool is_device_kind = false;
template <>
inline constexpr bool is_device_kind<Host> = true;
template <>
inline constexpr bool is_device_kind<Cuda> = true;

// nvcc compiles a translation unit for the GPU; anything else is a host build.
#if defined(__CUDACC__)
using default_device = Cuda;
#else
using default_device = Host;
#endif

template <bool KnownKind>
struct device_diagnostic {
  static_assert(KnownKind, "dtrain: unknown device: Device<...> takes Host or Cuda");
};
}  // namespace detail

template <class D>
struct Device {
  using kind = D;

 private:
  // The check lives in another class so a failure leaves Device usable (see policies.hpp).
  static constexpr detail::device_diagnostic<detail::is_device_kind<D>> diagnostic{};
};

namespace detail {
// Matched on the template's shape, without instantiating Device<D>: policies<>
// files Device<int> under this slot and Device's own check reports it.
template <class P>
inline constexpr bool is_device_slot = false;
template <class D>
inline constexpr bool is_device_slot<Device<D>> = true;

template <class P>
inline constexpr bool is_device_policy = false;
template <class D>
inline constexpr bool is_device_policy<Device<D>> = is_device_kind<D>;
}  // namespace detail

template <class P>
concept DevicePolicy = detail::is_device_policy<P>;

}  // namespace dtrain
