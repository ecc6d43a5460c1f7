#pragma once
// The Offload slot: which model states live in host memory instead of on the
// compute device (offload/arena.hpp does the work).
//
//   Offload<OptimizerState>   fp32 master weights, optimizer state and the fp32
//                             gradient shard on the host; the optimizer pass
//                             runs there (ZeRO-Offload). Every strategy.
//   Offload<ParamShards>           the above, and the compute-dtype parameter shards
//                             too: each unit's shard is uploaded just before its
//                             gather. Strategies that shard parameters (FSDP).
//
// The arithmetic is the same as without offload: parameters are bit-identical
// under the same strategy and precision on a Host device (on a GPU the
// squared gradient norm is summed on the host, in another order, so with
// clipping the parameters agree to rounding). Checkpoints do not record it.

#include <string>
#include <string_view>
#include <type_traits>

#include "dtrain/core/error.hpp"

namespace dtrain {

// What Offload<...> moves to the host.
struct OptimizerState {
  static constexpr std::string_view name = "optimizer";
};
struct ParamShards {
  static constexpr std::string_view name = "params";
};
// No offload (the default).
struct NoOffload {
  static constexpr std::string_view name = "none";
};

// The run-time form of the slot (TrainerOptions::offload, the examples' offload= key).
enum class offload_kind { none, optimizer, params };

inline std::string_view offload_name(offload_kind k) {
  switch (k) {
    case offload_kind::optimizer: return OptimizerState::name;
    case offload_kind::params: return ParamShards::name;
    default: return NoOffload::name;
  }
}

inline offload_kind parse_offload(std::string_view s) {
  if (s == NoOffload::name || s.empty()) return offload_kind::none;
  if (s == OptimizerState::name) return offload_kind::optimizer;
  if (s == ParamShards::name) return offload_kind::params;
  throw config_error("offload '" + std::string(s) + "' is unknown", "use none, optimizer or params");
}

namespace detail {
template <class W>
inline constexpr bool is_offload_target =
    std::is_same_v<W, OptimizerState> || std::is_same_v<W, ParamShards> || std::is_same_v<W, NoOffload>;

template <bool Known>
struct offload_diagnostic {
  static_assert(Known, "dtrain: Offload<...> takes OptimizerState or ParamShards");
};

template <class W>
inline constexpr offload_kind offload_kind_of = std::is_same_v<W, OptimizerState> ? offload_kind::optimizer
                                                : std::is_same_v<W, ParamShards>  ? offload_kind::params
                                                                                  : offload_kind::none;
}  // namespace detail

template <class What>
struct Offload {
  using what = What;
  static constexpr offload_kind kind = detail::offload_kind_of<What>;

 private:
  // The check lives in another class so a failure leaves Offload usable (see policies.hpp).
  static constexpr detail::offload_diagnostic<detail::is_offload_target<What>> diagnostic{};
};

namespace detail {
template <class P>
inline constexpr bool is_offload_slot = false;
template <class W>
inline constexpr bool is_offload_slot<Offload<W>> = true;

template <class P>
inline constexpr bool is_offload_policy = false;
template <class W>
inline constexpr bool is_offload_policy<Offload<W>> = is_offload_target<W>;
}  // namespace detail

template <class P>
concept OffloadPolicy = detail::is_offload_policy<P>;

}  // namespace dtrain
