#pragma once
// ZeRO stage 1: parameters and gradients are replicated as under DDP; the
// fp32 master weights and the optimizer state are split between all ranks
// (each unit padded to a multiple of the world size, shard s_u = padded_u / W).
//
// One step (Accumulate<A>):
//   forward    k = 0 after an update: gather(u) casts this rank's updated master
//              shard into its slot of the replicated parameters (T) and
//              all-gathers in place; the next units are gathered ahead
//              (prefetch) while u computes
//   backward   each unit's gradient is accumulated in fp32 as under DDP; on the
//              last micro-batch it is reduce-scattered (in R) into the rank's
//              fp32 gradient shard as soon as the unit's backward returns,
//              overlapping the backward of earlier units
//   step       the optimizer updates only the rank's shards; every unit is
//              marked stale for the next forward's gather
// Compared with DDP the same bytes cross the network (reduce-scatter +
// all-gather = all-reduce) and the optimizer state shrinks to 1/W.
// Offload<OptimizerState> (offload/arena.hpp): master and gradient shards
// and the optimizer state on the host; each reduced shard goes down as its
// reduce-scatter completes, and a unit's updated compute-dtype shard goes up
// into its slot just before the unit's all-gather.

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "dtrain/comm/binding.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/reduce.hpp"
#include "dtrain/model/init.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/policy/strategy.hpp"
#include "dtrain/strategy/ddp.hpp"
#include "dtrain/strategy/sharded.hpp"
#include "dtrain/strategy/strategy.hpp"

namespace dtrain {

// Strategy<ZeRO1>'s options.
struct Zero1Options {
  // Updated-parameter all-gathers issued ahead of the unit that computes.
  int prefetch = 1;
};

template <class Dev, Dtype T, Dtype R>
class Zero1Strategy {
  using binding = CommBinding<Dev>;
  template <class E>
  using buffer = typename Dev::template buffer<E>;
  // The reduce-scatter reads the fp32 accumulator directly when R is fp32.
  static constexpr bool stage_in_r = !std::is_same_v<R, float>;

 public:
  using options = Zero1Options;
  static constexpr offload_kind max_offload = offload_kind::optimizer;

  static std::size_t shard_count(const World& world, const options& options);

  Zero1Strategy(const StrategyContext<Dev>& ctx, const options& opts)
      : dev_(ctx.dev),
        layout_(ctx.layout),
        prefetch_(opts.prefetch),
        last_micro_batch_(ctx.accumulate - 1),
        shards_(ctx, ctx.world.size(), memory_category::master, false,
                ShardedState<Dev, T, R>::shard_source::host_shard),
        grads_(dev_, layout_, ctx.accumulate),
        stale_(layout_.units().size()),
        gathering_(layout_.units().size()),
        gathers_(layout_.units().size()) {
    mark_stale();
    params_ = make_buffer<T>(dev_, layout_.trainable_flat_size(), memory_category::params);
    frozen_ = make_buffer<T>(dev_, layout_.frozen_flat_size(), memory_category::params);
    if constexpr (stage_in_r)
      staging_ = make_buffer<R>(dev_, layout_.trainable_flat_size(), zero_init, memory_category::grads);
    // Offloaded, the reduced shards land on the device before going down.
    if (stage_in_r || shards_.offload) shard_r_ = make_buffer<R>(dev_, shards_.params.size(), memory_category::grads);
    init_frozen(ctx.seed);
    for (const auto& unit : layout_.units()) {
      auto& pv = views_.emplace_back();
      detail::unit_views(unit, params_.data() + unit.train_offset, frozen_.data() + unit.frozen_offset, pv,
                         &grad_views_.emplace_back(), grads_.compute() + unit.train_offset);
      const_views_.push_back(detail::as_const(pv));
    }
  }

  void before_forward(std::size_t u, int);
  void after_forward(std::size_t, int) {}
  void before_backward(std::size_t, int) {}
  void after_backward(std::size_t u, int k);
  UnitParams<const T> params(std::size_t u) const { return const_views_[u]; }
  UnitParams<T> grads(std::size_t u) const { return grad_views_[u]; }

  void finish_gradients() { shards_.reducer.drain(); }

  double grad_norm_squared();

  OwnedFlat<T> owned();
  const ShardGroups<Dev>& groups() const { return shards_.groups; }
  void after_optimizer();
  std::span<T> frozen_storage() { return frozen_.span(); }
  void after_load();

  void read_unit(std::size_t u, std::span<float> train, std::span<T> frozen);

  // This rank's master/optimizer shard of every unit (it writes them); the
  // frozen parameters are replicated and rank 0 writes them.
  Ownership ownership() const;

 private:
  void gather(std::size_t u);

  void mark_stale();

  // Frozen parameters are replicated; every rank computes them from the seed.
  void init_frozen(std::uint64_t seed);

