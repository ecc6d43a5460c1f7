#pragma once
// Optimizer updates as functors: one fused pass over a flat buffer reads the
// gradient once, updates the fp32 master weights and the optimizer state, and
// optionally writes the low-precision copy the next forward uses.
//
//   dev.for_each(n, dtrain::AdamWStep<dtrain::bf16>(
//       {.param = master, .grad = grad, .exp_avg = m, .exp_avg_sq = v, .param_out = params_bf16},
//       hyper, step, grad_scale));
//
// The formulas and their order of operations are PyTorch's (torch.optim.AdamW
// and torch.optim.SGD with dampening 0), in fp32, with the scalar factors
// computed in double on the host and rounded to float as PyTorch does.
// `grad_scale` multiplies every gradient as it is read: 1/loss_scale for fp16
// loss scaling times the gradient-clipping coefficient.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/kernels/math.hpp"

namespace dtrain {

// The per-step numbers a functor applies. They are not re-validated on every
// step: users' values are checked once by the optimizer configs
// (optim/config.hpp: AdamW, SGD) and schedules check themselves; a per-step
// lr of 0 (the first warmup step) is legitimate here.
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;  // decoupled: param *= 1 - lr * weight_decay
};

template <Dtype T = float>
class AdamWStep {
 public:
  struct Buffers {
    float* param;          // fp32 master weights, updated in place
    const float* grad;     // fp32 gradient, already averaged
    float* exp_avg;        // first moment, zero before step 1
    float* exp_avg_sq;     // second moment, zero before step 1
    T* param_out = nullptr;  // when set, receives T(updated param)
  };

  // `step` counts optimizer steps from 1 (bias correction).
  AdamWStep(const Buffers& b, const AdamWHyper& h, std::int64_t step, float grad_scale = 1.f)
      : b_(b),
        grad_scale_(grad_scale),
        decay_(static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay)),
        beta1_weight_(static_cast<float>(1.0 - static_cast<double>(h.beta1))),
        beta2_(h.beta2),
        beta2_weight_(static_cast<float>(1.0 - static_cast<double>(h.beta2))),
        eps_(h.eps) {
    if (step < 1)
      throw config_error("AdamWStep: step = " + std::to_string(step) + " must count from 1",
                         "pass the number of optimizer steps taken, this one included (bias correction)");
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(step));
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(step));
    step_size_ = static_cast<float>(h.lr / bias_correction1);
    bias_correction2_sqrt_ = static_cast<float>(std::sqrt(bias_correction2));
  }

  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    float p = b_.param[i], m = b_.exp_avg[i], v = b_.exp_avg_sq[i];
    update(p, b_.grad[i], m, v);
    b_.exp_avg[i] = m;
    b_.exp_avg_sq[i] = v;
    b_.param[i] = p;
    if (b_.param_out != nullptr) b_.param_out[i] = dtype_cast<T>(p);
  }

#if defined(__CUDACC__)
  // Cuda::for_each's vector path: elements [first, first + 4) with one 16-byte
  // load or store per buffer, when vector_ok(). The pass is memory-bound and
  // moves 28 bytes per element; wider accesses keep more bytes in flight per
  // thread (scalar accesses reached 87% of the H200's copy bandwidth at 100M
  // parameters, docs/performance.md). Same arithmetic as operator().
  static constexpr std::size_t vector_width = 4;
  bool vector_ok() const noexcept {
    const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
    return aligned(b_.param) && aligned(b_.grad) && aligned(b_.exp_avg) && aligned(b_.exp_avg_sq);
  }
  __device__ void apply_vector(std::size_t first) const {
    float4 p = *reinterpret_cast<const float4*>(b_.param + first);
    const float4 g = *reinterpret_cast<const float4*>(b_.grad + first);
    float4 m = *reinterpret_cast<const float4*>(b_.exp_avg + first);
    float4 v = *reinterpret_cast<const float4*>(b_.exp_avg_sq + first);
    update(p.x, g.x, m.x, v.x);
    update(p.y, g.y, m.y, v.y);
    update(p.z, g.z, m.z, v.z);
    update(p.w, g.w, m.w, v.w);
    *reinterpret_cast<float4*>(b_.exp_avg + first) = m;
    *reinterpret_cast<float4*>(b_.exp_avg_sq + first) = v;
    *reinterpret_cast<float4*>(b_.param + first) = p;
    if (b_.param_out != nullptr) {
      b_.param_out[first] = dtype_cast<T>(p.x);
      b_.param_out[first + 1] = dtype_cast<T>(p.y);
      b_.param_out[first + 2] = dtype_cast<T>(p.z);
      b_.param_out[first + 3] = dtype_cast<T>(p.w);
    }
  }
#endif

 private:
  // One element's update: p, m, v in place from the gradient g.
  DTRAIN_HOST_DEVICE void update(float& p, float grad, float& m, float& v) const {
    const float g = grad * grad_scale_;
    m = lerp(m, g, beta1_weight_);
    v = v * beta2_ + beta2_weight_ * g * g;
    const float denom = math::sqrt(v) / bias_correction2_sqrt_ + eps_;
    p = p * decay_ - step_size_ * m / denom;
  }

  // a + w * (b - a), evaluated from the nearer end so it is exact at w = 1
  // (PyTorch updates the first moment with lerp).
  DTRAIN_HOST_DEVICE static float lerp(float a, float b, float w) {
    return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.f - w);
  }

  Buffers b_;
  float grad_scale_;
  float decay_;
  float beta1_weight_;
  float beta2_;
  float beta2_weight_;
  float eps_;
  float step_size_ = 0.f;
  float bias_correction2_sqrt_ = 1.f;
};

struct SgdHyper {
  float lr = 1e-2f;
  float momentum = 0.f;
  float weight_decay = 0.f;  // coupled (L2): added to the gradient, as in torch.optim.SGD
  bool nesterov = false;

};

template <Dtype T = float>
class SgdStep {
 public:
  struct Buffers {
    float* param;                     // fp32 master weights, updated in place
    const float* grad;                // fp32 gradient, already averaged
    float* momentum_buffer = nullptr;  // needed when momentum > 0; zero before step 1
    T* param_out = nullptr;           // when set, receives T(updated param)
  };

  SgdStep(const Buffers& b, const SgdHyper& h, float grad_scale = 1.f)
      : b_(b), grad_scale_(grad_scale), lr_(h.lr), momentum_(h.momentum), weight_decay_(h.weight_decay),
        nesterov_(h.nesterov) {}

  // A zero momentum buffer makes step 1 give buf = grad, which is exactly
  // PyTorch's first-step clone, so no "first step" flag is needed.
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    float p = b_.param[i];
    float d = b_.grad[i] * grad_scale_;
    if (weight_decay_ != 0.f) d = d + weight_decay_ * p;
    if (momentum_ != 0.f) {
      const float buf = b_.momentum_buffer[i] * momentum_ + d;
      b_.momentum_buffer[i] = buf;
      d = nesterov_ ? d + momentum_ * buf : buf;
    }
    p = p - lr_ * d;
    b_.param[i] = p;
    if (b_.param_out != nullptr) b_.param_out[i] = dtype_cast<T>(p);
  }

 private:
  Buffers b_;
  float grad_scale_;
  float lr_;
  float momentum_;
  float weight_decay_;
  bool nesterov_;
};

}  // namespace dtrain
