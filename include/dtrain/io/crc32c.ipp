// The definitions crc32c.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/io/crc32c.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL const std::array<std::array<std::uint32_t, 256>, 8>& crc32c_tables() {
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

  DTRAIN_DECL std::uint32_t crc32c_portable(std::uint32_t crc, const unsigned char* p, std::size_t n) {
    const auto& t = crc32c_tables();
    while (n >= 8) {
      std::uint64_t word;
      std::memcpy(&word, p, 8);
      if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
      const auto lo = static_cast<std::uint32_t>(word) ^ crc;
      const auto hi = static_cast<std::uint32_t>(word >> 32);
      crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][hi & 0xff] ^
            t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
      p += 8;
      n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
    return crc;
  }
  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL std::uint32_t crc32c(std::span<const std::byte> bytes, std::uint32_t crc) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::uint32_t c = ~crc;
#if DTRAIN_CRC32C_X86
  if (detail::crc32c_hardware()) return ~detail::crc32c_sse42(c, p, bytes.size());
#endif
  return ~detail::crc32c_portable(c, p, bytes.size());
}
}  // namespace dtrain
DTRAIN_IMPL_END
