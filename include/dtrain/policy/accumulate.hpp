#pragma once
// The Accumulate slot: Accumulate<N> runs N micro-batches (forward and
// backward) per optimizer step (DDP and ZeRO1 communicate gradients on the
// last one only; FSDP reduce-scatters each).

namespace dtrain {

namespace detail {
template <bool Positive>
struct accumulate_diagnostic {
  static_assert(Positive, "dtrain: Accumulate<N> needs N >= 1: N is the number of micro-batches per optimizer step");
};
}  // namespace detail

template <int N>
struct Accumulate {
  static constexpr int micro_batches = N;

 private:
  // The check lives in another class so a failure leaves Accumulate usable (see policies.hpp).
  static constexpr detail::accumulate_diagnostic<(N >= 1)> diagnostic{};
};

namespace detail {
// Matched on the template's shape, without instantiating Accumulate<N>: policies<>
// files Accumulate<0> under this slot and Accumulate's own check reports it.
template <class P>
inline constexpr bool is_accumulate_slot = false;
template <int N>
inline constexpr bool is_accumulate_slot<Accumulate<N>> = true;

template <class P>
inline constexpr bool is_accumulate_policy = false;
template <int N>
inline constexpr bool is_accumulate_policy<Accumulate<N>> = (N >= 1);
}  // namespace detail

template <class P>
concept AccumulatePolicy = detail::is_accumulate_policy<P>;

}  // namespace dtrain
