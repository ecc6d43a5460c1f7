#pragma once
// FSDP: each unit's parameters, gradients and optimizer state are split
// between the G ranks of a shard group; a unit's parameters exist in full
// only while it computes.
//
// Per rank: the fp32 master shards of every unit (one flat, s_u = padded_u / G
// elements per unit), the fp32 gradient shards beside them, the optimizer
// state over that flat, frozen shards in the compute dtype T, and a few
// unit-sized buffers: gathered parameters and unsharded gradients.
//
// One micro-batch k (units u = 0..U-1):
//   before_forward(u)   gather(u) unless prefetched: cast the master shard into
//                       this rank's slot of a gathered buffer (T), all-gather in
//                       place over the shard group; gather the next units ahead
//                       (prefetch) while u computes; wait for u's gather
//   after_forward(u)    FullShard / HybridShard: free u's buffer (except the last
//                       unit, whose backward comes next)
//   before_backward(u)  the same gather (a re-gather under FullShard); a gradient
//                       buffer for u from the ShardReducer
//   after_backward(u)   (cast T -> R) reduce-scatter u's gradient over the shard
//                       group, all-reduce the shard over the replica group
//                       (HybridShard, NoShard), add it into the fp32 gradient
//                       shard: all asynchronous, overlapping the backward of u-1;
//                       free u's gathered buffer (ShardGradOp / NoShard: only on
//                       the last micro-batch)
// Step: drain the reductions; the squared norm sums the shard group's shards;
// the optimizer updates the rank's shards only. No compute-dtype shard is
// kept: the next gather casts the updated master shard.
//
// Offload (offload/arena.hpp): the fp32 master and gradient shards and the
// optimizer state live on the host; each unit's reduced gradient shard goes
// down as its reduction completes. Offload<OptimizerState> keeps a
// compute-dtype shard on the device, uploaded after each update, that gathers
// copy from; Offload<ParamShards> keeps it on the host too and uploads a
// unit's shard just before its gather (inside the prefetch look-ahead).
//
// The four modes are two choices (docs/design.md):
//   FullShard     G = world     reshard after forward
//   ShardGradOp   G = world     keep from forward to the end of backward
//   NoShard       G = 1         keep (FSDP's machinery, DDP's results)
//   HybridShard   G = group     reshard after forward (group: ShardingOptions::shard_group,
//                               default the ranks of a node)

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "dtrain/comm/binding.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/reduce.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/policy/strategy.hpp"
#include "dtrain/strategy/sharded.hpp"
#include "dtrain/strategy/strategy.hpp"

namespace dtrain {

// Strategy<FSDP<Mode>>'s options.
struct FsdpOptions {
  // HybridShard: ranks per shard group (it must divide the world size); 0
  // takes the ranks of one node (LOCAL_WORLD_SIZE). The other modes ignore it.
  int shard_group = 0;
  // Unit all-gathers issued ahead of the unit that computes. FullShard and
  // HybridShard then hold at most prefetch + 1 gathered units.
  int prefetch = 1;
};

template <class Mode, class Dev, Dtype T, Dtype R>
class FsdpStrategy {
  using binding = CommBinding<Dev>;
  template <class E>
  using buffer = typename Dev::template buffer<E>;

  static constexpr bool reshard_after_forward = std::is_same_v<Mode, FullShard> || std::is_same_v<Mode, HybridShard>;
  using shard_source = typename ShardedState<Dev, T, R>::shard_source;

 public:
  using options = FsdpOptions;
  static constexpr offload_kind max_offload = offload_kind::params;

  static std::size_t shard_count(const World& world, const options& options);

  FsdpStrategy(const StrategyContext<Dev>& ctx, const options& opts)
      : dev_(ctx.dev),
        layout_(ctx.layout),
        prefetch_(opts.prefetch),
        last_micro_batch_(ctx.accumulate - 1),
        shards_(ctx, static_cast<int>(ctx.layout.shards()),
                std::is_same_v<T, float> ? memory_category::params : memory_category::master, true,
                ctx.offload && ctx.offload->params() ? shard_source::host_shard : shard_source::device_shard,
                ctx.accumulate),
        units_(layout_.units().size()) {
    std::size_t params_units = 0;
    for (const auto& unit : layout_.units()) {
      params_units += unit.has_params() ? 1 : 0;
      if (unit.has_params()) last_params_unit_ = static_cast<std::size_t>(&unit - layout_.units().data());
      max_train_ = std::max(max_train_, unit.train_padded);
    }
    // FullShard and HybridShard hold the unit computing plus the prefetched
    // ones; the keeping modes hold every unit until its last backward.
    live_limit_ = reshard_after_forward ? static_cast<std::size_t>(prefetch_) + 1 : params_units;
    if constexpr (!std::is_same_v<T, R>) unit_grad_ = make_buffer<T>(dev_, max_train_, memory_category::gathered);
  }

