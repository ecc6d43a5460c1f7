#pragma once
// The strategy extension point: what a training strategy (DDP, FSDP, ZeRO1,
// or a user's own) provides to the Trainer, which keeps only what every
// strategy shares (micro-batch loop, loss normaliser, precision casts, loss
// scaling, clipping, schedules, stats). docs/design.md draws the data flow.
//
// The Trainer drives a strategy S over units u = 0..U-1 and micro-batches
// k = 0..A-1 in exactly this order:
//
//   for k:  for u:          s.before_forward(u, k);  unit.forward(s.params(u));  s.after_forward(u, k)
//           loss, dlogits
//           for u reversed: s.before_backward(u, k); unit.backward(s.params(u), s.grads(u)); s.after_backward(u, k)
//   s.finish_gradients();  norm2 = s.grad_norm_squared();   (skip / clip decided by the Trainer)
//   optimizer over s.owned();  s.after_optimizer();
//
// A strategy is picked by specialising strategy_impl for its kind tag (any
// tag type with a `static constexpr std::string_view name`: the built-in ones
// and a user's own plug in alike). It is constructed from a StrategyContext
// and its own options (S::options, NoStrategyOptions when it declares none),
// and owns every buffer that holds parameters, gradients or master weights on
// this rank (the optimizer state follows s.owned(), see
// optim/flat_optimizer.hpp). The Trainer reaches it through AnyStrategy
// (strategy/any_strategy.hpp), so the training loop compiles once for every
// strategy.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "dtrain/comm/binding.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/offload/arena.hpp"

