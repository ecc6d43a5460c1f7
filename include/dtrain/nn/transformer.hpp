#pragma once
// Composite units: one unit (one FSDP wrap unit, one checkpoint region) made
// of several, with their inner activations in UnitContext::saved.
//
// nn::GeluMLP(dim, hidden): y = fc2(gelu(fc1(x))), dropout-free.
//   params fc1.weight [hidden, dim], fc1.bias, fc2.weight [dim, hidden], fc2.bias
//   saved  fc1's output and the GELU's: 2 * rows * hidden
//
// nn::TransformerBlock(dim, heads, mlp_ratio = 4), pre-LayerNorm (GPT-2):
//   r = x + attn(ln1(x));  y = r + mlp(ln2(r))
//   params ln1.*, attn.* (nn::CausalSelfAttention), ln2.*, mlp.* (nn::GeluMLP)
//   saved  ln1(x), attention's, r, ln2(r), the MLP's, and two [rows, dim]
//          buffers for the gradients that flow between the parts in backward

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"

namespace dtrain::nn {

namespace detail {
// A part's parameter specs, renamed "<prefix>.<name>", appended to `out`.
inline void append_params(std::vector<ParamSpec>& out, const std::string& prefix, std::vector<ParamSpec> part) {
  for (auto& p : part) {
    p.name = prefix + "." + p.name;
    out.push_back(std::move(p));
  }
}

// Consecutive slices of a unit's saved buffer.
template <class T>
class Carve {
 public:
  explicit Carve(T* at) : at_(at) {}
  T* take(std::int64_t n) {
    T* p = at_;
    at_ += n;
    return p;
  }

 private:
  T* at_;
};
}  // namespace detail

class GeluMLP {
 public:
  GeluMLP(std::int64_t dim, std::int64_t hidden) : dim_(dim), hidden_(hidden), fc1_(dim, hidden), fc2_(hidden, dim) {}

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "fc1", fc1_.params());
    detail::append_params(out, "fc2", fc2_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::GeluMLP", in, dim_); }
  std::int64_t saved_size(SeqShape s, std::int64_t) const { return 2 * s.rows() * hidden_; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    check(p, ctx);
    const MatView<T> h{ctx.saved.data, x.rows, hidden_}, a{ctx.saved.data + x.rows * hidden_, x.rows, hidden_};
    fc1_.forward<Dev, T>(dev, p.subspan(0, 2), x, h);
    gelu_.forward<Dev, T>(dev, {}, h, a);
    fc2_.forward<Dev, T>(dev, p.subspan(2, 2), a, y);
  }

  // The GELU's input gradient is computed in place over the upstream one:
  // elementwise, each element reads its own gradient before writing it.
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    check(p, ctx);
    detail::check_count("nn::GeluMLP", "gradients", grad.size(), 4);
    const MatView<T> h{ctx.saved.data, x.rows, hidden_}, a{ctx.saved.data + x.rows * hidden_, x.rows, hidden_};
    const MatView<T> da{dev.template workspace<T>(static_cast<std::size_t>(x.rows * hidden_)), x.rows, hidden_};
    fc2_.backward<Dev, T>(dev, p.subspan(2, 2), grad.subspan(2, 2), a, y, dy, da);
    gelu_.backward<Dev, T>(dev, {}, {}, h, a, da, da);
    fc1_.backward<Dev, T>(dev, p.subspan(0, 2), grad.subspan(0, 2), x, h, da, dx);
  }

 private:
  template <class T>
  void check(UnitParams<const T> p, const UnitContext<T>& ctx) const {
    detail::check_count("nn::GeluMLP", "parameters", p.size(), 4);
    if (ctx.saved.size() < saved_size(ctx.shape, dim_))
      throw config_error("nn::GeluMLP: " + std::to_string(ctx.saved.size()) + " saved elements for " +
                             std::to_string(saved_size(ctx.shape, dim_)),
                         "pass a UnitContext whose saved view holds saved_size(shape) elements");
  }

  std::int64_t dim_, hidden_;
  Linear fc1_, fc2_;
  GELU gelu_;
};

struct TransformerBlockOptions {
  std::int64_t mlp_ratio = 4;  // the MLP's hidden width, in multiples of dim
  float eps = 1e-5f;           // the LayerNorms'
};