  void before_forward(std::size_t u, int k) { use(u, false, k); }
  void after_forward(std::size_t u, int);
  void before_backward(std::size_t u, int k);
  void after_backward(std::size_t u, int k);
  UnitParams<const T> params(std::size_t u) const { return units_[u].const_views; }
  UnitParams<T> grads(std::size_t u) const { return units_[u].grad_views; }

  void finish_gradients() { shards_.reducer.drain(); }

  double grad_norm_squared();

  OwnedFlat<T> owned();
  // Not offloaded, the next gather casts the updated master shards;
  // offloaded, the updated compute-dtype shards go up (or wait for their gather).
  void after_optimizer() { shards_.params.after_update(); }
  std::span<T> frozen_storage() { return {shards_.params.frozen(), layout_.frozen_flat_size() / layout_.shards()}; }
  // Between steps nothing is gathered: the next gathers read what was loaded.
  void after_load() { shards_.params.after_load(); }

  void read_unit(std::size_t u, std::span<float> train, std::span<T> frozen) {
    shards_.params.read_unit(u, train, frozen);
  }

  // This rank's shard of every unit; copy 0 of each shard (the first shard
  // group) writes it.
  Ownership ownership() const;

  const ShardGroups<Dev>& groups() const { return shards_.groups; }
  // Gathered units alive at once at most so far (the buffers never shrink).
  std::size_t gathered_units_peak() const { return slots_.size(); }
  // Unit all-gathers issued so far (a FullShard unit is gathered for its
  // forward and again for its backward).
  std::size_t gathers_issued() const { return gathers_issued_; }

 private:
  struct Slot {
    buffer<T> train, frozen;  // a unit's gathered segments (grow to the largest unit held)
    bool busy = false;
  };
  struct UnitState {
    std::ptrdiff_t slot = -1;  // gathered into slots_[slot]
    bool gathering = false;    // a gather is in flight
    typename ShardedParams<Dev, T>::Gather gather;
    std::vector<MatView<T>> views;
    std::vector<MatView<const T>> const_views;
    std::vector<MatView<T>> grad_views;  // set for the unit's backward
  };

  // [first, first + count): the real (unpadded) part of shard g of a segment.
  static std::pair<std::size_t, std::size_t> shard_range(std::size_t size, std::size_t s, std::size_t g);

  // Unit u is about to compute: its parameters gathered, the next uses
  // prefetched, its gather joined.
  void use(std::size_t u, bool backward, int k);

  bool issue_gather(std::size_t u);

  std::ptrdiff_t acquire();

  void release(std::size_t u);

