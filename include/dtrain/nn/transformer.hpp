#pragma once
// Composite units: one unit (one FSDP wrap unit, one checkpoint region) made
// of several, with their inner activations in UnitContext::saved.
//
// nn::MLP<Act>(dim, hidden, {.bias}): y = fc2(act(fc1(x))), dropout-free.
//   fc1 is [Act::input_multiple * hidden, dim] (2 for SwiGLU's gate|up), fc2 [dim, hidden]
//   params fc1.weight, fc1.bias, fc2.weight, fc2.bias (no biases with .bias = false);
//          with LoRA adapters (MlpOptions::fc1_lora, fc2_lora) fc1.lora_A,
//          fc1.lora_B after fc1's, fc2.lora_A, fc2.lora_B after fc2's
//   saved  fc1's output and the activation's (then the adapters' rows)
//   nn::GeluMLP = MLP<GELU> (GPT-2 with GELUTanh), MLP<SwiGLU> is Llama's.
//
// nn::PreNormBlock<Norm, Attention, Mlp>(dim, ln1, attn, ln2, mlp):
//   r = x + attn(ln1(x));  y = r + mlp(ln2(r))
//   params ln1.*, attn.*, ln2.*, mlp.*
//   saved  ln1(x), attention's, r, ln2(r), the MLP's, and two [rows, dim]
//          buffers for the gradients that flow between the parts in backward
//   nn::TransformerBlock(dim, heads) is GPT-2's (LayerNorm, CausalSelfAttention, GeluMLP).

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
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

namespace detail {
// How many times wider than its output an activation's input is (2 for a
// gated activation that reads gate|up).
template <class Act>
constexpr std::int64_t input_multiple() {
  if constexpr (requires { Act::input_multiple; })
    return Act::input_multiple;
  else
    return 1;
}
}  // namespace detail

struct MlpOptions {
  bool bias = true;
  bool trainable = true;
  // LoRA adapters on fc1 (for a gated activation one per half: PEFT's
  // gate_proj and up_proj) and on fc2 (nn/lora.hpp).
  LoraOptions fc1_lora{};
  LoraOptions fc2_lora{};
};

