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

#include <bit>
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

// PyTorch updates the first moment with lerp(m, g, w) = m + w * (g - m),
// evaluated from the nearer end so it is exact at w = 1: for w >= 0.5 it is
// g - (g - m) * (1 - w). Both forms are base + k * (g - m) with (base, k) =
// (m, w) or (g, -(1 - w)) (negation is exact, so the second is bit for bit
// the same). Which one is fixed per step, so the pass picks a loaded value
// by a bit mask: a branch with arithmetic in it, or a select on a bool, keeps
// GCC from vectorising the loop (without -fno-trapping-math).
struct MomentLerp {
  std::uint32_t take_moment = ~0u;  // base = m (all ones: w < 0.5) or g (zero), as a bit mask
  float k = 0.1f;

  static MomentLerp of(float w) { return w < 0.5f ? MomentLerp{~0u, w} : MomentLerp{0u, -(1.f - w)}; }
  DTRAIN_HOST_DEVICE float operator()(float m, float g) const {
#if defined(__CUDA_ARCH__)
    const float base = take_moment ? m : g;
#else
    const float base = std::bit_cast<float>((std::bit_cast<std::uint32_t>(m) & take_moment) |
                                            (std::bit_cast<std::uint32_t>(g) & ~take_moment));
#endif
    return base + k * (g - m);
  }
};

// AdamW's per-step scalars for one set of hyperparameters, computed in
// double on the host and rounded to float as PyTorch does. `step` counts
// optimizer steps from 1 (bias correction).
struct AdamWCoefficients {
  float step_size = 0.f;
  float bias_correction2_sqrt = 1.f;
  float decay = 1.f;
  MomentLerp moment = MomentLerp::of(0.1f);  // the first moment's lerp by 1 - beta1
  float beta2 = 0.999f;
  float beta2_weight = 0.001f;
  float eps = 1e-8f;
};

inline AdamWCoefficients adamw_coefficients(const AdamWHyper& h, std::int64_t step) {
  if (step < 1)
    throw config_error("AdamW: step = " + std::to_string(step) + " must count from 1",
                       "pass the number of optimizer steps taken, this one included (bias correction)");
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(step));
  return {static_cast<float>(h.lr / bias_correction1),
          static_cast<float>(std::sqrt(bias_correction2)),
          static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay),
          MomentLerp::of(static_cast<float>(1.0 - static_cast<double>(h.beta1))),
          h.beta2,
          static_cast<float>(1.0 - static_cast<double>(h.beta2)),
          h.eps};
}

// One element of AdamW: p, m, v in place from the (scaled) gradient g.
DTRAIN_HOST_DEVICE inline void adamw_update(float& p, float g, float& m, float& v, const AdamWCoefficients& c) {
  m = c.moment(m, g);
  v = v * c.beta2 + c.beta2_weight * g * g;
  const float denom = math::sqrt(v) / c.bias_correction2_sqrt + c.eps;
  p = p * c.decay - c.step_size * m / denom;
}

template <Dtype T = float>
class AdamWStep {
 public:
  struct Buffers {
    float* param;            // fp32 master weights, updated in place
    const float* grad;       // fp32 gradient, already averaged
    float* exp_avg;          // first moment, zero before step 1
    float* exp_avg_sq;       // second moment, zero before step 1
    T* param_out = nullptr;  // when set, receives T(updated param)
  };

  // `step` counts optimizer steps from 1 (bias correction).
  AdamWStep(const Buffers& b, const AdamWHyper& h, std::int64_t step, float grad_scale = 1.f)
      : b_(b), grad_scale_(grad_scale), c_(adamw_coefficients(h, step)) {}

  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    float p = b_.param[i], m = b_.exp_avg[i], v = b_.exp_avg_sq[i];
    adamw_update(p, b_.grad[i] * grad_scale_, m, v, c_);
    b_.exp_avg[i] = m;
    b_.exp_avg_sq[i] = v;
    b_.param[i] = p;
    if (b_.param_out != nullptr) b_.param_out[i] = dtype_cast<T>(p);
  }

 private:
  Buffers b_;
  float grad_scale_;
  AdamWCoefficients c_;
};

struct SgdHyper {
  float lr = 1e-2f;
  float momentum = 0.f;
  float weight_decay = 0.f;  // coupled (L2): added to the gradient, as in torch.optim.SGD
  bool nesterov = false;
};

// One element of SGD: p (and the momentum buffer `buf` when momentum > 0)
// in place from the scaled gradient. A zero buffer makes step 1 give buf =
// grad, exactly PyTorch's first-step clone, so no "first step" flag is needed.
DTRAIN_HOST_DEVICE inline void sgd_update(float& p, float d, float& buf, const SgdHyper& h) {
  if (h.weight_decay != 0.f) d = d + h.weight_decay * p;
  if (h.momentum != 0.f) {
    buf = buf * h.momentum + d;
    d = h.nesterov ? d + h.momentum * buf : buf;
  }
  p = p - h.lr * d;
}

template <Dtype T = float>
class SgdStep {
 public:
  struct Buffers {
    float* param;                      // fp32 master weights, updated in place
    const float* grad;                 // fp32 gradient, already averaged
    float* momentum_buffer = nullptr;  // needed when momentum > 0; zero before step 1
    T* param_out = nullptr;            // when set, receives T(updated param)
  };

