#pragma once
// nn::OneOf<Us...>: one of several unit types, chosen at run time. A
// std::vector<OneOf<...>> inside a model's units() builds a network whose
// layer list comes from a config file (train_mlp's layers, the blocks of a
// transformers model whose architecture config.json names), while every unit
// still runs through its own statically typed code: std::visit dispatches
// once per unit call. The alternatives may be plain or context units (not
// input units); OneOf passes the context on to those that take it, and the
// rows they write (out_shape) and the lanes they use on to the library.
//
// nn::AnyUnit is OneOf over the ready layers Linear, ReLU, GELU, LayerNorm.

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"

namespace dtrain::nn {

template <class... Us>
class OneOf {
 public:
  using variant_type = std::variant<Us...>;

  template <class U>
  requires(std::same_as<std::remove_cvref_t<U>, Us> || ...) OneOf(U&& unit) : unit_(std::forward<U>(unit)) {}

  std::vector<ParamSpec> params() const {
    return std::visit([](const auto& u) { return u.params(); }, unit_);
  }
  std::int64_t out_features(std::int64_t in) const {
    return std::visit([&](const auto& u) { return u.out_features(in); }, unit_);
  }
  SeqShape out_shape(SeqShape in, SeqShape batch) const {
    return std::visit([&](const auto& u) { return out_shape_of(u, in, batch); }, unit_);
  }
  std::int64_t saved_size(SeqShape s, std::int64_t in) const {
    return std::visit([&](const auto& u) { return saved_size_of(u, s, in); }, unit_);
  }
  std::vector<LaneSpec> lanes_written(SeqShape in, std::int64_t width) const {
    return std::visit([&](const auto& u) { return lanes_written_of(u, in, width); }, unit_);
  }
  std::vector<int> lanes_read() const {
    return std::visit([](const auto& u) { return lanes_read_of(u); }, unit_);
  }
  template <class Dev, class T>
  std::int64_t saved_size_on(Dev& dev, SeqShape s, std::int64_t in) const {
    return std::visit([&](const auto& u) { return saved_size_of<T>(u, dev, s, in); }, unit_);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    std::visit(
        [&]<class U>(U& u) {
          static_assert(!InputUnit<U, Dev, T>, "nn::OneOf holds no input units: put the input unit first in units()");
          dtrain::detail::unit_forward<Dev, T>(u, dev, p, no_batch(), x, y, ctx);
        },
        unit_);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    std::visit(
        [&]<class U>(U& u) { dtrain::detail::unit_backward<Dev, T>(u, dev, p, grad, no_batch(), x, y, dy, dx, ctx); },
        unit_);
  }

  // Without a context, as a hand-written loop calls plain units: rows are
  // taken as sequences of length 1, with nothing saved and no batch.
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    forward<Dev, T>(dev, p, x, y, UnitContext<T>{.shape = {x.rows, 1}});
  }
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx) {
    backward<Dev, T>(dev, p, grad, x, y, dy, dx, UnitContext<T>{.shape = {x.rows, 1}});
  }

  const variant_type& get() const { return unit_; }

 private:
  static const DeviceBatch& no_batch() {
    static const DeviceBatch none{};
    return none;
  }

  variant_type unit_;
};

using AnyUnit = OneOf<Linear, ReLU, GELU, LayerNorm>;

}  // namespace dtrain::nn
