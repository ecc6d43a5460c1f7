#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// every piece of a checkpoint: it catches truncation, bit flips and swapped
// files. Checkpoints are large, so speed matters: x86-64 CPUs with SSE4.2
// compute it in hardware (crc32 instruction, chosen at run time, ~8 bytes
// per cycle per stream); elsewhere a slicing-by-8 table does 8 bytes per
// step. Both give the same value (tested against the standard check value
// crc32c("123456789") = 0xE3069283 and against each other).

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "dtrain/core/macros.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define DTRAIN_CRC32C_X86 1
#else
#define DTRAIN_CRC32C_X86 0
#endif

namespace dtrain {

namespace detail {

// tables[k][b]: the CRC of byte b followed by k zero bytes, so eight table
// lookups advance the CRC over eight bytes at once.
DTRAIN_DECL const std::array<std::array<std::uint32_t, 256>, 8>& crc32c_tables();

// `crc` is the running value in its internal (inverted) form.
DTRAIN_DECL std::uint32_t crc32c_portable(std::uint32_t crc, const unsigned char* p, std::size_t n);

#if DTRAIN_CRC32C_X86
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_sse42(std::uint32_t crc, const unsigned char* p,
                                                                    std::size_t n) {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

inline bool crc32c_hardware() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace detail

// Extends `crc` (the CRC-32C of the bytes before) over `bytes`; start at 0.
DTRAIN_DECL std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/io/crc32c.ipp"
#endif
