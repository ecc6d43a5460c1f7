// The definitions host.hpp declares with DTRAIN_DECL: included at the end
// of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/device/host.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

namespace dtrain {
namespace detail {

DTRAIN_DECL int positive_env_int(const char* name, int fallback) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') return fallback;
  const std::string_view s(raw);
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size() || value < 1)
    throw config_error(std::string(name) + "='" + raw + "' is not a positive integer",
                       std::string("set ") + name + " to a positive integer or unset it");
  return value;
}

DTRAIN_DECL void blas_int_overflow(std::int64_t v, const char* what) {
  throw config_error(std::string("gemm ") + what + " = " + std::to_string(v) +
                         " is outside OpenBLAS's 32-bit index range",
                     "split the matrix product into smaller blocks");
}

}  // namespace detail

DTRAIN_DECL void Host::check_blas_pool() {
  const auto limit = address_space_limit();
  if (!limit) return;
  const int pool = openblas_get_num_threads();
  const int room = blas_threads_within(*limit);
  if (pool <= room) return;
  const auto mib = [](std::uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; };
  throw blas_pool_error(
      "OpenBLAS started " + std::to_string(pool) + " threads as it loaded, each reserving " +
          mib(blas_thread_address_space) + " of address space, and the address-space limit (ulimit -v) of " +
          mib(*limit) + " has room for " + std::to_string(room) +
          " (a quarter of it); a pool thread that finds no room waits for it forever",
      "set OPENBLAS_NUM_THREADS=" + std::to_string(room) +
          " or fewer before the program starts (dtrain-run sets it for its ranks), or raise the limit");
}

}  // namespace dtrain

DTRAIN_IMPL_END
