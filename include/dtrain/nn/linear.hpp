#pragma once
// nn::Linear: y = x * weight^T + bias, weight [out, in], bias [out], both
// initialised like PyTorch's nn.Linear: U(-1/sqrt(in), 1/sqrt(in)).
// With LinearOptions::lora (nn/lora.hpp) weight and bias are frozen and a
// LoRA adapter (params lora_A, lora_B) trains instead.

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/matrix.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/lora.hpp"

namespace dtrain::nn {

struct LinearOptions {
  bool bias = true;
  bool trainable = true;  // false freezes weight and bias
  // Non-empty: the weight is this earlier parameter ("<unit>.<param>"), e.g.
  // an output head tied to the token embedding "0.weight" [out, in]
  // (ParamSpec::tied_to); the bias, if any, stays the head's own.
  std::string tie_weight{};
  // A LoRA adapter (r > 0): weight and bias frozen, lora_A and lora_B
  // trained. `lora_segments` > 1: the output is that many projections side
  // by side, each with its own adapter (nn/lora.hpp).
  LoraOptions lora{};
  std::int64_t lora_segments = 1;
};

class Linear {
 public:
  DTRAIN_DECL Linear(std::int64_t in_features, std::int64_t out_features, LinearOptions options = {});

  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }
  bool has_bias() const noexcept { return options_.bias; }

  bool has_lora() const noexcept { return lora_.any(); }

  DTRAIN_DECL std::vector<ParamSpec> params() const;

  std::int64_t out_features(std::int64_t in) const {
    detail::check_width("nn::Linear", in, in_);
    return out_;
  }
  // The adapter's t = x A^T (none without one).
  std::int64_t saved_size(SeqShape s, std::int64_t) const { return lora_.saved_size(s.rows()); }

  // With a LoRA adapter the unit keeps t in ctx.saved: it runs through these.
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    base_forward(dev, p, x, y);
    if (!lora_.any()) return;
    check_saved(x, ctx);
    lora_.forward(dev, 0, p, x, y.data, ctx.saved.data, lora_draw(ctx));
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    base_backward(dev, p, grad, x, y, dy, dx);
    if (!lora_.any()) return;
    check_saved(x, ctx);
    lora_.backward(dev, 0, p, grad, x, dy.data, ctx.saved.data, dx, lora_draw(ctx));
  }

  // Without an adapter the unit needs no context (a composite unit calls these).
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    no_lora_here();
    base_forward(dev, p, x, y);
  }

  // y = x W^T (+ the adapter's term) without the bias, which the caller adds
  // in a pass of its own (bias(p)): nn::MLP folds fc1's into the
  // activation's pass on the host. ctx is needed with an adapter only.
  template <class Dev, class T>
  void forward_without_bias(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y,
                            const UnitContext<T>* ctx = nullptr) {
    base_forward(dev, p, x, y, false);
    if (!lora_.any()) return;
    if (ctx == nullptr) no_lora_here();
    check_saved(x, *ctx);
    lora_.forward(dev, 0, p, x, y.data, ctx->saved.data, lora_draw(*ctx));
  }
  // The bias among p (null without one).
  template <class T>
  const T* bias(UnitParams<const T> p) const {
    return options_.bias ? p[1].data : nullptr;
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx) {
    no_lora_here();
    base_backward(dev, p, grad, x, y, dy, dx);
  }

 private:
  std::size_t base_params() const { return options_.bias ? 2 : 1; }
  // Throws when the unit has an adapter (a call without a UnitContext).
  DTRAIN_DECL void no_lora_here() const;
  template <class T>
  void check_saved(MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_saved("nn::Linear", ctx.saved.size(), lora_.saved_size(x.rows),
                        "size the saved view with saved_size(shape, in)");
  }

  // With a bias, y starts as the broadcast bias and the GEMM adds x * W^T
  // (beta = 1): the result is rounded once, as a fused bias epilogue would.
  template <class Dev, class T>
  void base_forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, bool add_bias = true) {
    check_params(p);
    detail::check_shape("nn::Linear", "input", x, x.rows, in_);
    detail::check_shape("nn::Linear", "output", y, x.rows, out_);
    float beta = 0.f;
    if (options_.bias && add_bias) {
      broadcast_row(dev, p[1].data, y);
      beta = 1.f;
    }
    dev.gemm(false, true, x.rows, out_, in_, 1.f, x.data, in_, p[0].data, in_, beta, y.data, out_);
  }

  template <class Dev, class T>
  void base_backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                     MatView<const T> dy, MatView<T> dx) {
    check_params(p);
    detail::check_count("nn::Linear", "gradients", grad.size(), p.size());
    detail::check_shape("nn::Linear", "input", x, x.rows, in_);
    detail::check_shape("nn::Linear", "output gradient", dy, x.rows, out_);
    if (!dx.empty()) {
      detail::check_shape("nn::Linear", "input gradient", dx, x.rows, in_);
      dev.gemm(false, false, x.rows, in_, out_, 1.f, dy.data, out_, p[0].data, in_, 0.f, dx.data, in_);
    }
    if (!grad[0].empty()) {  // empty when frozen
      detail::check_shape("nn::Linear", "weight gradient", grad[0], out_, in_);
      dev.gemm(true, false, out_, in_, x.rows, 1.f, dy.data, out_, x.data, in_, 0.f, grad[0].data, in_);
    }
    if (options_.bias && !grad[1].empty()) {
      detail::check_shape("nn::Linear", "bias gradient", grad[1], out_, 1);
      column_sum(dev, dy, grad[1].data);
    }
  }

  template <class T>
  void check_params(UnitParams<T> p) const {
    detail::check_count("nn::Linear", "parameters", p.size(), base_params() + lora_.param_count());
    detail::check_shape("nn::Linear", "weight", p[0], out_, in_);
    if (options_.bias) detail::check_shape("nn::Linear", "bias", p[1], out_, 1);
  }

  std::int64_t in_;
  std::int64_t out_;
  LinearOptions options_;
  detail::LoraSet lora_;
};

}  // namespace dtrain::nn

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/linear.ipp"
#endif
