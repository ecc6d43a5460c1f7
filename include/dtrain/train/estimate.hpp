#pragma once
// Predicts one rank's memory by category before anything is allocated: the
// bytes a Trainer would report in Trainer::memory() (device/buffer.hpp's
// MemoryUsage) for a model, a strategy, a precision and a world size.
//
//   dtrain::EstimateInputs in;
//   in.units = dtrain::declared_units(model);   // any model, nothing allocated
//   in.compute_bytes = 2;                        // bf16
//   in.strategy = "fsdp-full";
//   in.world = 8;
//   in.activations = dtrain::model_activation_bytes(model, {64, 1}, 32, 64 * 4, 2, false);
//   dtrain::MemoryUsage m = dtrain::estimate_memory(in);
//
// The formulas restate, from the model's element counts alone, what each
// strategy allocates (strategy/ddp.hpp, fsdp.hpp, zero1.hpp, sharded.hpp, the
// optimizer state of optim/flat_optimizer.hpp). They deliberately use neither
// the strategies nor ModelLayout: tests compare this estimate with the
// allocator's measurement, and that comparison can only catch a mistake on
// either side if the two are computed independently.
//
// Model states (params, grads, optimizer, master) are exact for every
// strategy, on the device and, with an offload (EstimateInputs::offload), in
// host memory (estimate_memory_split); FSDP's `gathered` is an upper bound
// (see fsdp_gathered below); activations are whatever the caller passes
// (model_activation_bytes works them out for any model).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/policy/offload.hpp"
#include "dtrain/policy/strategy.hpp"
#include "dtrain/strategy/sharded.hpp"
#include "dtrain/train/recompute.hpp"

namespace dtrain {

// One unit's parameter elements as the model declares them (no padding).
struct UnitNumel {
  std::size_t trainable = 0;
  std::size_t frozen = 0;
  // Tied parameters (ParamSpec::tied_to): no storage of their own, but the
  // Trainer keeps the owner's values (gathered) and, when trainable, the
  // tied unit's gradient (grads) beside it, in the compute dtype.
  std::size_t tied_trainable = 0;
  std::size_t tied_frozen = 0;
};

// The strategy names estimate_memory knows: builtin_strategies' names, in
// that order (each is the kind tag's name, as train_mlp's strategy= takes it).
inline constexpr auto estimate_strategies = []<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
  return std::array<std::string_view, sizeof...(Kind)>{Kind::name...};
}(std::type_identity<builtin_strategies>{});

struct EstimateInputs {
  std::vector<UnitNumel> units;  // every unit in unit order, parameter-free ones included
  // Element sizes of the compute dtype T and the reduce dtype R: 4 (fp32) or
  // 2 (bf16, fp16). fp32 is dtrain's only 4-byte dtype, so the size also says
  // whether a separate fp32 copy exists; and since Precision allows R = fp32
  // or R = T (or bf16 under fp32 compute), R differs from T exactly when
  // the sizes differ.
  std::size_t compute_bytes = 4;
  std::size_t reduce_bytes = 4;
  int accumulate = 1;  // micro-batches per optimizer step
  std::string strategy = std::string(DDP::name);
  int world = 1;                     // ranks
  int shard_group = 0;               // fsdp-hybrid only: ranks per shard group (>= 1, divides world)
  int prefetch = 1;                  // FsdpOptions::prefetch, Zero1Options::prefetch
  std::size_t optimizer_states = 2;  // fp32 buffers per element: AdamW 2, SGD with momentum 1, plain SGD 0
  bool param_groups = false;         // more than one parameter group: a group id byte per owned element on a GPU
  std::size_t activations = 0;       // activation bytes, worked out by the caller
  offload_kind offload = offload_kind::none;  // Offload<...> / TrainerOptions::offload
  bool state_on_disk = false;                 // TrainerOptions::offload_dir: the optimizer state in files
};

// One rank's bytes on the compute device and, offloaded, in host memory.
struct MemorySplit {
  MemoryUsage device;
  MemoryUsage host;
  std::size_t disk = 0;  // optimizer state in files (offload to a local disk)
};

