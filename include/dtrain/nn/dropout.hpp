#pragma once
// nn::Dropout(p): in a training forward each element is zeroed with
// probability p and the rest scaled by 1 / (1 - p) (inverted dropout, as
// PyTorch's nn.Dropout); in evaluate() and predict() it is the identity.
// Whether element i is kept is a pure function of the unit's random stream
// (UnitContext::stream: seed, rank, step, micro-batch, unit) and i, so the
// backward pass, a forward recomputed under activation checkpointing and a
// resumed run see the same mask, and nothing is kept in memory for it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

namespace detail {

// out[i] = in[i] * scale where element i is kept, 0 elsewhere; the same
// functor drops the forward's input and the backward's gradient. Add: out[i]
// += that instead (a LoRA adapter's input gradient, nn/lora.hpp).
template <class T, bool Add = false>
struct DropoutApply {
  const T* in;
  T* out;
  std::uint64_t stream;
  float p, scale;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const bool keep = dtrain::detail::uniform01(stream, i) >= p;
    const float v = keep ? static_cast<float>(in[i]) * scale : 0.f;
    if constexpr (Add)
      out[i] = dtype_cast<T>(static_cast<float>(out[i]) + v);
    else
      out[i] = dtype_cast<T>(v);
  }
};

template <class T>
struct CopyElements {
  const T* in;
  T* out;
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { out[i] = in[i]; }
};

}  // namespace detail

class Dropout {
 public:
  DTRAIN_DECL explicit Dropout(float p = 0.1f);

  float p() const { return p_; }
  std::vector<ParamSpec> params() const { return {}; }
  std::int64_t out_features(std::int64_t in) const { return in; }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    nn::detail::check_count("nn::Dropout", "parameters", p.size(), 0);
    nn::detail::check_shape("nn::Dropout", "output", y, x.rows, x.cols);
    apply(dev, x.data, y.data, static_cast<std::size_t>(x.size()), ctx);
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T>, MatView<const T> x, MatView<const T>, MatView<const T> dy,
                MatView<T> dx, const UnitContext<T>& ctx) {
    if (dx.empty()) return;
    nn::detail::check_shape("nn::Dropout", "input gradient", dx, x.rows, x.cols);
    apply(dev, dy.data, dx.data, static_cast<std::size_t>(dy.size()), ctx);
  }

 private:
  template <class Dev, class T>
  void apply(Dev& dev, const T* in, T* out, std::size_t n, const UnitContext<T>& ctx) const {
    if (ctx.training && p_ > 0.f)
      dev.for_each(n, detail::DropoutApply<T>{in, out, ctx.stream, p_, 1.f / (1.f - p_)});
    else
      dev.for_each(n, detail::CopyElements<T>{in, out});
  }

  float p_;
};

}  // namespace dtrain::nn

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_DROPOUT_FUNCTORS(EACH, SUM, T)        \
  EACH(::dtrain::nn::detail::DropoutApply<T, false>) \
  EACH(::dtrain::nn::detail::DropoutApply<T, true>)

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/dropout.ipp"
#endif