class TransformerBlock {
 public:
  TransformerBlock(std::int64_t dim, std::int64_t heads, TransformerBlockOptions options = {})
      : dim_(dim),
        ln1_(dim, {.eps = options.eps}),
        attn_(dim, heads),
        ln2_(dim, {.eps = options.eps}),
        mlp_(dim, options.mlp_ratio * dim) {}

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "ln1", ln1_.params());
    detail::append_params(out, "attn", attn_.params());
    detail::append_params(out, "ln2", ln2_.params());
    detail::append_params(out, "mlp", mlp_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::TransformerBlock", in, dim_); }
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    return 5 * s.rows() * dim_ + attn_.saved_size(s, dim_) + mlp_.saved_size(s, dim_);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, ctx);
    ln1_.forward<Dev, T>(dev, p.subspan(0, 2), x, s.h1);
    attn_.forward<Dev, T>(dev, p.subspan(2, 4), s.h1, s.s1, {ctx.shape, s.attn});
    dev.for_each(static_cast<std::size_t>(x.size()), AddElements<T>{x.data, s.s1.data, s.r.data});
    ln2_.forward<Dev, T>(dev, p.subspan(6, 2), s.r, s.h2);
    mlp_.forward<Dev, T>(dev, p.subspan(8, 4), s.h2, s.s1, {ctx.shape, s.mlp});
    dev.for_each(static_cast<std::size_t>(x.size()), AddElements<T>{s.r.data, s.s1.data, y.data});
  }

  // y = r + mlp(ln2(r)), r = x + attn(ln1(x)): dr = dy + (ln2 path), dx = dr + (ln1 path).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(p, x, ctx);
    detail::check_count("nn::TransformerBlock", "gradients", grad.size(), 12);
    const auto n = static_cast<std::size_t>(x.size());
    mlp_.backward<Dev, T>(dev, p.subspan(8, 4), grad.subspan(8, 4), s.h2, {}, dy, s.s1, {ctx.shape, s.mlp});
    ln2_.backward<Dev, T>(dev, p.subspan(6, 2), grad.subspan(6, 2), s.r, s.h2, s.s1, s.s2);
    dev.for_each(n, AddElements<T>{s.s2.data, dy.data, s.s2.data});  // dr
    attn_.backward<Dev, T>(dev, p.subspan(2, 4), grad.subspan(2, 4), s.h1, {}, s.s2, s.s1, {ctx.shape, s.attn});
    ln1_.backward<Dev, T>(dev, p.subspan(0, 2), grad.subspan(0, 2), x, s.h1, s.s1, dx);
    if (!dx.empty()) dev.for_each(n, AddElements<T>{dx.data, s.s2.data, dx.data});
  }

 private:
  template <class T>
  struct Parts {
    MatView<T> h1, r, h2, s1, s2;  // s1, s2: scratch between the parts
    MatView<T> attn, mlp;          // the parts' own saved activations
  };

  template <class T>
  Parts<T> parts(UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    detail::check_count("nn::TransformerBlock", "parameters", p.size(), 12);
    detail::check_shape("nn::TransformerBlock", "input", x, ctx.shape.rows(), dim_);
    if (ctx.saved.size() < saved_size(ctx.shape, dim_))
      throw config_error("nn::TransformerBlock: " + std::to_string(ctx.saved.size()) + " saved elements for " +
                             std::to_string(saved_size(ctx.shape, dim_)),
                         "pass a UnitContext whose saved view holds saved_size(shape) elements");
    detail::Carve<T> c(ctx.saved.data);
    const std::int64_t n = x.rows * dim_, na = attn_.saved_size(ctx.shape, dim_), nm = mlp_.saved_size(ctx.shape, dim_);
    auto mat = [&](std::int64_t size, std::int64_t cols) { return MatView<T>{c.take(size), size / cols, cols}; };
    Parts<T> s;
    s.h1 = mat(n, dim_);
    s.r = mat(n, dim_);
    s.h2 = mat(n, dim_);
    s.s1 = mat(n, dim_);
    s.s2 = mat(n, dim_);
    s.attn = MatView<T>{c.take(na), 1, na};
    s.mlp = MatView<T>{c.take(nm), 1, nm};
    return s;
  }

  std::int64_t dim_;
  LayerNorm ln1_;
  CausalSelfAttention attn_;
  LayerNorm ln2_;
  GeluMLP mlp_;
};

}  // namespace dtrain::nn