namespace detail {

enum class estimate_family { replicated, fsdp, zero1 };

// What a strategy name means for memory: which buffers exist, G, and
// whether gathered parameters are freed after each unit's forward.
struct EstimatePlan {
  estimate_family family = estimate_family::replicated;
  std::size_t shards = 1;
  bool reshard_after_forward = false;
};

inline void require_estimate(bool ok, const std::string& what, const std::string& fix) {
  if (!ok) throw config_error(what, fix);
}

// The plan of each built-in kind (a kind added to builtin_strategies without
// one here does not compile).
inline EstimatePlan plan_of(std::type_identity<DDP>, const EstimateInputs&) {
  return {estimate_family::replicated, 1, false};
}
inline EstimatePlan plan_of(std::type_identity<ZeRO1>, const EstimateInputs& in) {
  return {estimate_family::zero1, static_cast<std::size_t>(in.world), false};
}
template <class Mode>
EstimatePlan plan_of(std::type_identity<FSDP<Mode>>, const EstimateInputs& in) {
  const auto world = static_cast<std::size_t>(in.world);
  if constexpr (std::is_same_v<Mode, NoShard>) {
    return {estimate_family::fsdp, 1, false};
  } else if constexpr (std::is_same_v<Mode, HybridShard>) {
    require_estimate(in.shard_group >= 1 && in.world % in.shard_group == 0,
                     "fsdp-hybrid: a shard group of " + std::to_string(in.shard_group) +
                         " ranks does not divide the world of " + std::to_string(in.world) + " ranks",
                     "give a shard group size that divides the world size (e.g. the ranks of one node)");
    return {estimate_family::fsdp, static_cast<std::size_t>(in.shard_group), true};
  } else {
    return {estimate_family::fsdp, world, std::is_same_v<Mode, FullShard>};
  }
}

inline EstimatePlan estimate_plan(const EstimateInputs& in) {
  EstimatePlan plan;
  const bool found = [&]<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    return ((in.strategy == Kind::name && (plan = plan_of(std::type_identity<Kind>{}, in), true)) || ...);
  }(std::type_identity<builtin_strategies>{});
  if (found) return plan;
  std::string known;
  for (auto name : estimate_strategies) known += (known.empty() ? "" : ", ") + std::string(name);
  throw config_error("strategy '" + in.strategy + "' is unknown", "use one of " + known);
}

inline void validate_estimate(const EstimateInputs& in) {
  const auto dtype_size = [](std::size_t b) { return b == 4 || b == 2; };
  require_estimate(in.world >= 1, "world = " + std::to_string(in.world) + " ranks", "the world needs at least 1 rank");
  require_estimate(dtype_size(in.compute_bytes) && dtype_size(in.reduce_bytes),
                   "dtype sizes " + std::to_string(in.compute_bytes) + " (compute) and " +
                       std::to_string(in.reduce_bytes) + " (reduce) bytes",
                   "use 4 for fp32 and 2 for bf16 or fp16");
  require_estimate(in.accumulate >= 1, "accumulate = " + std::to_string(in.accumulate),
                   "use at least 1 micro-batch per step");
  require_estimate(in.prefetch >= 0, "prefetch = " + std::to_string(in.prefetch), "use 0 (no look-ahead) or more");
  require_estimate(in.optimizer_states <= 2,
                   "optimizer_states = " + std::to_string(in.optimizer_states) + " buffers per element",
                   "AdamW keeps 2, SGD with momentum 1, plain SGD 0");
}

// Element counts after padding every unit's segments to a multiple of G,
// the rule that makes every unit's shard the same size on every rank.
struct PaddedModel {
  std::size_t trainable = 0;  // sum of padded trainable segments (the trainable flat)
  std::size_t frozen = 0;     // the same for frozen segments
  std::size_t max_trainable = 0;
  std::size_t max_frozen = 0;
  std::size_t units_with_params = 0;
  std::size_t units_with_trainable = 0;
};

