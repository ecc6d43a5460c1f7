// The definitions device_isa.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/backend/host/device_isa.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL host_isa widest_host_isa() {
#if DTRAIN_HOST_ISA_DISPATCH
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    return avx512 ? host_isa::avx512 : (avx2 ? host_isa::avx2 : host_isa::baseline);
#else
    return host_isa::baseline;
#endif
  }

  DTRAIN_DECL host_isa host_isa_from_env() {
    const host_isa widest = widest_host_isa();
    const char* raw = std::getenv("DTRAIN_HOST_ISA");
    if (raw == nullptr || *raw == '\0') return widest;
    const std::string_view s(raw);
    host_isa want = host_isa::baseline;
    if (s == "avx2")
      want = host_isa::avx2;
    else if (s == "avx512")
      want = host_isa::avx512;
    else if (s != "baseline")
      throw config_error("DTRAIN_HOST_ISA='" + std::string(s) + "' is not a host instruction level",
                         "set DTRAIN_HOST_ISA to baseline, avx2 or avx512, or unset it (the widest this CPU has)");
    if (static_cast<int>(want) > static_cast<int>(widest))
      throw config_error(
          "DTRAIN_HOST_ISA=" + std::string(s) + ": this processor's widest level is " + host_isa_name(widest),
          std::string("set DTRAIN_HOST_ISA=") + host_isa_name(widest) + " or lower, or unset it");
    return want;
  }

  }  // namespace detail

  DTRAIN_DECL void set_host_isa(host_isa isa) {
    const host_isa widest = detail::widest_host_isa();
    if (static_cast<int>(isa) > static_cast<int>(widest))
      throw config_error(std::string("set_host_isa(") + host_isa_name(isa) + "): this processor's widest level is " +
                             host_isa_name(widest),
                         "ask for a level up to widest_host_isa()");
    detail::host_isa_slot() = isa;
  }

}  // namespace dtrain

DTRAIN_IMPL_END