template <class Act>
class MLP {
 public:
  MLP(std::int64_t dim, std::int64_t hidden, MlpOptions options = {})
      : dim_(dim),
        hidden_(hidden),
        fc1_(dim, detail::input_multiple<Act>() * hidden,
             {.bias = options.bias,
              .trainable = options.trainable,
              .lora = options.fc1_lora,
              .lora_segments = detail::input_multiple<Act>()}),
        fc2_(hidden, dim, {.bias = options.bias, .trainable = options.trainable, .lora = options.fc2_lora}),
        n1_(fc1_.params().size()),
        n2_(fc2_.params().size()) {}

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "fc1", fc1_.params());
    detail::append_params(out, "fc2", fc2_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::MLP", in, dim_); }
  // h, a, then the adapters' saved rows (fc1's, fc2's) when there are any.
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    return s.rows() * (wide() + hidden_) + fc1_.saved_size(s, dim_) + fc2_.saved_size(s, hidden_);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    check(p, ctx);
    const MatView<T> h{ctx.saved.data, x.rows, wide()}, a{ctx.saved.data + x.rows * wide(), x.rows, hidden_};
    const auto p1 = p.subspan(0, n1_);
    // On the host fc1's bias is added in the activation's pass, where the
    // activation can (nn::Activation): one pass over h fewer.
    constexpr bool fold = Dev::host_accessible && requires(Act & act, Dev & d, const T* b, MatView<T> m) {
      act.template forward_with_bias<Dev, T>(d, b, m, m);
    };
    if constexpr (fold) {
      if (const T* b1 = fc1_.bias(p1); b1 != nullptr) {
        const UnitContext<T> lora = fc1_.has_lora() ? ctx.part(lora_saved(ctx, 0), 0) : ctx;
        fc1_.template forward_without_bias<Dev, T>(dev, p1, x, h, fc1_.has_lora() ? &lora : nullptr);
        act_.template forward_with_bias<Dev, T>(dev, b1, h, a);
        return fc2_forward<Dev, T>(dev, p, a, y, ctx);
      }
    }
    if (fc1_.has_lora())
      fc1_.template forward<Dev, T>(dev, p1, x, h, ctx.part(lora_saved(ctx, 0), 0));
    else
      fc1_.template forward<Dev, T>(dev, p1, x, h);
    act_.template forward<Dev, T>(dev, {}, h, a);
    fc2_forward<Dev, T>(dev, p, a, y, ctx);
  }

  // The gradients between the parts live in the workspace (no part uses it).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    check(p, ctx);
    detail::check_count("nn::MLP", "gradients", grad.size(), n1_ + n2_);
    const MatView<T> h{ctx.saved.data, x.rows, wide()}, a{ctx.saved.data + x.rows * wide(), x.rows, hidden_};
    T* ws = dev.template workspace<T>(static_cast<std::size_t>(x.rows * (hidden_ + wide())));
    const MatView<T> da{ws, x.rows, hidden_}, dh{ws + x.rows * hidden_, x.rows, wide()};
    const auto p2 = p.subspan(n1_, n2_), p1 = p.subspan(0, n1_);
    const auto g2 = grad.subspan(n1_, n2_), g1 = grad.subspan(0, n1_);
    if (fc2_.has_lora())
      fc2_.template backward<Dev, T>(dev, p2, g2, a, y, dy, da, ctx.part(lora_saved(ctx, 1), 1));
    else
      fc2_.template backward<Dev, T>(dev, p2, g2, a, y, dy, da);
    act_.template backward<Dev, T>(dev, {}, {}, h, a, da, dh);
    if (fc1_.has_lora())
      fc1_.template backward<Dev, T>(dev, p1, g1, x, h, dh, dx, ctx.part(lora_saved(ctx, 0), 0));
    else
      fc1_.template backward<Dev, T>(dev, p1, g1, x, h, dh, dx);
  }

 private:
  std::int64_t wide() const { return detail::input_multiple<Act>() * hidden_; }

  template <class Dev, class T>
  void fc2_forward(Dev& dev, UnitParams<const T> p, MatView<const T> a, MatView<T> y, const UnitContext<T>& ctx) {
    if (fc2_.has_lora())
      fc2_.template forward<Dev, T>(dev, p.subspan(n1_, n2_), a, y, ctx.part(lora_saved(ctx, 1), 1));
    else
      fc2_.template forward<Dev, T>(dev, p.subspan(n1_, n2_), a, y);
  }

  // fc1's (which = 0) or fc2's adapter rows in the saved view.
  template <class T>
  MatView<T> lora_saved(const UnitContext<T>& ctx, int which) const {
    const std::int64_t rows = ctx.shape.rows(), n1 = fc1_.saved_size(ctx.shape, dim_);
    T* at = ctx.saved.data + rows * (wide() + hidden_) + (which == 0 ? 0 : n1);
    const std::int64_t n = which == 0 ? n1 : fc2_.saved_size(ctx.shape, hidden_);
    return {at, 1, n};
  }

  template <class T>
  void check(UnitParams<const T> p, const UnitContext<T>& ctx) const {
    detail::check_count("nn::MLP", "parameters", p.size(), n1_ + n2_);
    detail::check_saved("nn::MLP", ctx.saved.size(), saved_size(ctx.shape, dim_),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
  }

  std::int64_t dim_, hidden_;
  Linear fc1_, fc2_;
  Act act_;
  std::size_t n1_, n2_;  // fc1's and fc2's parameter counts
};

using GeluMLP = MLP<GELU>;

template <class Norm, class Attention, class Mlp>
class PreNormBlock {
 public:
  PreNormBlock(std::int64_t dim, Norm ln1, Attention attn, Norm ln2, Mlp mlp)
      : dim_(dim), ln1_(std::move(ln1)), attn_(std::move(attn)), ln2_(std::move(ln2)), mlp_(std::move(mlp)) {
    n_[0] = ln1_.params().size();
    n_[1] = attn_.params().size();
    n_[2] = ln2_.params().size();
    n_[3] = mlp_.params().size();
  }

