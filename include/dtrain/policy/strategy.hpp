#pragma once
// The Strategy slot: how parameters, gradients and optimizer state are laid
// out across ranks. Strategy<Kind> wraps one kind tag:
//
//   Strategy<DDP>                 every rank holds everything; gradients all-reduced
//   Strategy<FSDP<FullShard>>     ZeRO-3: parameters, gradients, optimizer state sharded
//   Strategy<FSDP<ShardGradOp>>   ZeRO-2: gathered parameters kept from forward to backward
//   Strategy<FSDP<NoShard>>       FSDP's machinery, replicated (DDP's results)
//   Strategy<FSDP<HybridShard>>   sharded within a group of ranks (a node), replicated across groups
//   Strategy<ZeRO1>               only optimizer state and master weights sharded
//
// The kinds are tags; each strategy's code lives in strategy/<kind>.hpp. The
// list is open: any tag type with a `static constexpr std::string_view name`
// is a kind, and Strategy<MyKind> trains with the strategy class that
// dtrain::strategy_impl<MyKind, Dev, T, R> names (docs/strategies.md).

#include <string_view>
#include <tuple>
#include <type_traits>

namespace dtrain {

// Data parallel: every rank holds the full parameters; gradients are
// all-reduced in buckets while backward still runs.
struct DDP {
  static constexpr std::string_view name = "ddp";
};

// FSDP modes: which ranks share a shard, and when a gathered copy is freed.
struct FullShard {
  static constexpr std::string_view name = "fsdp-full";
};
struct ShardGradOp {
  static constexpr std::string_view name = "fsdp-grad-op";
};
struct NoShard {
  static constexpr std::string_view name = "fsdp-no-shard";
};
struct HybridShard {
  static constexpr std::string_view name = "fsdp-hybrid";
};

// ZeRO stage 1: parameters and gradients replicated, optimizer state and fp32
// master weights sharded; updated parameters are all-gathered.
struct ZeRO1 {
  static constexpr std::string_view name = "zero1";
};

namespace detail {
template <class Mode>
inline constexpr bool is_fsdp_mode = std::is_same_v<Mode, FullShard> || std::is_same_v<Mode, ShardGradOp> ||
                                     std::is_same_v<Mode, NoShard> || std::is_same_v<Mode, HybridShard>;
}  // namespace detail

// Fully sharded data parallel in one of its modes (FullShard by default).
template <class Mode = FullShard>
struct FSDP {
  using mode = Mode;
  static constexpr std::string_view name = Mode::name;
};

// The strategies dtrain ships, in the order tools and docs list them. The
// examples, the memory estimator and the docs read this one list.
using builtin_strategies = std::tuple<DDP, FSDP<FullShard>, FSDP<ShardGradOp>, FSDP<NoShard>, FSDP<HybridShard>, ZeRO1>;

namespace detail {
template <class Kind>
inline constexpr bool is_fsdp = false;
template <class Mode>
inline constexpr bool is_fsdp<FSDP<Mode>> = true;

// A strategy kind tag: a class with `static constexpr std::string_view name`.
template <class K>
concept strategy_kind_tag = std::is_class_v<K> && requires {
  requires std::is_same_v<decltype(K::name), const std::string_view>;
};

enum class strategy_problem { none, not_a_kind, unknown_fsdp_mode, bare_fsdp_mode };

// The first problem only, so a bad Strategy reports exactly one static_assert.
template <class Kind>
constexpr strategy_problem check_strategy() {
  if constexpr (is_fsdp_mode<Kind>)
    return strategy_problem::bare_fsdp_mode;
  else if constexpr (is_fsdp<Kind>)
    return is_fsdp_mode<typename Kind::mode> ? strategy_problem::none : strategy_problem::unknown_fsdp_mode;
  else if constexpr (strategy_kind_tag<Kind>)
    return strategy_problem::none;
  else
    return strategy_problem::not_a_kind;
}

template <strategy_problem Problem>
struct strategy_diagnostic {
  static_assert(Problem != strategy_problem::not_a_kind,
                "dtrain: Strategy<Kind> takes a strategy kind: DDP, FSDP<Mode>, ZeRO1, or your own tag type with "
                "`static constexpr std::string_view name` and a dtrain::strategy_impl specialisation");
  static_assert(Problem != strategy_problem::unknown_fsdp_mode,
                "dtrain: unknown FSDP mode: FSDP<...> takes FullShard, ShardGradOp, NoShard or HybridShard");
  static_assert(Problem != strategy_problem::bare_fsdp_mode,
                "dtrain: FullShard, ShardGradOp, NoShard and HybridShard are FSDP modes: write "
                "Strategy<FSDP<Mode>>");
};

// A kind (or an FSDP mode) given where a policy belongs, without Strategy<>.
// (A user's kind is recognised in policies.hpp, only for types no slot
// claims: asking a class template specialisation for `name` instantiates it.)
template <class P>
inline constexpr bool is_bare_strategy_kind =
    std::is_same_v<P, DDP> || std::is_same_v<P, ZeRO1> || is_fsdp<P> || is_fsdp_mode<P>;

template <class K>
struct is_strategy_kind_tag : std::bool_constant<strategy_kind_tag<K>> {};
}  // namespace detail

template <class Kind>
struct Strategy {
  using kind = Kind;

 private:
  // The check lives in another class so a failure leaves Strategy usable (see policies.hpp).
  static constexpr detail::strategy_diagnostic<detail::check_strategy<Kind>()> diagnostic{};
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
inline constexpr bool is_strategy_policy<Strategy<Kind>> = check_strategy<Kind>() == strategy_problem::none;
}  // namespace detail

template <class P>
concept StrategyPolicy = detail::is_strategy_policy<P>;

}  // namespace dtrain
