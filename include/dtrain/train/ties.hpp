#pragma once
// Tied parameters (ModelLayout::ties()): one stored weight read by two units.
// A unit with ties gets its views in declaration order, the ties' from
// buffers held here: `value`, the owner's values copied when the owner's unit
// runs forward (every strategy's views of a unit are valid then, gathered or
// not), and `grad`, where the tied unit's backward writes, added into the
// owner's gradient right after the owner's backward, before the strategy
// accumulates or reduces it. One stored weight, one gradient, one optimizer
// state.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/strategy/any_strategy.hpp"

namespace dtrain {

template <class Dev, class T>
class TiedParams {
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  TiedParams(Dev& dev, const ModelLayout& layout, AnyStrategy<T>& strategy);

  // Unit u's parameter (gradient) views in declaration order.
  UnitParams<const T> params(std::size_t u);
  UnitParams<T> grads(std::size_t u);

  // Before unit u's forward: the values of the weights it owns and others read.
  void before_forward(std::size_t u);

  // After unit u's backward: the gradients the tied units wrote, into its own.
  void after_backward(std::size_t u);

 private:
  struct Buffers {
    buffer<T> value;
    buffer<T> grad;  // empty when the owner is frozen
  };

  static MatView<T> view(const TiedSlot& tie, buffer<T>& b);

  // The stored views with each tie's view (tie_of(t)) at its index; the
  // stored ones themselves for a unit without ties.
  template <class E, class TieOf>
  std::span<const MatView<E>> spliced(std::size_t u, std::span<const MatView<E>> stored,
                                      std::vector<std::vector<MatView<E>>>& out, TieOf tie_of) {
    if (plan_.empty() || plan_[u].empty()) return stored;
    auto& views = out[u];
    views.clear();
    for (const std::ptrdiff_t i : plan_[u])
      views.push_back(i >= 0 ? stored[static_cast<std::size_t>(i)] : tie_of(static_cast<std::size_t>(-1 - i)));
    return views;
  }

  Dev& dev_;
  const ModelLayout& layout_;
  AnyStrategy<T>& strategy_;
  std::vector<Buffers> buffers_;                   // one per layout.ties()
  std::vector<std::vector<std::ptrdiff_t>> plan_;  // per unit with ties: stored position, or -1 - tie
  std::vector<std::vector<MatView<const T>>> params_;
  std::vector<std::vector<MatView<T>>> grads_;
};

template <class Dev, class T>
TiedParams<Dev, T>::TiedParams(Dev& dev, const ModelLayout& layout, AnyStrategy<T>& strategy)
    : dev_(dev), layout_(layout), strategy_(strategy) {
  const auto& ties = layout.ties();
  if (ties.empty()) return;
  const std::size_t units = layout.units().size();
  plan_.resize(units);
  params_.resize(units);
  grads_.resize(units);
  // A unit's plan, by declaration index: the tie's -1 - t, or (numbered
  // below) the position among the strategy's stored views.
  constexpr std::ptrdiff_t stored = std::numeric_limits<std::ptrdiff_t>::max();
  for (const TiedSlot& tie : ties) {
    const auto n = static_cast<std::size_t>(tie.spec.numel());
    Buffers& b = buffers_.emplace_back();
    b.value = make_buffer<T>(dev, n, memory_category::gathered);
    if (tie.spec.trainable) b.grad = make_buffer<T>(dev, n, memory_category::grads);
    auto& plan = plan_[tie.unit];
    if (plan.empty()) plan.assign(layout.units()[tie.unit].params.size(), stored);
    plan.push_back(stored);  // one more declared parameter
  }
  for (std::size_t t = 0; t < ties.size(); ++t)
    plan_[ties[t].unit][ties[t].index] = -1 - static_cast<std::ptrdiff_t>(t);
  for (auto& plan : plan_) {
    std::ptrdiff_t next = 0;
    for (auto& i : plan)
      if (i == stored) i = next++;
  }
}

template <class Dev, class T>
auto TiedParams<Dev, T>::params(std::size_t u) -> UnitParams<const T> {
  return spliced<const T>(u, strategy_.params(u), params_,
                          [&](std::size_t t) { return MatView<const T>(view(layout_.ties()[t], buffers_[t].value)); });
}

template <class Dev, class T>
auto TiedParams<Dev, T>::grads(std::size_t u) -> UnitParams<T> {
  return spliced<T>(u, strategy_.grads(u), grads_,
                    [&](std::size_t t) { return view(layout_.ties()[t], buffers_[t].grad); });
}

template <class Dev, class T>
auto TiedParams<Dev, T>::before_forward(std::size_t u) -> void {
  const auto& ties = layout_.ties();
  for (std::size_t t = 0; t < ties.size(); ++t)
    if (ties[t].owner_unit == u)
      dev_.copy(buffers_[t].value.data(), strategy_.params(u)[ties[t].owner_position].data, buffers_[t].value.size());
}

template <class Dev, class T>
auto TiedParams<Dev, T>::after_backward(std::size_t u) -> void {
  const auto& ties = layout_.ties();
  for (std::size_t t = 0; t < ties.size(); ++t)
    if (ties[t].owner_unit == u && buffers_[t].grad.size() != 0)
      dev_.for_each(buffers_[t].grad.size(),
                    AddInto<T>{strategy_.grads(u)[ties[t].owner_position].data, buffers_[t].grad.data()});
}

template <class Dev, class T>
auto TiedParams<Dev, T>::view(const TiedSlot& tie, buffer<T>& b) -> MatView<T> {
  if (b.size() == 0) return {};
  const std::int64_t rows = tie.spec.shape[0];
  return {b.data(), rows, tie.spec.numel() / rows};
}

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_TIES_TEMPLATES(X, Dev, T) X(class TiedParams<Dev, T>)

}  // namespace dtrain
