#pragma once
// Attention over a key-value cache: the core of generation (incremental
// decoding, train/generate.hpp). A cached call's rows are new tokens, n per
// sequence, at the positions the batch's "position_ids" [B, n] (int64)
// give; the attention unit projects them as always, then
//   1. writes their keys and values into its cache slot (UnitContext::kv):
//      [B, kv_heads, capacity, head_dim] each, at their positions;
//   2. attends each query row at position p to its own sequence's cached
//      keys 0..p (p - window + 1..p with a sliding window), grouped-query
//      heads reading key/value head h / (heads / kv_heads), in one pass
//      with a running maximum (the scores are never stored).
// So a prompt's prefill (n = its length, positions 0..n-1) and each
// decoding step (n = 1) are the same call. A sequence whose rows are
// padding (past its end) writes its cache past its end; a later token at
// that position overwrites the slot before anything reads it. On a GPU it
// runs only with DTRAIN_GPU_GENERATE=on (no GPU run has checked it yet).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

namespace detail {

// The widest head a cached attention takes (its running sums live in registers).
inline constexpr std::int64_t max_cached_head_dim = 256;

// Where a cached call's rows go: B sequences of n new rows, the cache's
// head counts and length.
struct CacheShape {
  std::int64_t batch, n, heads, kv_heads, head_dim, capacity;
  DTRAIN_HOST_DEVICE std::int64_t rows() const { return batch * n; }
  // Element (sequence b, kv head j, position t, d) of a cache buffer.
  DTRAIN_HOST_DEVICE std::int64_t at(std::int64_t b, std::int64_t j, std::int64_t t, std::int64_t d) const {
    return ((b * kv_heads + j) * capacity + t) * head_dim + d;
  }
};

// 1: the new rows' keys and values (rows of leading dimension ld: GPT-2's
// fused q|k|v rows read in place) into the cache. One index per (row, kv
// head, d).
template <class T>
struct KvStore {
  CacheShape s;
  const T* k;
  const T* v;
  std::int64_t ld;
  const std::int64_t* positions;  // [rows]
  T* cache_k;
  T* cache_v;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t d = n % s.head_dim, j = (n / s.head_dim) % s.kv_heads, r = n / (s.head_dim * s.kv_heads);
    const std::int64_t at = s.at(r / s.n, j, positions[r], d), from = r * ld + j * s.head_dim + d;
    cache_k[at] = k[from];
    cache_v[at] = v[from];
  }
};

// 2: one index per (row, head): out[r, h hd .. ] = softmax(q k^T scale) v
// over the row's cached keys, accumulated in float with a running maximum.
template <class T>
struct CachedAttention {
  CacheShape s;
  const T* q;
  std::int64_t ldq;
  const std::int64_t* positions;
  const T* cache_k;
  const T* cache_v;
  float scale;
  std::int64_t window;  // > 0: keys window or more positions back are left out
  T* out;               // [rows, heads hd]
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto n = static_cast<std::int64_t>(i);
    const std::int64_t h = n % s.heads, r = n / s.heads, b = r / s.n, hd = s.head_dim;
    const std::int64_t j = h / (s.heads / s.kv_heads), p = positions[r];
    const std::int64_t first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const T* qr = q + r * ldq + h * hd;
    float qf[max_cached_head_dim], acc[max_cached_head_dim];
    for (std::int64_t d = 0; d < hd; ++d) {
      qf[d] = static_cast<float>(qr[d]) * scale;
      acc[d] = 0.f;
    }
    float mx = -INFINITY, sum = 0.f;
    for (std::int64_t t = first; t <= p; ++t) {
      const T* kt = cache_k + s.at(b, j, t, 0);
      const T* vt = cache_v + s.at(b, j, t, 0);
      float score = 0.f;
      for (std::int64_t d = 0; d < hd; ++d) score += qf[d] * static_cast<float>(kt[d]);
      if (score > mx) {  // rescale what is summed so far to the new maximum
        const float c = math::exp(mx - score);
        sum *= c;
        for (std::int64_t d = 0; d < hd; ++d) acc[d] *= c;
        mx = score;
      }
      const float e = math::exp(score - mx);
      sum += e;
      for (std::int64_t d = 0; d < hd; ++d) acc[d] += e * static_cast<float>(vt[d]);
    }
    T* o = out + r * s.heads * hd + h * hd;
    for (std::int64_t d = 0; d < hd; ++d) o[d] = dtype_cast<T>(acc[d] / sum);
  }
};