inline PaddedModel padded_model(const std::vector<UnitNumel>& units, std::size_t shards) {
  const auto pad = [shards](std::size_t n) { return (n + shards - 1) / shards * shards; };
  PaddedModel m;
  for (const UnitNumel& u : units) {
    m.trainable += pad(u.trainable);
    m.frozen += pad(u.frozen);
    m.max_trainable = std::max(m.max_trainable, pad(u.trainable));
    m.max_frozen = std::max(m.max_frozen, pad(u.frozen));
    m.units_with_params += u.trainable + u.frozen != 0 ? 1 : 0;
    m.units_with_trainable += u.trainable != 0 ? 1 : 0;
  }
  return m;
}

// FSDP's transient unit-sized buffers (peak bytes). Gathered parameters:
// the keeping modes (ShardGradOp, NoShard) hold every unit with parameters at
// once, in a buffer of that unit's padded size; the resharding modes
// (FullShard, HybridShard) hold at most prefetch + 1 units, but a buffer is
// reused by other units and grows to the largest it held, so each is counted
// at the largest unit: an upper bound. Gradients: the reducer's slots
// (ShardReducer::max_in_flight, each a full padded gradient + its shard, in
// R) take turns, one per unit with trainable parameters at most, each
// counted at the largest unit; plus a unit gradient in T when T != R
// (backward writes T, the reducer reads R).
inline std::size_t fsdp_gathered(const PaddedModel& m, const EstimatePlan& plan, const EstimateInputs& in) {
  const std::size_t T = in.compute_bytes, R = in.reduce_bytes;
  std::size_t params = (m.trainable + m.frozen) * T;
  if (plan.reshard_after_forward) {
    const std::size_t buffers = std::min<std::size_t>(static_cast<std::size_t>(in.prefetch) + 1, m.units_with_params);
    params = buffers * (m.max_trainable + m.max_frozen) * T;
  }
  const std::size_t reducer_slots = std::min(detail::shard_reducer_max_in_flight, m.units_with_trainable);
  const std::size_t grads = reducer_slots * (m.max_trainable + m.max_trainable / plan.shards) * R;
  const std::size_t unit_grad = T != R ? m.max_trainable * T : 0;
  return params + grads + unit_grad;
}

// What the strategy and optimizer allocate (estimate_memory without ties).
inline MemoryUsage strategy_memory(const EstimateInputs& in, const EstimatePlan& plan, const PaddedModel& m) {
  constexpr std::size_t f32 = 4;
  const std::size_t T = in.compute_bytes, R = in.reduce_bytes, G = plan.shards;
  const bool compute_fp32 = T == f32;
  // What each rank owns and the optimizer updates: the whole trainable flat
  // (G = 1) or its shard of every padded unit.
  const std::size_t owned = m.trainable / G;
  MemoryUsage u;
  u.optimizer = in.optimizer_states * owned * f32 + (in.param_groups ? owned : 0);
  u.activations = in.activations;
  // The Trainer's five staging floats for its scalar all-reduces (its
  // max_scalars; estimate_test checks the two agree), plus one for the
  // sharded strategies' norm all-reduce over the shard group.
  u.other = 5 * f32 + (plan.family == detail::estimate_family::replicated ? 0 : f32);

  if (plan.family == detail::estimate_family::fsdp) {
    // Only fp32 shards persist (the compute copy exists only while
    // gathered); with fp32 compute they are the parameters themselves.
    (compute_fp32 ? u.params : u.master) = owned * f32;
    u.params += m.frozen / G * T;
    u.grads = owned * f32;
    u.gathered = detail::fsdp_gathered(m, plan, in);
    return u;
  }

  // DDP and ZeRO1 keep the full model in T, and what backward writes (T)
  // beside an fp32 accumulator unless it already is one and nothing is
  // accumulated. Under DDP with fp32 compute the fp32 master weights are the
  // parameters; ZeRO1 always keeps a separate fp32 master shard.
  u.params = (m.trainable + m.frozen) * T;
  const bool separate_accumulator = in.accumulate > 1 || !compute_fp32;
  u.grads = m.trainable * T + (separate_accumulator ? m.trainable * f32 : 0);
  const bool stage_in_r = R != f32;  // the reduction reads a cast copy of the fp32 gradient
  if (plan.family == detail::estimate_family::replicated) {
    u.master = compute_fp32 ? 0 : m.trainable * f32;
    u.grads += stage_in_r ? m.trainable * R : 0;
  } else {
    u.master = owned * f32;
    u.grads += owned * f32 + (stage_in_r ? (m.trainable + owned) * R : 0);
  }
  return u;
}