namespace dtrain {

// The options of a strategy that declares none.
struct NoStrategyOptions {};

namespace detail {
template <class S>
struct options_of : std::type_identity<NoStrategyOptions> {};
template <class S>
requires requires { typename S::options; }
struct options_of<S> : std::type_identity<typename S::options> {};
}  // namespace detail

// A strategy's run-time settings: S::options (FsdpOptions, DdpOptions, a
// user strategy's own struct), given to the Trainer beside TrainerOptions.
template <class S>
using strategy_options_t = typename detail::options_of<S>::type;

// What the optimizer updates on this rank: `size` fp32 master weights and
// their summed gradient, and (when not null) the compute-dtype copy the
// optimizer pass writes. Padding elements are zero in all of them.
// `on_host`: the three live in host memory (offloaded: the optimizer runs
// on the offload arena's Host, and checkpoints read them directly).
template <class T>
struct OwnedFlat {
  float* master = nullptr;
  const float* grad = nullptr;
  T* param_out = nullptr;
  std::size_t size = 0;
  bool on_host = false;
};

// A run of a unit's flat segment held on this rank: elements
// [begin, begin + count) of the unit's trainable (or frozen) segment, stored at
// `offset` of the rank's owned flat (trainable) or frozen storage. `writer`
// says this rank is the one replica that saves the range in a checkpoint.
struct OwnedRange {
  std::size_t unit = 0;
  std::size_t begin = 0;
  std::size_t count = 0;
  std::size_t offset = 0;
  bool writer = false;
};

struct Ownership {
  std::vector<OwnedRange> trainable;  // master weights, gradients and optimizer state (owned() layout)
  std::vector<OwnedRange> frozen;     // frozen parameters, in the compute dtype
};

// The ownership of a strategy whose every rank holds the whole model (DDP,
// a user's local SGD): every range on every rank, rank 0 the one that saves.
inline Ownership replicated_ownership(const ModelLayout& layout, int rank) {
  Ownership o;
  for (std::size_t u = 0; u < layout.units().size(); ++u) {
    const auto& unit = layout.units()[u];
    if (unit.train_size) o.trainable.push_back({u, 0, unit.train_size, unit.train_offset, rank == 0});
    if (unit.frozen_size) o.frozen.push_back({u, 0, unit.frozen_size, unit.frozen_offset, rank == 0});
  }
  return o;
}

// Everything a strategy is built from.
template <class Dev>
struct StrategyContext {
  World& world;
  Dev& dev;
  const ModelLayout& layout;                   // padded for shard_count(world, options)
  typename CommBinding<Dev>::comm_type& comm;  // the whole world's communicator
  std::uint64_t seed = 0;                      // parameter initialisation
  int accumulate = 1;                          // micro-batches per optimizer step (Accumulate<N>)
  // Offload<...>: where the offloaded states go (null: nothing offloaded).
  // Only strategies declaring max_offload get one (offload/arena.hpp).
  OffloadArena<Dev>* offload = nullptr;
};

namespace detail {
template <class>
inline constexpr bool no_strategy_impl = false;
// What strategy_impl names when no specialisation matched: its static_assert
// is the one diagnostic, and the Trainer compiles nothing more for it.
struct missing_strategy {};
}  // namespace detail

// strategy_impl<Kind, Dev, T, R>::type is the strategy class for kind Kind on
// device Dev, compute dtype T and reduce dtype R (the micro-batch count comes
// at run time, in StrategyContext: it changes decisions, not types, so one
// instantiation serves every Accumulate<N>). Each strategy header specialises
// it for its kind; so does a user's strategy, outside dtrain's headers.
template <class Kind, class Dev, class T, class R>
struct strategy_impl {
  static_assert(detail::no_strategy_impl<Kind>,
                "dtrain: could not build a strategy for these parameters: include the strategy's header "
                "(<dtrain/trainer.hpp> includes DDP, FSDP and ZeRO1) or, for your own kind, specialise "
                "dtrain::strategy_impl<Kind, Dev, T, R> with `using type = YourStrategy<Dev, T, R>;`");
  using type = detail::missing_strategy;
};

// The parameter views a unit computes with and the gradient views it writes.
template <class S, class T>
concept TrainingStrategy = requires(S& s, const S& cs, std::size_t u, int k, std::span<float> f, std::span<T> t) {
  // The number of equal shards each unit's segments are padded for (1: none).
  // It also checks the options: a bad value throws config_error here, before
  // anything is allocated.
  {
    S::shard_count(std::declval<const World&>(), std::declval<const strategy_options_t<S>&>())
    } -> std::convertible_to<std::size_t>;
  s.before_forward(u, k);
  s.after_forward(u, k);
  s.before_backward(u, k);
  s.after_backward(u, k);
  { s.params(u) } -> std::convertible_to<UnitParams<const T>>;
  { s.grads(u) } -> std::convertible_to<UnitParams<T>>;
  s.finish_gradients();
  { s.grad_norm_squared() } -> std::convertible_to<double>;
  { s.owned() } -> std::same_as<OwnedFlat<T>>;
  s.after_optimizer();
  s.read_unit(u, f, t);  // collective when sharded: every rank calls it
  { cs.ownership() } -> std::same_as<Ownership>;
  // The frozen parameters this rank holds (Ownership::frozen's offsets index it).
  { s.frozen_storage() } -> std::same_as<std::span<T>>;
  // owned().master and frozen_storage() were overwritten (a checkpoint or
  // pretrained weights loaded): rebuild whatever is derived from them.
  s.after_load();
};

namespace detail {

// Per-unit parameter and gradient views into flat storage: every parameter
// of a unit is a [shape[0], rest] matrix at its offset in the unit's segment.
template <class T>
void unit_views(const UnitSlots& unit, T* train_base, T* frozen_base, std::vector<MatView<T>>& params,
                std::vector<MatView<T>>* grads = nullptr, T* grad_base = nullptr) {
  params.clear();
  if (grads) grads->clear();
  for (const auto& slot : unit.params) {
    const auto& s = slot.spec;
    const std::int64_t rows = s.shape[0], cols = s.numel() / s.shape[0];
    const std::size_t at = slot.offset - (s.trainable ? unit.train_offset : unit.frozen_offset);
    params.push_back({(s.trainable ? train_base : frozen_base) + at, rows, cols});
    if (grads) grads->push_back(s.trainable ? MatView<T>{grad_base + at, rows, cols} : MatView<T>{});
  }
}

template <class T>
std::vector<MatView<const T>> as_const(const std::vector<MatView<T>>& views) {
  return {views.begin(), views.end()};
}

}  // namespace detail

}  // namespace dtrain
