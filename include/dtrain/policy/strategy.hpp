#pragma once
// The Strategy slot: how parameters and gradients are laid out across ranks.
// Strategy<Kind> wraps a kind tag; DDP is the only kind that exists today.

#include <string_view>

namespace dtrain {

// Data parallel: every rank holds the full parameters; gradients are
// all-reduced in buckets while backward still runs.
struct DDP {
  static constexpr std::string_view name = "ddp";
};

namespace detail {
// The tags Strategy<...> accepts. A new strategy kind opts in here.
template <class Kind>
inline constexpr bool is_strategy_kind = false;
template <>
inline constexpr bool is_strategy_kind<DDP> = true;

template <bool KnownKind>
struct strategy_diagnostic {
  static_assert(KnownKind, "dtrain: unknown strategy: Strategy<...> takes DDP");
};
}  // namespace detail

template <class Kind>
struct Strategy {
  using kind = Kind;

 private:
  // The check lives in another class so a failure leaves Strategy usable (see policies.hpp).
  static constexpr detail::strategy_diagnostic<detail::is_strategy_kind<Kind>> diagnostic{};
};

namespace detail {
// Matched on the template's shape, without instantiating Strategy<Kind>:
// policies<> files Strategy<int> under this slot, and Strategy's own check
// reports it, instead of calling it an unknown policy.
template <class P>
inline constexpr bool is_strategy_slot = false;
template <class Kind>
inline constexpr bool is_strategy_slot<Strategy<Kind>> = true;

template <class P>
inline constexpr bool is_strategy_policy = false;
template <class Kind>
inline constexpr bool is_strategy_policy<Strategy<Kind>> = is_strategy_kind<Kind>;
}  // namespace detail

template <class P>
concept StrategyPolicy = detail::is_strategy_policy<P>;

}  // namespace dtrain