// The same with the optimizer state (and, for FSDP's ParamShards, the
// parameter shards) offloaded to the host (offload/arena.hpp): the fp32
// master and gradient shards, the optimizer state and a compute-dtype copy of
// the shard move to the host; what the device keeps for compute and
// communication stays. The host optimizer runs group by group over runs of
// the flat, so parameter groups cost no table there.
inline MemorySplit offloaded_memory(const EstimateInputs& in, const EstimatePlan& plan, const PaddedModel& m) {
  constexpr std::size_t f32 = 4;
  const std::size_t T = in.compute_bytes, R = in.reduce_bytes, G = plan.shards;
  const std::size_t owned = m.trainable / G;
  const bool stage_in_r = R != f32;
  MemorySplit s;
  MemoryUsage& d = s.device;
  MemoryUsage& h = s.host;
  d.activations = in.activations;
  d.other = 5 * f32 + (plan.family == estimate_family::replicated ? 0 : f32);
  h.master = owned * f32;
  h.params = owned * T;
  (in.state_on_disk ? s.disk : h.optimizer) = in.optimizer_states * owned * f32;
  h.grads = owned * f32;
  if (plan.family == estimate_family::fsdp) {
    d.params = (in.offload == offload_kind::params ? 0 : owned * T) + m.frozen / G * T;
    d.gathered = fsdp_gathered(m, plan, in);
    // Reduced shards are staged on the host in R when they need a cast or a sum.
    h.grads += stage_in_r || in.accumulate > 1 ? owned * R : 0;
    return s;
  }
  d.params = (m.trainable + m.frozen) * T;
  const bool separate_accumulator = in.accumulate > 1 || T != f32;
  d.grads = m.trainable * T + (separate_accumulator ? m.trainable * f32 : 0) + (stage_in_r ? m.trainable * R : 0);
  if (plan.family == estimate_family::zero1) {
    d.grads += owned * R;  // where each reduced shard lands before it goes down
    h.grads += stage_in_r ? owned * R : 0;
  }
  return s;
}

}  // namespace detail

// This rank's bytes by category on the compute device and, with an offload,
// in host memory (Trainer::memory() and Trainer::host_memory() after a step).
// Throws config_error for an unknown strategy, impossible sizes, or an
// offload the strategy cannot do.
inline MemorySplit estimate_memory_split(const EstimateInputs& in) {
  detail::validate_estimate(in);
  const detail::EstimatePlan plan = detail::estimate_plan(in);
  detail::require_estimate(!in.state_on_disk || in.offload != offload_kind::none,
                           "optimizer state on disk without an offload", "offload the optimizer state (or params) too");
  detail::require_estimate(in.offload != offload_kind::params || plan.family == detail::estimate_family::fsdp,
                           "offload 'params' with strategy '" + in.strategy + "', which offloads at most 'optimizer'",
                           "offload parameter shards with an FSDP mode, or offload only the optimizer state");
  const detail::PaddedModel m = detail::padded_model(in.units, plan.shards);
  MemorySplit split;
  if (in.offload == offload_kind::none)
    split.device = detail::strategy_memory(in, plan, m);
  else
    split = detail::offloaded_memory(in, plan, m);
  MemoryUsage& u = split.device;
  const std::size_t T = in.compute_bytes;
  std::size_t tied_trainable = 0, tied_frozen = 0;
  for (const UnitNumel& unit : in.units) {
    tied_trainable += unit.tied_trainable;
    tied_frozen += unit.tied_frozen;
  }
  u.gathered += (tied_trainable + tied_frozen) * T;
  u.grads += tied_trainable * T;
  return split;
}

