#pragma once
// An optimizer over one flat fp32 buffer: the optimizer state that goes with
// whatever flat a strategy owns on this rank (the whole model under DDP, the
// rank's shards under FSDP and ZeRO1), and the fused pass that updates it.
//
//   dtrain::FlatOptimizer<dtrain::Host> opt(dev, dtrain::AdamW{.lr = 1e-3f}, owned_size);
//   opt.step(master, grad, param_out_or_null, {.lr = lr, .step = 1, .grad_scale = 1.f});
//
// Public so a hand-written loop can pair it with ShardedParams/ShardReducer.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/kernels/optimizer.hpp"
#include "dtrain/optim/config.hpp"

namespace dtrain {

// What changes from one step to the next.
struct OptimizerStep {
  float lr = 0.f;
  std::int64_t step = 1;    // optimizer steps taken, this one included (AdamW bias correction)
  float grad_scale = 1.f;   // multiplies every gradient as it is read: 1/loss_scale x clip coefficient
};

// A named view of one optimizer-state buffer (for checkpoints).
struct OptimizerStateView {
  std::string_view name;  // "exp_avg", "exp_avg_sq", "momentum_buffer" (PyTorch's names)
  float* data;
};

template <class Dev>
class FlatOptimizer {
 public:
  using config_type = std::variant<AdamW, SGD>;

  // Validates the config and allocates zeroed state for `size` elements.
  template <OptimizerConfig Opt>
  FlatOptimizer(Dev& dev, Opt config, std::size_t size) : dev_(dev), config_(config), size_(size) {
    config.validate();
    const std::size_t buffers = std::visit([](const auto& c) { return state_buffers(c); }, config_);
    if (buffers >= 1) state1_ = make_buffer<float>(dev_, size, zero_init, memory_category::optimizer);
    if (buffers >= 2) state2_ = make_buffer<float>(dev_, size, zero_init, memory_category::optimizer);
  }

  const config_type& config() const { return config_; }
  std::size_t size() const { return size_; }
  float base_lr() const {
    return std::visit([](const auto& c) { return c.lr; }, config_);
  }

  // One pass over the flat: reads the gradient once, updates master weights
  // and state, and writes T(param) into param_out when it is not null.
  template <Dtype T>
  void step(float* master, const float* grad, T* param_out, const OptimizerStep& s) {
    if (size_ == 0) return;
    std::visit([&](const auto& c) {
      if constexpr (std::is_same_v<std::decay_t<decltype(c)>, AdamW>) {
        const AdamWHyper h{s.lr, c.beta1, c.beta2, c.eps, c.weight_decay};
        dev_.for_each(size_, AdamWStep<T>({master, grad, state1_.data(), state2_.data(), param_out}, h, s.step,
                                          s.grad_scale));
      } else {
        const SgdHyper h{s.lr, c.momentum, c.weight_decay, c.nesterov};
        dev_.for_each(size_, SgdStep<T>({master, grad, state1_.data(), param_out}, h, s.grad_scale));
      }
    }, config_);
  }

  // The state buffers, each `size()` elements, in the flat's order.
  std::vector<OptimizerStateView> state() {
    std::vector<OptimizerStateView> out;
    std::visit([&](const auto& c) {
      if constexpr (std::is_same_v<std::decay_t<decltype(c)>, AdamW>) {
        out.push_back({"exp_avg", state1_.data()});
        out.push_back({"exp_avg_sq", state2_.data()});
      } else if (c.momentum != 0.f) {
        out.push_back({"momentum_buffer", state1_.data()});
      }
    }, config_);
    return out;
  }

  // fp32 state buffers a config needs per element: AdamW 2, SGD 1 with momentum.
  static std::size_t state_buffers(const AdamW&) { return 2; }
  static std::size_t state_buffers(const SGD& c) { return c.momentum != 0.f ? 1 : 0; }

 private:
  Dev& dev_;
  config_type config_;
  std::size_t size_;
  typename Dev::template buffer<float> state1_;  // AdamW exp_avg / SGD momentum
  typename Dev::template buffer<float> state2_;  // AdamW exp_avg_sq
};

}  // namespace dtrain
