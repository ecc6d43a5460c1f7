#pragma once
// nn::SandwichBlock<Norm, Attention, Mlp>: a pre-norm transformer block whose
// attention and MLP outputs are normalised again before their residual adds
// (Gemma 2 and 3: input_layernorm, post_attention_layernorm,
// pre_feedforward_layernorm, post_feedforward_layernorm):
//   r = x + post_attn(attn(ln1(x)));  y = r + post_mlp(mlp(ln2(r)))
//   params ln1.*, attn.*, post_attn.*, ln2.*, mlp.*, post_mlp.*
//   saved  ln1(x), attention's output, r, ln2(r), the MLP's output, two
//          [rows, dim] buffers for the gradients between the parts, then the
//          attention's and the MLP's own saved activations
// (nn::PreNormBlock, nn/transformer.hpp, is the block without the two post-norms.)

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "dtrain/core/view.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"
#include "dtrain/nn/transformer.hpp"

namespace dtrain::nn {

template <class Norm, class Attention, class Mlp>
class SandwichBlock {
 public:
  SandwichBlock(std::int64_t dim, Norm ln1, Attention attn, Norm post_attn, Norm ln2, Mlp mlp, Norm post_mlp)
      : dim_(dim),
        ln1_(std::move(ln1)),
        attn_(std::move(attn)),
        post_attn_(std::move(post_attn)),
        ln2_(std::move(ln2)),
        mlp_(std::move(mlp)),
        post_mlp_(std::move(post_mlp)) {
    n_ = {ln1_.params().size(), attn_.params().size(), post_attn_.params().size(),
          ln2_.params().size(), mlp_.params().size(),  post_mlp_.params().size()};
  }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "ln1", ln1_.params());
    detail::append_params(out, "attn", attn_.params());
    detail::append_params(out, "post_attn", post_attn_.params());
    detail::append_params(out, "ln2", ln2_.params());
    detail::append_params(out, "mlp", mlp_.params());
    detail::append_params(out, "post_mlp", post_mlp_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::SandwichBlock", in, dim_); }
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    return 7 * s.rows() * dim_ + attn_.saved_size(s, dim_) + mlp_.saved_size(s, dim_);
  }
  template <class Dev, class T>
  std::int64_t saved_size_on(Dev& dev, SeqShape s, std::int64_t) const {
    return 7 * s.rows() * dim_ + saved_size_of<T>(attn_, dev, s, dim_) + saved_size_of<T>(mlp_, dev, s, dim_);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(dev, p, x, ctx);
    const auto n = static_cast<std::size_t>(x.size());
    ln1_.template forward<Dev, T>(dev, part(p, 0), x, s.h1);
    attn_.template forward<Dev, T>(dev, part(p, 1), s.h1, s.a, ctx.part(s.attn, 1));
    post_attn_.template forward<Dev, T>(dev, part(p, 2), s.a, s.s1);
    dev.for_each(n, AddElements<T>{x.data, s.s1.data, s.r.data});
    ln2_.template forward<Dev, T>(dev, part(p, 3), s.r, s.h2);
    mlp_.template forward<Dev, T>(dev, part(p, 4), s.h2, s.m, ctx.part(s.mlp, 4));
    post_mlp_.template forward<Dev, T>(dev, part(p, 5), s.m, s.s1);
    dev.for_each(n, AddElements<T>{s.r.data, s.s1.data, y.data});
  }

  // dr = dy + (the MLP's path), dx = dr + (the attention's path); the MLP's
  // output is not read after post_mlp's backward, so its buffer takes the
  // gradient of ln1's output.
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(dev, p, x, ctx);
    detail::check_count("nn::SandwichBlock", "gradients", grad.size(), p.size());
    const auto n = static_cast<std::size_t>(x.size());
    post_mlp_.template backward<Dev, T>(dev, part(p, 5), part(grad, 5), s.m, {}, dy, s.s1);
    mlp_.template backward<Dev, T>(dev, part(p, 4), part(grad, 4), s.h2, {}, s.s1, s.s2, ctx.part(s.mlp, 4));
    ln2_.template backward<Dev, T>(dev, part(p, 3), part(grad, 3), s.r, s.h2, s.s2, s.s1);
    dev.for_each(n, AddElements<T>{s.s1.data, dy.data, s.s1.data});  // dr
    post_attn_.template backward<Dev, T>(dev, part(p, 2), part(grad, 2), s.a, {}, s.s1, s.s2);
    attn_.template backward<Dev, T>(dev, part(p, 1), part(grad, 1), s.h1, {}, s.s2, s.m, ctx.part(s.attn, 1));
    ln1_.template backward<Dev, T>(dev, part(p, 0), part(grad, 0), x, s.h1, s.m, dx);
    if (!dx.empty()) dev.for_each(n, AddElements<T>{dx.data, s.s1.data, dx.data});
  }

 private:
  template <class T>
  struct Parts {
    MatView<T> h1, a, r, h2, m, s1, s2;  // s1, s2: scratch between the parts
    MatView<T> attn, mlp;                // the parts' own saved activations
  };

  // Part i's slice of the block's parameters (or gradients).
  template <class P>
  P part(P p, std::size_t i) const {
    std::size_t first = 0;
    for (std::size_t j = 0; j < i; ++j) first += n_[j];
    return p.subspan(first, n_[i]);
  }

  template <class Dev, class T>
  Parts<T> parts(Dev& dev, UnitParams<const T> p, MatView<const T> x, const UnitContext<T>& ctx) const {
    std::size_t count = 0;
    for (std::size_t c : n_) count += c;
    detail::check_count("nn::SandwichBlock", "parameters", p.size(), count);
    detail::check_shape("nn::SandwichBlock", "input", x, ctx.shape.rows(), dim_);
    detail::check_saved("nn::SandwichBlock", ctx.saved.size(), saved_size_on<Dev, T>(dev, ctx.shape, dim_),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    detail::Carve<T> c(ctx.saved.data);
    const std::int64_t rows = x.rows, na = saved_size_of<T>(attn_, dev, ctx.shape, dim_),
                       nm = saved_size_of<T>(mlp_, dev, ctx.shape, dim_);
    auto mat = [&] { return MatView<T>{c.take(rows * dim_), rows, dim_}; };
    Parts<T> s;
    s.h1 = mat();
    s.a = mat();
    s.r = mat();
    s.h2 = mat();
    s.m = mat();
    s.s1 = mat();
    s.s2 = mat();
    s.attn = MatView<T>{c.take(na), 1, na};
    s.mlp = MatView<T>{c.take(nm), 1, nm};
    return s;
  }

  std::int64_t dim_;
  Norm ln1_;
  Attention attn_;
  Norm post_attn_;
  Norm ln2_;
  Mlp mlp_;
  Norm post_mlp_;
  std::array<std::size_t, 6> n_{};
};

}  // namespace dtrain::nn
