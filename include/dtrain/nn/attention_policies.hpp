#pragma once
// The attention family's policies: nn::Attention<Policies...> names one
// attention unit by four slots, each given at most once, in any order, the
// rest taking their defaults:
//   mask         Causal (default): position t sees 0..t
//                Bidirectional: every position sees every key
//   positions    NoPositions (default), or Rotary (rope_theta, max_positions)
//   projections  SeparateQkv (default): q, k, v, o (transformers' Llama
//                names; grouped-query heads, QK-norm, biases, LoRA)
//                FusedQkv: GPT-2's one q|k|v projection (causal, no positions)
//   input        SelfInput (default): queries, keys and values from x
//                CrossInput: queries from x, keys and values from a second
//                input (the memory) of another length; bidirectional, no rotation
// Whatever the policies, the batch refines the mask at run time: its
// "attention_mask" [B, T] (the memory's "encoder_attention_mask" [B, T_mem]
// for CrossInput) leaves padded keys out, and its "position_ids" [B, T]
// (self-attention) keep each packed record to itself: the block-diagonal
// mask of padding-free packing. The units: nn/attention.hpp (FusedQkv,
// alias nn::CausalSelfAttention) and nn/rotary_attention.hpp (SeparateQkv,
// alias nn::RotaryAttention for Causal + Rotary).

#include <type_traits>

namespace dtrain::nn {

namespace detail {
struct MaskSlot {};
struct PositionsSlot {};
struct ProjectionsSlot {};
struct InputSlot {};
}  // namespace detail

struct Causal {
  using attention_slot = detail::MaskSlot;
};
struct Bidirectional {
  using attention_slot = detail::MaskSlot;
};
struct NoPositions {
  using attention_slot = detail::PositionsSlot;
};
struct Rotary {
  using attention_slot = detail::PositionsSlot;
};
struct SeparateQkv {
  using attention_slot = detail::ProjectionsSlot;
};
struct FusedQkv {
  using attention_slot = detail::ProjectionsSlot;
};
struct SelfInput {
  using attention_slot = detail::InputSlot;
};
struct CrossInput {
  using attention_slot = detail::InputSlot;
};

namespace detail {

template <class P>
concept attention_policy = requires {
  typename P::attention_slot;
};

// A policy's slot, or void for anything else (reported once, below).
template <class P>
struct slot_tag {
  using type = void;
};
template <attention_policy P>
struct slot_tag<P> {
  using type = typename P::attention_slot;
};

// The policy among Ps... in slot S, or Default.
template <class S, class Default, class... Ps>
struct attention_slot_match {
  using type = Default;
};
template <class S, class Default, class P, class... Ps>
struct attention_slot_match<S, Default, P, Ps...> {
  using type = std::conditional_t<std::is_same_v<typename slot_tag<P>::type, S>, P,
                                  typename attention_slot_match<S, Default, Ps...>::type>;
};
template <class S, class Default, class... Ps>
struct attention_slot_of {
  static_assert((0 + ... + (std::is_same_v<typename slot_tag<Ps>::type, S> ? 1 : 0)) <= 1,
                "nn::Attention: a policy slot (mask, positions, projections or input) is given twice");
  using type = typename attention_slot_match<S, Default, Ps...>::type;
};

template <class... Ps>
struct attention_policies {
  static_assert((attention_policy<Ps> && ...),
                "nn::Attention: every policy must be one of Causal, Bidirectional, NoPositions, Rotary, SeparateQkv, "
                "FusedQkv, SelfInput, CrossInput");
  using mask = typename attention_slot_of<MaskSlot, Causal, Ps...>::type;
  using positions = typename attention_slot_of<PositionsSlot, NoPositions, Ps...>::type;
  using projections = typename attention_slot_of<ProjectionsSlot, SeparateQkv, Ps...>::type;
  using input = typename attention_slot_of<InputSlot, SelfInput, Ps...>::type;
};

template <class>
inline constexpr bool always_false = false;

}  // namespace detail

// One attention unit per set of resolved policies. The units specialise it
// (nn/attention.hpp, nn/rotary_attention.hpp); any other set stops here.
template <class Mask, class Positions, class Projections, class Input>
class AttentionUnit {
  static_assert(detail::always_false<Mask>,
                "nn::Attention: could not build an attention unit for these policies (FusedQkv is causal "
                "self-attention without positions; CrossInput is Bidirectional without Rotary)");
};

template <class... Policies>
using Attention = AttentionUnit<typename detail::attention_policies<Policies...>::mask,
                                typename detail::attention_policies<Policies...>::positions,
                                typename detail::attention_policies<Policies...>::projections,
                                typename detail::attention_policies<Policies...>::input>;

}  // namespace dtrain::nn
