#pragma once
// AnyStrategy<T>: any TrainingStrategy behind one interface, and
// StrategyFactory: how a Trainer gets one.
//
// The training loop, checkpoint I/O and loss scaling are the same for every
// strategy, so they are compiled once per (model, device, precision) and call
// the strategy through AnyStrategy's virtual hooks (a few calls per unit per
// micro-batch: nothing next to a unit's kernels). A strategy's own code is
// compiled once per (kind, device, dtypes), wherever its factory is made:
//
//   strategy_factory<Kind, Dev, T, R>(options)     // instantiates the strategy
//     -> StrategyFactory<Dev, T>{name, shard_count, make}
//   TrainerCore(world, model, optimizer, options, accumulate, factory)
//     layout padded for factory.shard_count(world)
//     strategy = factory.make(StrategyContext{...})  // unique_ptr<AnyStrategy<T>>
//
// Trainer<M, Strategy<Kind>, ...> makes the factory from its policies; a
// program that picks the strategy at run time (from a config file) makes
// the factories itself and may build them in a translation unit of their own.

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dtrain/comm/world.hpp"
#include "dtrain/policy/strategy.hpp"
#include "dtrain/strategy/strategy.hpp"

namespace dtrain {

template <class T>
class AnyStrategy {
 public:
  explicit AnyStrategy(std::string_view name) : name_(name) {}
  AnyStrategy(const AnyStrategy&) = delete;
  AnyStrategy& operator=(const AnyStrategy&) = delete;
  virtual ~AnyStrategy() = default;

  // The kind's name (Kind::name): what checkpoints record and logs print.
  std::string_view name() const { return name_; }

  // The TrainingStrategy hooks (strategy/strategy.hpp says when each runs).
  virtual void before_forward(std::size_t u, int k) = 0;
  virtual void after_forward(std::size_t u, int k) = 0;
  virtual void before_backward(std::size_t u, int k) = 0;
  virtual void after_backward(std::size_t u, int k) = 0;
  virtual UnitParams<const T> params(std::size_t u) = 0;
  virtual UnitParams<T> grads(std::size_t u) = 0;
  virtual void finish_gradients() = 0;
  virtual double grad_norm_squared() = 0;
  virtual OwnedFlat<T> owned() = 0;
  virtual void after_optimizer() = 0;
  virtual void read_unit(std::size_t u, std::span<float> train, std::span<T> frozen) = 0;
  virtual Ownership ownership() const = 0;
  virtual std::span<T> frozen_storage() = 0;
  virtual void after_load() = 0;

 private:
  std::string_view name_;
};

// S behind AnyStrategy<T>; impl() is the strategy itself (for its own
// accessors: Trainer::strategy() returns it).
template <class S, class T>
class StrategyModel final : public AnyStrategy<T> {
 public:
  template <class Dev>
  StrategyModel(std::string_view name, const StrategyContext<Dev>& ctx, const strategy_options_t<S>& options)
      : AnyStrategy<T>(name), impl_(ctx, options) {}

  S& impl() { return impl_; }

  void before_forward(std::size_t u, int k) override { impl_.before_forward(u, k); }
  void after_forward(std::size_t u, int k) override { impl_.after_forward(u, k); }
  void before_backward(std::size_t u, int k) override { impl_.before_backward(u, k); }
  void after_backward(std::size_t u, int k) override { impl_.after_backward(u, k); }
  UnitParams<const T> params(std::size_t u) override { return impl_.params(u); }
  UnitParams<T> grads(std::size_t u) override { return impl_.grads(u); }
  void finish_gradients() override { impl_.finish_gradients(); }
  double grad_norm_squared() override { return impl_.grad_norm_squared(); }
  OwnedFlat<T> owned() override { return impl_.owned(); }
  void after_optimizer() override { impl_.after_optimizer(); }
  void read_unit(std::size_t u, std::span<float> train, std::span<T> frozen) override {
    impl_.read_unit(u, train, frozen);
  }
  Ownership ownership() const override { return impl_.ownership(); }
  std::span<T> frozen_storage() override { return impl_.frozen_storage(); }
  void after_load() override { impl_.after_load(); }

 private:
  S impl_;
};

// How a TrainerCore gets its strategy: the kind's name, the shard count the
// layout is padded for (it validates the options first), and the maker.
template <class Dev, class T>
struct StrategyFactory {
  std::string_view name;
  std::function<std::size_t(const World&)> shard_count;
  std::function<std::unique_ptr<AnyStrategy<T>>(const StrategyContext<Dev>&)> make;
  // The most the strategy can offload (its max_offload; none when undeclared).
  offload_kind max_offload = offload_kind::none;
};

namespace detail {
// One diagnostic for the first way a strategy class falls short and none
// after it: the caller compiles the factory only when this returns true.
template <class S, class Dev, class T>
constexpr bool check_strategy_class() {
  if constexpr (std::is_same_v<S, missing_strategy>) return false;  // strategy_impl said why
  static_assert(std::is_same_v<S, missing_strategy> || TrainingStrategy<S, T>,
                "dtrain: the strategy class does not model dtrain::TrainingStrategy<S, T>: it needs every hook of "
                "strategy/strategy.hpp's concept, and shard_count(const World&, const S::options&)");
  if constexpr (std::is_same_v<S, missing_strategy> || !TrainingStrategy<S, T>) {
    return false;
  } else {
    constexpr bool constructible =
        std::is_constructible_v<S, const StrategyContext<Dev>&, const strategy_options_t<S>&>;
    static_assert(constructible,
                  "dtrain: the strategy class needs a constructor S(const StrategyContext<Dev>&, const "
                  "S::options&) (const NoStrategyOptions& when it declares no options)");
    return constructible;
  }
}
}  // namespace detail

// The factory for Strategy<Kind> on device Dev, compute dtype T, reduce dtype
// R: where the strategy's code is instantiated.
template <class Kind, class Dev, class T, class R>
StrategyFactory<Dev, T> strategy_factory(
    strategy_options_t<typename strategy_impl<Kind, Dev, T, R>::type> options = {}) {
  using S = typename strategy_impl<Kind, Dev, T, R>::type;
  if constexpr (!detail::check_strategy_class<S, Dev, T>()) {
    return {};
  } else {
    return {Kind::name,
            [options](const World& world) { return static_cast<std::size_t>(S::shard_count(world, options)); },
            [options](const StrategyContext<Dev>& ctx) -> std::unique_ptr<AnyStrategy<T>> {
              return std::make_unique<StrategyModel<S, T>>(Kind::name, ctx, options);
            },
            strategy_max_offload<S>()};
  }
}

}  // namespace dtrain
