#pragma once
// The user-model concepts.
//
// A model is an ordered sequence of units plus a loss. A unit is the grain of
// everything the library does: one flat parameter buffer, one gradient
// bucket boundary, one FSDP wrap unit. A unit declares its parameters and
// computes forward and backward on views; it never allocates parameters,
// gradients or activations (the library owns them all).
//
//   struct MyUnit {
//     std::vector<dtrain::ParamSpec> params() const;           // declaration order = layout order
//     std::int64_t out_features(std::int64_t in) const;        // shape inference
//     template <class Dev, class T>
//     void forward(Dev&, dtrain::UnitParams<const T>, dtrain::MatView<const T> x, dtrain::MatView<T> y);
//     template <class Dev, class T>
//     void backward(Dev&, dtrain::UnitParams<const T> p, dtrain::UnitParams<T> grad,
//                   dtrain::MatView<const T> x, dtrain::MatView<const T> y,
//                   dtrain::MatView<const T> dy, dtrain::MatView<T> dx);
//   };
//
// backward OVERWRITES grad[i] with this micro-batch's gradient; grad[i] is
// empty (data == nullptr) for a frozen parameter, which the unit must skip.
// dx is empty for the first unit (no input gradient is needed there).
// The loss normaliser is already folded into dy by the library.
//
// A model:
//   struct MyModel {
//     auto units() { return std::tie(l1, act, l2); }   // a tuple of unit references
//     dtrain::nn::SoftmaxCrossEntropy loss;             // or any Loss
//   };
// A tuple element may also be a range of units (std::vector<Block>&): N
// identical blocks, or layers whose number is only known at run time
// (std::vector<dtrain::nn::AnyUnit>). Units are numbered in order, ranges
// expanded; "<number>.<param>" names every parameter.

#include <concepts>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"

namespace dtrain {

// The parameters (or gradients) of one unit, in declaration order.
template <class T>
using UnitParams = std::span<const MatView<T>>;

template <class U>
concept UnitDeclaration = requires(const U& u, std::int64_t in) {
  { u.params() } -> std::convertible_to<std::vector<ParamSpec>>;
  { u.out_features(in) } -> std::convertible_to<std::int64_t>;
};

// A Unit usable on device Dev with compute dtype T.
template <class U, class Dev, class T>
concept Unit = UnitDeclaration<U> &&
    requires(U& u, Dev& dev, UnitParams<const T> p, UnitParams<T> g, MatView<const T> cx,
             MatView<T> x) {
      u.template forward<Dev, T>(dev, p, cx, x);
      u.template backward<Dev, T>(dev, p, g, cx, cx, cx, x);
    };

// A loss over logits [rows, classes] and integer labels [rows] on the device.
// forward returns the SUM of per-sample losses (host float); backward writes
// dlogits = d(sum loss)/dlogits * scale, where scale = loss_scale / global_count.
template <class L, class Dev, class T>
concept Loss = requires(L& l, Dev& dev, MatView<const T> logits, std::span<const std::int32_t> labels,
                        MatView<T> dlogits, float scale) {
  { l.template forward<Dev, T>(dev, logits, labels) } -> std::convertible_to<double>;
  l.template backward<Dev, T>(dev, logits, labels, dlogits, scale);
};

template <class M>
concept Model = requires(M& m) {
  m.units();
  m.loss;
} && requires { std::tuple_size<std::remove_cvref_t<decltype(std::declval<M&>().units())>>::value; };

}  // namespace dtrain
