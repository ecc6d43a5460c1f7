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
inline const std::array<std::array<std::uint32_t, 256>, 8>& crc32c_tables() {
  static const auto tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (std::size_t k = 1; k < 8; ++k)
      for (std::uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
    return t;
  }();
  return tables;
}

// `crc` is the running value in its internal (inverted) form.
inline std::uint32_t crc32c_portable(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  const auto& t = crc32c_tables();
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
    const auto lo = static_cast<std::uint32_t>(word) ^ crc;
    const auto hi = static_cast<std::uint32_t>(word >> 32);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
          t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
  return crc;
}

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
inline std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc = 0) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::uint32_t c = ~crc;
#if DTRAIN_CRC32C_X86
  if (detail::crc32c_hardware()) return ~detail::crc32c_sse42(c, p, bytes.size());
#endif
  return ~detail::crc32c_portable(c, p, bytes.size());
}

}  // namespace dtrain
