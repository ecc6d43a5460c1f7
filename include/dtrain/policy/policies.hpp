#pragma once
// Composition of policies: policies<Ps...> takes Strategy<...>, Precision<...>,
// Accumulate<N>, Device<...> and Offload<...> in any order, each at most once,
// and fills the missing slots with defaults:
//
//   using P = dtrain::policies<dtrain::Accumulate<4>, dtrain::Precision<dtrain::bf16>>;
//   P::strategy     DDP          (the kind inside Strategy<...>: DDP, FSDP<Mode>, ZeRO1)
//   P::precision    Precision<bf16>, with P::param_type, P::reduce_type, P::master_type
//   P::accumulate   4            (micro-batches per optimizer step)
//   P::device       Host, or Cuda when nvcc compiles the translation unit
//   P::offload      offload_kind::none, optimizer (Offload<OptimizerState>) or params (Offload<ParamShards>)
//
// A mistake fails with exactly one error, a static_assert a user can search
// for. Three rules make that hold:
//  - each check reports only the first problem it finds (composition_of,
//    check_precision), so one mistake never trips two static_asserts;
//  - when the composition itself is wrong (unknown type, slot given twice)
//    every slot reads its default, so nothing downstream fails after it;
//    otherwise the chosen policies' own checks (Accumulate<0>, a bad
//    Precision pair) speak;
//  - the static_asserts live in separate detail::*_diagnostic classes, which
//    the policy instantiates through a private member: clang marks a class
//    whose own body fails a static_assert invalid and then reports every later
//    use of its members as a further error.

#include <type_traits>

#include "dtrain/policy/accumulate.hpp"
#include "dtrain/policy/device.hpp"
#include "dtrain/policy/offload.hpp"
#include "dtrain/policy/precision.hpp"
#include "dtrain/policy/strategy.hpp"

namespace dtrain {

template <class P>
concept Policy = StrategyPolicy<P> || PrecisionPolicy<P> || AccumulatePolicy<P> || DevicePolicy<P> || OffloadPolicy<P>;

namespace detail {
enum class policy_slot { strategy, precision, accumulate, device, offload, unknown };

// Variable templates, not constexpr functions: GCC 13 compiling nvcc's host
// code rejected check_composition<Ps...>() in `policies` as "used before its
// definition" (seen on an H200 machine, nvcc 13.0 with g++ 13.3).
template <class P>
inline constexpr policy_slot slot_of = is_strategy_slot<P>     ? policy_slot::strategy
                                       : is_precision_slot<P>  ? policy_slot::precision
                                       : is_accumulate_slot<P> ? policy_slot::accumulate
                                       : is_device_slot<P>     ? policy_slot::device
                                       : is_offload_slot<P>    ? policy_slot::offload
                                                               : policy_slot::unknown;

enum class composition_problem { none, bare_strategy_kind, unknown_type, duplicate };

template <policy_slot S, class... Ps>
inline constexpr int slot_count = ((slot_of<Ps> == S ? 1 : 0) + ... + 0);

// The first problem only, so a bad composition reports exactly one static_assert.
template <class... Ps>
inline constexpr composition_problem composition_of =
    (... || (is_bare_strategy_kind<Ps> ||
             std::conjunction_v<std::bool_constant<slot_of<Ps> == policy_slot::unknown>, is_strategy_kind_tag<Ps>>))
        ? composition_problem::bare_strategy_kind
    : (... || (slot_of<Ps> == policy_slot::unknown)) ? composition_problem::unknown_type
    : (... || (slot_count<slot_of<Ps>, Ps...> > 1))  ? composition_problem::duplicate
                                                     : composition_problem::none;

template <composition_problem Problem>
struct composition_diagnostic {
  static_assert(Problem != composition_problem::bare_strategy_kind,
                "dtrain: a strategy kind is not a policy by itself: wrap it, as in Strategy<FSDP<FullShard>>, "
                "Strategy<DDP> or Strategy<ZeRO1>");
  static_assert(Problem != composition_problem::unknown_type,
                "dtrain: unknown policy type: expected Strategy<...>, Precision<...>, Accumulate<N>, Device<...> or "
                "Offload<...>");
  static_assert(Problem != composition_problem::duplicate,
                "dtrain: policy given twice: each of Strategy, Precision, Accumulate, Device, Offload may appear at "
                "most once");
};

// The first of Ps in slot S, or Default.
template <policy_slot S, class Default, class... Ps>
struct find_slot : std::type_identity<Default> {};
template <policy_slot S, class Default, class P, class... Ps>
struct find_slot<S, Default, P, Ps...>
    : std::conditional_t<slot_of<P> == S, std::type_identity<P>, find_slot<S, Default, Ps...>> {};
}  // namespace detail

template <class... Ps>
struct policies {
 private:
  static constexpr detail::composition_problem problem = detail::composition_of<Ps...>;

  template <detail::policy_slot S, class Default>
  using slot_t = typename std::conditional_t<problem == detail::composition_problem::none,
                                             detail::find_slot<S, Default, Ps...>, std::type_identity<Default>>::type;

 public:
  // An invalid Strategy<...> reports its own error (naming its kind
  // instantiates it); DDP stands in downstream so nothing else fails.
  using strategy_policy = slot_t<detail::policy_slot::strategy, Strategy<DDP>>;
  using strategy = std::conditional_t<StrategyPolicy<strategy_policy>, typename strategy_policy::kind, DDP>;
  using precision = slot_t<detail::policy_slot::precision, Precision<fp32>>;
  using param_type = typename precision::param_type;
  using reduce_type = typename precision::reduce_type;
  using master_type = typename precision::master_type;
  static constexpr int accumulate = slot_t<detail::policy_slot::accumulate, Accumulate<1>>::micro_batches;
  using device = typename slot_t<detail::policy_slot::device, Device<detail::default_device>>::kind;
  using offload_policy = slot_t<detail::policy_slot::offload, Offload<NoOffload>>;
  static constexpr offload_kind offload = OffloadPolicy<offload_policy> ? offload_policy::kind : offload_kind::none;

 private:
  static constexpr detail::composition_diagnostic<problem> diagnostic{};
};

}  // namespace dtrain
