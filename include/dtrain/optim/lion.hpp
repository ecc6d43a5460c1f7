#pragma once
// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023):
// the update is the sign of an interpolation between momentum and gradient,
// so every element moves by exactly lr (plus decoupled weight decay), with
// one state buffer instead of AdamW's two.
//
//   c = beta1 m + (1 - beta1) g;   p = p (1 - lr wd) - lr sign(c);   m = beta2 m + (1 - beta2) g
//
// It is written against the public Optimizer concept only, as a user's own
// optimizer would be: nothing else in dtrain knows about it. Rates are
// usually 3-10x smaller than AdamW's, weight decay 3-10x larger.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "dtrain/core/macros.hpp"
#include "dtrain/optim/config.hpp"

namespace dtrain {

struct Lion {
  static constexpr std::string_view name = "lion";
  static constexpr std::size_t max_states = 1;

  float lr = 1e-4f;
  float beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0.f;

  struct coefficients {
    float lr;
    float decay;  // 1 - lr * weight_decay
    float beta1, beta2;
  };

  void validate() const {
    detail::check_field("Lion", "lr", lr, detail::positive);
    detail::check_field("Lion", "beta1", beta1, detail::unit_interval);
    detail::check_field("Lion", "beta2", beta2, detail::unit_interval);
    detail::check_field("Lion", "weight_decay", weight_decay, detail::non_negative);
  }
  std::vector<std::string_view> state_names() const { return {"exp_avg"}; }
  coefficients coefficients_for(const GroupHyper& h) const {
    return {h.lr, static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay), beta1, beta2};
  }
  DTRAIN_HOST_DEVICE static void update(float& p, float g, float* s, const coefficients& c) {
    const float m = s[0];
    const float blend = c.beta1 * m + (1.f - c.beta1) * g;
    const float sign = blend > 0.f ? 1.f : blend < 0.f ? -1.f : 0.f;
    p = p * c.decay - c.lr * sign;
    s[0] = c.beta2 * m + (1.f - c.beta2) * g;
  }
};

}  // namespace dtrain
