#pragma once
// nn::AnyUnit: one of the ready units, chosen at run time. A
// std::vector<AnyUnit> inside a model's units() builds a network whose layer
// list comes from a config file, while every unit still runs through the same
// statically typed code (std::visit dispatches once per unit call).

#include <cstdint>
#include <utility>
#include <variant>
#include <vector>

#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"

namespace dtrain::nn {

class AnyUnit {
 public:
  using variant_type = std::variant<Linear, ReLU, GELU, LayerNorm>;

  template <class U>
    requires std::is_constructible_v<variant_type, U&&>
  AnyUnit(U&& unit) : unit_(std::forward<U>(unit)) {}

  std::vector<ParamSpec> params() const {
    return std::visit([](const auto& u) { return u.params(); }, unit_);
  }
  std::int64_t out_features(std::int64_t in) const {
    return std::visit([&](const auto& u) { return u.out_features(in); }, unit_);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    std::visit([&](auto& u) { u.template forward<Dev, T>(dev, p, x, y); }, unit_);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx) {
    std::visit([&](auto& u) { u.template backward<Dev, T>(dev, p, grad, x, y, dy, dx); }, unit_);
  }

  const variant_type& get() const { return unit_; }

 private:
  variant_type unit_;
};

}  // namespace dtrain::nn
