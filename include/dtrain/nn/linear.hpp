#pragma once
// nn::Linear: y = x * weight^T + bias, weight [out, in], bias [out], both
// initialised like PyTorch's nn.Linear: U(-1/sqrt(in), 1/sqrt(in)).

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/matrix.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

struct LinearOptions {
  bool bias = true;
  bool trainable = true;  // false freezes weight and bias
  // Non-empty: the weight is this earlier parameter ("<unit>.<param>"), e.g.
  // an output head tied to the token embedding "0.weight" [out, in]
  // (ParamSpec::tied_to); the bias, if any, stays the head's own.
  std::string tie_weight{};
};

class Linear {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, LinearOptions options = {})
      : in_(in_features), out_(out_features), options_(options) {
    if (in_features < 1 || out_features < 1)
      throw config_error("nn::Linear(" + std::to_string(in_features) + ", " + std::to_string(out_features) +
                             "): feature counts must be >= 1",
                         "give positive input and output widths");
  }

  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }
  bool has_bias() const noexcept { return options_.bias; }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> specs{
        {"weight", {out_, in_}, Init::fan_in_uniform(in_), options_.trainable, options_.tie_weight}};
    if (options_.bias) specs.push_back({"bias", {out_}, Init::fan_in_uniform(in_), options_.trainable, {}, {"bias"}});
    return specs;
  }

  std::int64_t out_features(std::int64_t in) const {
    detail::check_width("nn::Linear", in, in_);
    return out_;
  }

  // With a bias, y starts as the broadcast bias and the GEMM adds x * W^T
  // (beta = 1): the result is rounded once, as a fused bias epilogue would.
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    check_params(p);
    detail::check_shape("nn::Linear", "input", x, x.rows, in_);
    detail::check_shape("nn::Linear", "output", y, x.rows, out_);
    float beta = 0.f;
    if (options_.bias) {
      broadcast_row(dev, p[1].data, y);
      beta = 1.f;
    }
    dev.gemm(false, true, x.rows, out_, in_, 1.f, x.data, in_, p[0].data, in_, beta, y.data, out_);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
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

 private:
  template <class T>
  void check_params(UnitParams<T> p) const {
    detail::check_count("nn::Linear", "parameters", p.size(), options_.bias ? 2 : 1);
    detail::check_shape("nn::Linear", "weight", p[0], out_, in_);
    if (options_.bias) detail::check_shape("nn::Linear", "bias", p[1], out_, 1);
  }

  std::int64_t in_;
  std::int64_t out_;
  LinearOptions options_;
};

}  // namespace dtrain::nn