  Dev& dev_;
  const ModelLayout& layout_;
  int prefetch_;
  int last_micro_batch_;
  ShardedState<Dev, T, R> shards_;
  std::vector<UnitState> units_;
  std::vector<Slot> slots_;
  std::size_t live_limit_ = 0;
  std::size_t last_params_unit_ = 0;
  std::size_t max_train_ = 0;
  std::size_t gathers_issued_ = 0;
  buffer<T> unit_grad_;  // T != R: what backward writes before the cast into the reducer
};

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::shard_count(const World& world, const options& options) -> std::size_t {
  detail::check_prefetch("FsdpOptions", options.prefetch);
  if constexpr (std::is_same_v<Mode, NoShard>) {
    return 1;
  } else if constexpr (std::is_same_v<Mode, HybridShard>) {
    const int group = options.shard_group > 0 ? options.shard_group : world.local_size();
    if (group < 1 || world.size() % group != 0)
      throw config_error("FSDP<HybridShard>: a shard group of " + std::to_string(group) +
                             " ranks does not divide the world of " + std::to_string(world.size()) + " ranks",
                         "set FsdpOptions::shard_group (train_mlp: shard_group=K) to a divisor of the world "
                         "size; the default is the ranks of one node");
    return static_cast<std::size_t>(group);
  } else {
    return static_cast<std::size_t>(world.size());
  }
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::after_forward(std::size_t u, int) -> void {
  if (reshard_after_forward && u != last_params_unit_) release(u);
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::before_backward(std::size_t u, int k) -> void {
  use(u, true, k);
  const auto& unit = layout_.units()[u];
  if (!unit.has_params()) return;
  T* grad = nullptr;  // frozen-only units get empty gradient views
  if (unit.train_size) {
    if constexpr (std::is_same_v<T, R>)
      grad = shards_.reducer.input(u);
    else
      grad = unit_grad_.data();
  }
  UnitState& st = units_[u];
  Slot& slot = slots_[static_cast<std::size_t>(st.slot)];
  detail::unit_views(unit, slot.train.data(), slot.frozen.data(), st.views, &st.grad_views, grad);
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::after_backward(std::size_t u, int k) -> void {
  const auto& unit = layout_.units()[u];
  if (unit.train_size) {
    if constexpr (!std::is_same_v<T, R>)
      dev_.for_each(unit.train_size, Cast<T, R>{unit_grad_.data(), shards_.reducer.input(u)});
    shards_.reducer.submit(u, k);
  }
  if (unit.has_params() && (reshard_after_forward || k == last_micro_batch_)) release(u);
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::grad_norm_squared() -> double {
  return shards_.grad_norm_squared(dev_);
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::owned() -> OwnedFlat<T> {
  return shards_.owned();
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::ownership() const -> Ownership {
  Ownership o;
  const std::size_t G = layout_.shards(), g = static_cast<std::size_t>(shards_.groups.rank());
  const bool writer = shards_.groups.replica_index() == 0;
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const auto& unit = layout_.units()[u];
    if (const auto r = shard_range(unit.train_size, unit.train_padded / G, g); r.second)
      o.trainable.push_back({u, r.first, r.second, unit.train_offset / G, writer});
    if (const auto r = shard_range(unit.frozen_size, unit.frozen_padded / G, g); r.second)
      o.frozen.push_back({u, r.first, r.second, unit.frozen_offset / G, writer});
  }
  return o;
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::shard_range(std::size_t size, std::size_t s, std::size_t g)
    -> std::pair<std::size_t, std::size_t> {
  const std::size_t first = std::min(size, g * s);
  return {first, std::min(size, first + s) - first};
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::use(std::size_t u, bool backward, int k) -> void {
  if (!layout_.units()[u].has_params()) return;
  if (units_[u].slot < 0 && !issue_gather(u))
    throw error("FSDP: no gathered buffer free for unit " + std::to_string(u) + " (internal limit " +
                    std::to_string(live_limit_) + ")",
                "report this as a dtrain bug");
  detail::look_ahead(
      layout_, detail::use_position(layout_.units().size(), u, backward), k < last_micro_batch_, prefetch_,
      [&](std::size_t v) { return units_[v].slot < 0; }, [&](std::size_t v) { return issue_gather(v); });
  if (units_[u].gathering) {
    units_[u].gather.join(dev_);
    units_[u].gathering = false;
  }
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::issue_gather(std::size_t u) -> bool {
  const std::ptrdiff_t i = acquire();
  if (i < 0) return false;
  Slot& slot = slots_[static_cast<std::size_t>(i)];
  const auto& unit = layout_.units()[u];
  detail::grow_unit_buffer<Dev, T>(dev_, slot.train, unit.train_padded);
  detail::grow_unit_buffer<Dev, T>(dev_, slot.frozen, unit.frozen_padded);
  UnitState& st = units_[u];
  st.slot = i;
  st.gather = shards_.params.gather(u, slot.train.data(), slot.frozen.data());
  st.gathering = true;
  ++gathers_issued_;
  detail::unit_views(unit, slot.train.data(), slot.frozen.data(), st.views);
  st.const_views = detail::as_const(st.views);
  return true;
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::acquire() -> std::ptrdiff_t {
  for (std::size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].busy) {
      slots_[i].busy = true;
      return static_cast<std::ptrdiff_t>(i);
    }
  if (slots_.size() >= live_limit_) return -1;
  slots_.emplace_back().busy = true;
  return static_cast<std::ptrdiff_t>(slots_.size() - 1);
}

template <class Mode, class Dev, Dtype T, Dtype R>
auto FsdpStrategy<Mode, Dev, T, R>::release(std::size_t u) -> void {
  UnitState& st = units_[u];
  if (st.slot < 0) return;
  slots_[static_cast<std::size_t>(st.slot)].busy = false;
  st.slot = -1;
}

template <class Mode, class Dev, class T, class R>
struct strategy_impl<FSDP<Mode>, Dev, T, R> {
  using type = FsdpStrategy<Mode, Dev, T, R>;
};

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_FSDP_TEMPLATES(X, Dev, T, R)     \
  X(class FsdpStrategy<FullShard, Dev, T, R>)   \
  X(class FsdpStrategy<ShardGradOp, Dev, T, R>) \
  X(class FsdpStrategy<NoShard, Dev, T, R>) X(class FsdpStrategy<HybridShard, Dev, T, R>)

}  // namespace dtrain