  Dev& dev_;
  const ModelLayout& layout_;
  int prefetch_;
  int last_micro_batch_;
  ShardedState<Dev, T, R> shards_;  // this rank's fp32 master and reduced gradient shards
  detail::FullGradients<Dev, T> grads_;
  buffer<T> params_;             // replicated compute-dtype parameters (padded per unit)
  buffer<T> frozen_;             // replicated frozen parameters
  buffer<R> staging_;            // R != fp32: the accumulated gradient cast for the reduce-scatter
  buffer<R> shard_r_;            // R != fp32 or offloaded: reduced shards before the fp32 cast
  std::vector<bool> stale_;      // the unit's parameters predate the last update
  std::vector<bool> gathering_;  // its gather is in flight
  std::vector<typename ShardedParams<Dev, T>::Gather> gathers_;
  std::vector<std::vector<MatView<T>>> views_;
  std::vector<std::vector<MatView<T>>> grad_views_;
  std::vector<std::vector<MatView<const T>>> const_views_;
};

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::shard_count(const World& world, const options& options) -> std::size_t {
  detail::check_prefetch("Zero1Options", options.prefetch);
  return static_cast<std::size_t>(world.size());
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::before_forward(std::size_t u, int) -> void {
  if (layout_.units()[u].train_size == 0) return;
  if (stale_[u]) gather(u);
  detail::look_ahead(
      layout_, u, false, prefetch_, [&](std::size_t v) { return bool(stale_[v]); },
      [&](std::size_t v) { return gather(v), true; });
  if (gathering_[u]) {
    gathers_[u].join(dev_);
    gathering_[u] = false;
  }
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::after_backward(std::size_t u, int k) -> void {
  grads_.accumulate(u, k);
  const auto& unit = layout_.units()[u];
  if (k != last_micro_batch_ || unit.train_size == 0) return;
  const float* full = grads_.f32() + unit.train_offset;
  const std::size_t at = unit.train_offset / layout_.shards();
  if constexpr (stage_in_r) {
    dev_.for_each(unit.train_size, Cast<float, R>{full, staging_.data() + unit.train_offset});
    shards_.reducer.submit(u, 0, staging_.data() + unit.train_offset, shard_r_.data() + at);
  } else if (shards_.offload) {
    shards_.reducer.submit(u, 0, full, shard_r_.data() + at);
  } else {
    shards_.reducer.submit(u, 0, full, shards_.grad_shard.data() + at);
  }
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::grad_norm_squared() -> double {
  return shards_.grad_norm_squared(dev_);
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::owned() -> OwnedFlat<T> {
  return shards_.owned();
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::after_optimizer() -> void {
  shards_.params.after_update();
  mark_stale();
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::after_load() -> void {
  shards_.params.after_load();
  mark_stale();
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::read_unit(std::size_t u, std::span<float> train, std::span<T> frozen) -> void {
  const auto& unit = layout_.units()[u];
  shards_.params.read_unit(u, train, {});
  dev_.copy_to_host(frozen.data(), frozen_.data() + unit.frozen_offset, unit.frozen_size);
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::ownership() const -> Ownership {
  Ownership o;
  const std::size_t W = layout_.shards(), g = static_cast<std::size_t>(shards_.groups.rank());
  for (std::size_t u = 0; u < layout_.units().size(); ++u) {
    const auto& unit = layout_.units()[u];
    const std::size_t s = unit.train_padded / W;
    const std::size_t first = std::min(unit.train_size, g * s);
    if (const std::size_t count = std::min(unit.train_size, first + s) - first)
      o.trainable.push_back({u, first, count, unit.train_offset / W, true});
    if (unit.frozen_size) o.frozen.push_back({u, 0, unit.frozen_size, unit.frozen_offset, g == 0});
  }
  return o;
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::gather(std::size_t u) -> void {
  const auto& unit = layout_.units()[u];
  gathers_[u] = shards_.params.gather(u, params_.data() + unit.train_offset, nullptr);
  stale_[u] = false;
  gathering_[u] = true;
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::mark_stale() -> void {
  for (std::size_t u = 0; u < stale_.size(); ++u) stale_[u] = layout_.units()[u].train_size != 0;
}

template <class Dev, Dtype T, Dtype R>
auto Zero1Strategy<Dev, T, R>::init_frozen(std::uint64_t seed) -> void {
  std::vector<float> train, frozen;
  std::vector<T> frozen_t;
  for (const auto& unit : layout_.units()) {
    if (unit.frozen_size == 0) continue;
    train.resize(unit.train_padded);
    frozen.resize(unit.frozen_padded);
    init_unit_values(unit, seed, train, frozen);
    frozen_t.resize(unit.frozen_padded);
    for (std::size_t i = 0; i < frozen.size(); ++i) frozen_t[i] = dtype_cast<T>(frozen[i]);
    dev_.copy_from_host(frozen_.data() + unit.frozen_offset, frozen_t.data(), frozen_t.size());
  }
}

template <class Dev, class T, class R>
struct strategy_impl<ZeRO1, Dev, T, R> {
  using type = Zero1Strategy<Dev, T, R>;
};

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_ZERO1_TEMPLATES(X, Dev, T, R) X(class Zero1Strategy<Dev, T, R>)

}  // namespace dtrain
