// The definitions auth.hpp declares with DTRAIN_DECL: included at the end of
// the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are compiled
// into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>

#include "dtrain/comm/auth.hpp"
#include "dtrain/core/error.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::string random_bytes(std::size_t n) {
    std::string out(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        throw comm_error("cannot read the kernel's random source (getrandom): " + errno_text(),
                         "dtrain needs getrandom (Linux 3.17 or newer) to make nonces and job tokens");
      }
      got += static_cast<std::size_t>(r);
    }
    return out;
  }

  DTRAIN_DECL std::string hmac_sha256(std::string_view key, std::string_view message) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (::HMAC(::EVP_sha256(), key.data(), static_cast<int>(key.size()),
               reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &len) == nullptr ||
        len != auth_proof_bytes)
      throw comm_error("OpenSSL's HMAC-SHA256 failed", "check the libcrypto dtrain was linked against");
    return {reinterpret_cast<const char*>(digest), len};
  }

  DTRAIN_DECL bool same_bytes(std::string_view a, std::string_view b) {
    return a.size() == b.size() && ::CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
  }

  DTRAIN_DECL std::string auth_proof(std::string_view token, std::string_view role, std::string_view first_nonce,
                                     std::string_view second_nonce) {
    std::string message;
    message.reserve(role.size() + 1 + first_nonce.size() + second_nonce.size());
    message.append(role);
    message.push_back('\0');  // the role cannot run into the nonces
    message.append(first_nonce);
    message.append(second_nonce);
    return hmac_sha256(token, message);
  }

  DTRAIN_DECL std::string to_hex(std::string_view bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * bytes.size());
    for (const char c : bytes) {
      const auto b = static_cast<unsigned char>(c);
      out.push_back(digits[b >> 4]);
      out.push_back(digits[b & 0xf]);
    }
    return out;
  }

  }  // namespace detail

  DTRAIN_DECL std::string new_job_token() { return detail::to_hex(detail::random_bytes(32)); }

  DTRAIN_DECL void check_job_token(std::string_view token, std::string_view source) {
    if (token.size() >= detail::job_token_min_chars) return;
    throw config_error(std::string(source) + " has " + std::to_string(token.size()) +
                           " characters; a job token needs " + std::to_string(detail::job_token_min_chars) +
                           " or more to be a secret",
                       "make one with `dtrain-run --new-token` (or `openssl rand -hex 32`) and give every rank "
                       "the same");
  }
}  // namespace dtrain
DTRAIN_IMPL_END
