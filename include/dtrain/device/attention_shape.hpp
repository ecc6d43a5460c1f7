#pragma once
// The shape and memory layout of one fused attention problem
// (device/fused_attention.hpp): element (b, h, t, d) of q, k, v, o and their
// gradients at data + b * batch + h * head + t * row + d, so the units'
// projection rows are read and written in place.

#include <compare>
#include <cstdint>

namespace dtrain {

// Strides in elements of one attention tensor; the head dimension has stride 1.
struct AttentionStrides {
  std::int64_t batch = 0, head = 0, row = 0;
  auto operator<=>(const AttentionStrides&) const = default;
};

// One problem: q and dq use `q`'s strides, k and dk `k`'s, v and dv `v`'s,
// o and do `o`'s; kv_heads divides heads (grouped-query attention).
struct FusedAttentionShape {
  std::int64_t batch = 0, heads = 0, kv_heads = 0, time = 0, head_dim = 0;
  AttentionStrides q, k, v, o;
  bool key_bias = false;  // an additive bias [batch, time] on the keys (0, or very negative: padding)
  auto operator<=>(const FusedAttentionShape&) const = default;
};

}  // namespace dtrain