// This rank's bytes by category on the compute device (what Trainer::memory()
// reports after a step); estimate_memory_split adds the host part.
inline MemoryUsage estimate_memory(const EstimateInputs& in) { return estimate_memory_split(in).device; }

// Each unit's trainable and frozen elements as a model's units declare them.
template <class Model>
std::vector<UnitNumel> declared_units(Model& model) {
  std::vector<UnitNumel> units;
  detail::for_each_unit(model.units(), [&](std::size_t, auto& unit) {
    UnitNumel& u = units.emplace_back();
    for (const ParamSpec& p : unit.params()) {
      const auto n = static_cast<std::size_t>(p.numel());
      if (p.tied_to.empty())
        (p.trainable ? u.trainable : u.frozen) += n;
      else  // the owner's trainability decides; a tie to a frozen owner is rare and reads as trainable here
        (p.trainable ? u.tied_trainable : u.tied_frozen) += n;
    }
  });
  return units;
}

// The Trainer's activation buffers for micro-batches of `shape` through any
// model, from what its units declare (out_features, out_shape, saved_size), in bytes:
// each unit's output (and the input when the first unit is not an input
// unit: in_width > 0; pass 0 for a model starting with nn::Embedding), two
// gradient buffers of the largest activation, what units keep for backward (every
// unit's, or with activation checkpointing the largest of those recomputed,
// which they share in turn, beside the others' own: `checkpoint_every`,
// `checkpoint_units` and `checkpoint_budget_bytes` as TrainerOptions has
// them, train/recompute.hpp), the lanes units write with their gradients
// (model/unit.hpp), and the batch tensors uploaded to the device
// (`batch_bytes`: every tensor but a float x that goes to the first
// activation). Not included: units' transient workspace (attention's
// projections, LayerNorm's row statistics), which the device allocator
// counts under activations too.
template <class Model>
std::size_t model_activation_bytes(Model& model, SeqShape shape, std::int64_t in_width, std::size_t batch_bytes,
                                   std::size_t compute_bytes, bool checkpointing, std::size_t checkpoint_every = 1,
                                   const std::vector<std::size_t>& checkpoint_units = {},
                                   std::size_t checkpoint_budget_bytes = 0) {
  std::vector<std::int64_t> widths{in_width}, saved;
  std::vector<SeqShape> seq{shape};  // each unit's input rows (units may change them: out_shape)
  std::int64_t lanes = 0;            // the lanes' values and gradients
  detail::for_each_unit(model.units(), [&](std::size_t, auto& unit) {
    for (const LaneSpec& l : lanes_written_of(unit, seq.back(), widths.back())) lanes += 2 * l.rows * l.width;
    saved.push_back(saved_size_of(unit, seq.back(), widths.back()));
    widths.push_back(unit.out_features(widths.back()));
    seq.push_back(out_shape_of(unit, seq.back(), shape));
  });
  // recomputed as the Trainer chooses
  const RecomputePolicy policy{.on = checkpointing,
                               .every = checkpoint_every,
                               .units = checkpoint_units,
                               .budget_bytes = checkpoint_budget_bytes};
  detail::check_recompute_policy(policy, saved.size());
  const std::vector<char> recomputed = detail::recomputed_units(saved, compute_bytes, policy);
  std::int64_t kept = 0, shared = 0;
  for (std::size_t u = 0; u < saved.size(); ++u) {
    if (recomputed[u])
      shared = std::max(shared, saved[u]);
    else
      kept += saved[u];
  }
  std::int64_t elements = 0, largest = 0;
  for (std::size_t u = 0; u < widths.size(); ++u) {
    const std::int64_t n = seq[u].rows() * widths[u];
    largest = std::max(largest, n);
    if (u > 0 || in_width > 0) elements += n;
  }
  elements += 2 * largest;
  elements += kept + shared + lanes;
  return static_cast<std::size_t>(elements) * compute_bytes + batch_bytes;
}

}  // namespace dtrain