  SgdStep(const Buffers& b, const SgdHyper& h, float grad_scale = 1.f) : b_(b), grad_scale_(grad_scale), h_(h) {}

  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    float p = b_.param[i], buf = h_.momentum != 0.f ? b_.momentum_buffer[i] : 0.f;
    sgd_update(p, b_.grad[i] * grad_scale_, buf, h_);
    if (h_.momentum != 0.f) b_.momentum_buffer[i] = buf;
    b_.param[i] = p;
    if (b_.param_out != nullptr) b_.param_out[i] = dtype_cast<T>(p);
  }

 private:
  Buffers b_;
  float grad_scale_;
  SgdHyper h_;
};

// The most parameter groups one optimizer pass tells apart (their ids are
// one byte per element; 16 keeps the functor's table small enough to pass
// by value to a CUDA kernel).
inline constexpr std::size_t max_param_groups = 16;

// Any optimizer rule (the Optimizer concept, optim/config.hpp) over a flat
// buffer whose elements belong to parameter groups: element i is updated
// with the coefficients of group[i]. The rule's state is `States` fp32
// buffers (at most Rule::max_states). One pass: the gradient is read once,
// master weights and state updated in place, T(param) written to param_out
// when it is set. Grouped = false reads no ids (every element takes
// table[0]). Both choices are compile-time so that the host loop has no
// branch left and vectorises as the hand-written AdamWStep does.
template <class Rule, Dtype T = float, bool Grouped = false, std::size_t States = Rule::max_states>
class GroupedStep {
 public:
  using coefficients = typename Rule::coefficients;
  static_assert(States <= Rule::max_states, "GroupedStep: more state buffers than the rule's max_states");
  static constexpr std::size_t slots = Rule::max_states > 0 ? Rule::max_states : 1;

  struct Buffers {
    float* param;
    const float* grad;
    float* state[slots];
    T* param_out = nullptr;
    const std::uint8_t* group = nullptr;
  };

  GroupedStep(const Buffers& b, const coefficients* table, std::size_t groups, float grad_scale)
      : b_(b), grad_scale_(grad_scale) {
    if (Grouped && b.group == nullptr)
      throw config_error("a grouped optimizer pass got no group ids", "pass Buffers::group, one id per element");
    if (groups < 1 || groups > max_param_groups)
      throw config_error("an optimizer pass got " + std::to_string(groups) + " parameter groups",
                         "use 1 to " + std::to_string(max_param_groups) + " groups");
    for (std::size_t g = 0; g < groups; ++g) table_[g] = table[g];
  }

  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const coefficients& c = table_[Grouped ? b_.group[i] : 0];
    float p = b_.param[i];
    float s[slots] = {};
    for (std::size_t k = 0; k != States; ++k) s[k] = b_.state[k][i];
    Rule::update(p, b_.grad[i] * grad_scale_, s, c);
    for (std::size_t k = 0; k != States; ++k) b_.state[k][i] = s[k];
    b_.param[i] = p;
    if (b_.param_out != nullptr) b_.param_out[i] = dtype_cast<T>(p);
  }

#if defined(__CUDACC__)
  // Cuda::for_each's vector path: elements [first, first + 4) with one
  // 16-byte load or store per fp32 buffer, when vector_ok(). The pass is
  // memory-bound (AdamW moves 28 bytes per element); wider accesses keep
  // more bytes in flight per thread. Same arithmetic as operator().
  static constexpr std::size_t vector_width = 4;
  bool vector_ok() const noexcept {
    const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
    bool ok = aligned(b_.param) && aligned(b_.grad);
    for (std::size_t k = 0; k != States; ++k) ok = ok && aligned(b_.state[k]);
    return ok;
  }
  __device__ void apply_vector(std::size_t first) const {
    float4 p = *reinterpret_cast<const float4*>(b_.param + first);
    const float4 g = *reinterpret_cast<const float4*>(b_.grad + first);
    float4 s[slots] = {};
    for (std::size_t k = 0; k != States; ++k) s[k] = *reinterpret_cast<const float4*>(b_.state[k] + first);
    float* pl[4] = {&p.x, &p.y, &p.z, &p.w};
    const float gl[4] = {g.x, g.y, g.z, g.w};
    for (int l = 0; l < 4; ++l) {
      float sl[slots] = {};
      for (std::size_t k = 0; k != States; ++k) sl[k] = (&s[k].x)[l];
      const std::size_t gi = Grouped ? b_.group[first + l] : 0;
      Rule::update(*pl[l], gl[l] * grad_scale_, sl, table_[gi]);
      for (std::size_t k = 0; k != States; ++k) (&s[k].x)[l] = sl[k];
    }
    for (std::size_t k = 0; k != States; ++k) *reinterpret_cast<float4*>(b_.state[k] + first) = s[k];
    *reinterpret_cast<float4*>(b_.param + first) = p;
    if (b_.param_out != nullptr)
      for (int l = 0; l < 4; ++l) b_.param_out[first + l] = dtype_cast<T>(*pl[l]);
  }
#endif

 private:
  Buffers b_;
  float grad_scale_;
  coefficients table_[max_param_groups];
};

}  // namespace dtrain
