#pragma once
// A job's secret and the proofs built on it. Every connection a job opens to
// its rendezvous store, and every Gloo connection between its ranks, starts
// with a challenge-response over the job token (docs/security.md): each side
// sends a fresh random nonce and proves it holds the token with
// HMAC-SHA256(token, role | both nonces). The token itself never crosses the
// network, a proof is bound to this connection's nonces (no replay), and
// both sides prove (a stranger posing as the store learns nothing either).
// The MAC is OpenSSL's libcrypto; the nonces come from the kernel's getrandom.

#include <cstddef>
#include <string>
#include <string_view>

#include "dtrain/core/macros.hpp"

namespace dtrain {

namespace detail {

// The fewest characters a token may have: 32 hex digits are 128 random bits.
inline constexpr std::size_t job_token_min_chars = 32;
// A nonce's and a proof's bytes.
inline constexpr std::size_t auth_nonce_bytes = 32;
inline constexpr std::size_t auth_proof_bytes = 32;

// `n` bytes from the kernel's random source (getrandom; throws if it fails).
DTRAIN_DECL std::string random_bytes(std::size_t n);

// HMAC-SHA256 of `message` under `key`: 32 bytes.
DTRAIN_DECL std::string hmac_sha256(std::string_view key, std::string_view message);

// Equal in time that does not depend on where the first difference is.
DTRAIN_DECL bool same_bytes(std::string_view a, std::string_view b);

// The proof that whoever plays `role` on a connection holds the token: an
// HMAC over the role and the two nonces, the challenger's first.
DTRAIN_DECL std::string auth_proof(std::string_view token, std::string_view role, std::string_view first_nonce,
                                   std::string_view second_nonce);

// Lower-case hex of `bytes`.
DTRAIN_DECL std::string to_hex(std::string_view bytes);

}  // namespace detail

// A fresh random job token: 32 random bytes as 64 hex digits (what dtrain-run
// makes for a job and `dtrain-run --new-token` prints).
DTRAIN_DECL std::string new_job_token();

// Throws config_error when `token` is too short to be a secret; `source`
// names where it came from ("DTRAIN_JOB_TOKEN") for the message.
DTRAIN_DECL void check_job_token(std::string_view token, std::string_view source);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/comm/auth.ipp"
#endif