  std::vector<ParamSpec> params() const {
    std::vector<ParamSpec> out;
    detail::append_params(out, "ln1", ln1_.params());
    detail::append_params(out, "attn", attn_.params());
    detail::append_params(out, "ln2", ln2_.params());
    detail::append_params(out, "mlp", mlp_.params());
    return out;
  }
  std::int64_t out_features(std::int64_t in) const { return detail::check_width("nn::PreNormBlock", in, dim_); }
  std::int64_t saved_size(SeqShape s, std::int64_t) const {
    return 5 * s.rows() * dim_ + attn_.saved_size(s, dim_) + mlp_.saved_size(s, dim_);
  }
  template <class Dev, class T>
  std::int64_t saved_size_on(Dev& dev, SeqShape s, std::int64_t) const {
    return 5 * s.rows() * dim_ + saved_size_of<T>(attn_, dev, s, dim_) + saved_size_of<T>(mlp_, dev, s, dim_);
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(dev, p, x, ctx);
    ln1_.template forward<Dev, T>(dev, part(p, 0), x, s.h1);
    attn_.template forward<Dev, T>(dev, part(p, 1), s.h1, s.s1, ctx.part(s.attn, 1));
    dev.for_each(static_cast<std::size_t>(x.size()), AddElements<T>{x.data, s.s1.data, s.r.data});
    ln2_.template forward<Dev, T>(dev, part(p, 2), s.r, s.h2);
    mlp_.template forward<Dev, T>(dev, part(p, 3), s.h2, s.s1, ctx.part(s.mlp, 3));
    dev.for_each(static_cast<std::size_t>(x.size()), AddElements<T>{s.r.data, s.s1.data, y.data});
  }

  // y = r + mlp(ln2(r)), r = x + attn(ln1(x)): dr = dy + (ln2 path), dx = dr + (ln1 path).
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T>,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    const Parts<T> s = parts(dev, p, x, ctx);
    detail::check_count("nn::PreNormBlock", "gradients", grad.size(), p.size());
    const auto n = static_cast<std::size_t>(x.size());
    mlp_.template backward<Dev, T>(dev, part(p, 3), part(grad, 3), s.h2, {}, dy, s.s1, ctx.part(s.mlp, 3));
    ln2_.template backward<Dev, T>(dev, part(p, 2), part(grad, 2), s.r, s.h2, s.s1, s.s2);
    dev.for_each(n, AddElements<T>{s.s2.data, dy.data, s.s2.data});  // dr
    attn_.template backward<Dev, T>(dev, part(p, 1), part(grad, 1), s.h1, {}, s.s2, s.s1, ctx.part(s.attn, 1));
    ln1_.template backward<Dev, T>(dev, part(p, 0), part(grad, 0), x, s.h1, s.s1, dx);
    if (!dx.empty()) dev.for_each(n, AddElements<T>{dx.data, s.s2.data, dx.data});
  }

 private:
  template <class T>
  struct Parts {
    MatView<T> h1, r, h2, s1, s2;  // s1, s2: scratch between the parts
    MatView<T> attn, mlp;          // the parts' own saved activations
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
    detail::check_count("nn::PreNormBlock", "parameters", p.size(), n_[0] + n_[1] + n_[2] + n_[3]);
    detail::check_shape("nn::PreNormBlock", "input", x, ctx.shape.rows(), dim_);
    detail::check_saved("nn::PreNormBlock", ctx.saved.size(), saved_size_on<Dev, T>(dev, ctx.shape, dim_),
                        "pass a UnitContext whose saved view holds saved_size(shape) elements");
    detail::Carve<T> c(ctx.saved.data);
    const std::int64_t n = x.rows * dim_, na = saved_size_of<T>(attn_, dev, ctx.shape, dim_),
                       nm = saved_size_of<T>(mlp_, dev, ctx.shape, dim_);
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
  Norm ln1_;
  Attention attn_;
  Norm ln2_;
  Mlp mlp_;
  std::size_t n_[4]{};
};

struct TransformerBlockOptions {
  std::int64_t mlp_ratio = 4;  // the MLP's hidden width, in multiples of dim
  float eps = 1e-5f;           // the LayerNorms'
};

// GPT-2's block: LayerNorm, CausalSelfAttention (fused q|k|v), GeluMLP.
class TransformerBlock : public PreNormBlock<LayerNorm, CausalSelfAttention, GeluMLP> {
 public:
  TransformerBlock(std::int64_t dim, std::int64_t heads, TransformerBlockOptions options = {})
      : PreNormBlock(dim, LayerNorm(dim, {.eps = options.eps}), CausalSelfAttention(dim, heads),
                     LayerNorm(dim, {.eps = options.eps}), GeluMLP(dim, options.mlp_ratio * dim)) {}
};

}  // namespace dtrain::nn
