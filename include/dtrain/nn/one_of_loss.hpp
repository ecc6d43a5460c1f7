#pragma once
// nn::OneOfLoss<L...>: a loss chosen at run time among compile-time
// alternatives, itself a dtrain::Loss. A model that trains under more than
// one objective (hf::CausalLm: next-token cross-entropy, or a preference
// loss for DPO) holds one and compiles one Trainer for all of them:
//
//   model.loss = nn::PreferenceLoss({.beta = 0.1f});
//   if (auto* p = model.loss.get_if<nn::PreferenceLoss>()) p->take_sums();

#include <type_traits>
#include <utility>
#include <variant>

#include "dtrain/core/tensor.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/unit.hpp"

namespace dtrain::nn {

template <class... L>
class OneOfLoss {
 public:
  OneOfLoss() = default;  // the first alternative, default-built
  template <class X>
  requires(std::is_same_v<std::remove_cvref_t<X>, L> || ...) OneOfLoss(X&& loss)
      : v_(std::forward<X>(loss)) {}  // NOLINT(google-explicit-constructor): a loss is one of these

  template <class X>
  X* get_if() noexcept {
    return std::get_if<X>(&v_);
  }
  template <class X>
  const X* get_if() const noexcept {
    return std::get_if<X>(&v_);
  }

  double count(const Batch& batch) const {
    return std::visit([&](const auto& l) { return static_cast<double>(l.count(batch)); }, v_);
  }
  // The chosen loss's own figures (dtrain::LossMetricSums), none when it has none.
  LossMetricSums take_metric_sums() {
    return std::visit([](auto& l) { return dtrain::detail::take_loss_metrics(l); }, v_);
  }

  template <class Dev, class T>
  double forward(Dev& dev, MatView<const T> logits, const DeviceBatch& batch) {
    return std::visit([&](auto& l) { return static_cast<double>(l.template forward<Dev, T>(dev, logits, batch)); }, v_);
  }
  template <class Dev, class T>
  void backward(Dev& dev, MatView<const T> logits, const DeviceBatch& batch, MatView<T> dlogits, float scale) {
    std::visit([&](auto& l) { l.template backward<Dev, T>(dev, logits, batch, dlogits, scale); }, v_);
  }

 private:
  std::variant<L...> v_;
};

}  // namespace dtrain::nn