// The batch's "position_ids" of a cached call: [B, n] int64, each within
// the cache (checked on the host copy). `unit` names the caller in errors.
template <class T>
const DeviceTensor& cached_positions(const char* unit, const UnitContext<T>& ctx, const CacheShape& s) {
  const DeviceTensor* pos = ctx.batch != nullptr ? ctx.batch->find("position_ids") : nullptr;
  if (pos == nullptr || pos->type != element_type::i64 || pos->numel() != s.rows())
    throw config_error(
        std::string(unit) + ": a call with a key-value cache needs the batch's position_ids [B, n] int64",
        "generate through dtrain::generate (train/generate.hpp), which numbers the new tokens");
  const auto* host = pos->host_data<std::int64_t>();
  for (std::int64_t r = 0; r < s.rows(); ++r)
    if (host[r] < 0 || host[r] >= s.capacity)
      throw config_error(std::string(unit) + ": position " + std::to_string(host[r]) + " is outside the cache's " +
                             std::to_string(s.capacity) + " positions",
                         "give the cache room for the prompt and every new token (GenerateOptions::max_new_tokens)");
  return *pos;
}

// Steps 1 and 2 for a unit whose projections are done: q rows [rows, heads
// hd] (leading dimension ldq), k and v rows [rows, kv_heads hd] (leading
// dimension ldkv), rotated where the unit rotates; the merged heads go to
// `merged` [rows, heads hd]. Sizes the slot's buffers on first use.
template <class Dev, class T>
void cached_attention(Dev& dev, const char* unit, const UnitContext<T>& ctx, CacheShape s, const T* q, std::int64_t ldq,
                      const T* k, const T* v, std::int64_t ldkv, const std::int64_t* positions, float scale,
                      std::int64_t window, T* merged) {
  if constexpr (!Dev::host_accessible)
    require_gpu_switch(std::string(unit) + " with a key-value cache", "DTRAIN_GPU_GENERATE");
  if (s.head_dim > max_cached_head_dim)
    throw config_error(std::string(unit) + ": heads of " + std::to_string(s.head_dim) +
                           " elements are wider than a cached attention takes (" + std::to_string(max_cached_head_dim) +
                           ")",
                       "generate without the cache (GenerateOptions::cache = false)");
  KvSlot<T>& slot = *ctx.kv;
  const auto need = static_cast<std::size_t>(s.batch * s.kv_heads * s.capacity * s.head_dim);
  if (slot.size < need) {
    using Buf = typename Dev::template buffer<T>;
    auto held = std::make_shared<std::pair<Buf, Buf>>(make_buffer<T>(dev, need, memory_category::activations),
                                                      make_buffer<T>(dev, need, memory_category::activations));
    slot.k = held->first.data();
    slot.v = held->second.data();
    slot.size = need;
    slot.storage = std::move(held);
  }
  if (s.rows() == 0) return;
  dev.for_each(static_cast<std::size_t>(s.rows() * s.kv_heads * s.head_dim),
               KvStore<T>{s, k, v, ldkv, positions, slot.k, slot.v});
  dev.for_each(static_cast<std::size_t>(s.rows() * s.heads),
               CachedAttention<T>{s, q, ldq, positions, slot.k, slot.v, scale, window, merged});
}

}  // namespace detail
}  // namespace dtrain::nn
