#pragma once
// nn::DropTokens: drops the first `count` tokens of every sequence, [B * T,
// D] -> [B * (T - count), D] (out_shape {B, T - count}): a vision tower's
// class token before its features go on (LLaVA's "default" feature
// strategy). No parameters; the dropped tokens' gradient is zero.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/checks.hpp"

namespace dtrain::nn {

namespace detail {
// kept[r] of one output row per index: out row r = (b, t) reads in row (b, t + count).
template <class T>
struct TokenCopy {
  const T* src;
  T* dst;
  std::int64_t width, kept, count;
  bool forward;  // false: scatter the gradient back, zeroing the dropped rows
  DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const auto e = static_cast<std::int64_t>(i);
    const std::int64_t c = e % width, in_row = e / width, t_in = in_row % (kept + count), b = in_row / (kept + count);
    if (t_in < count) {
      if (!forward) dst[e] = dtype_cast<T>(0.f);
      return;
    }
    const std::int64_t out = ((b * kept) + t_in - count) * width + c;
    if (forward)
      dst[out] = src[e];
    else
      dst[e] = src[out];
  }
};
}  // namespace detail

class DropTokens {
 public:
  explicit DropTokens(std::int64_t count = 1) : count_(count) {}

  std::vector<ParamSpec> params() const { return {}; }
  std::int64_t out_features(std::int64_t in) const { return in; }
  SeqShape out_shape(SeqShape in, SeqShape) const {
    if (in.time <= count_) too_short(in.time);
    return {in.batch, in.time - count_};
  }

  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T>, MatView<const T> x, MatView<T> y, const UnitContext<T>& ctx) {
    check(x, y, ctx.shape);
    dev.for_each(static_cast<std::size_t>(x.size()),
                 detail::TokenCopy<T>{x.data, y.data, x.cols, ctx.shape.time - count_, count_, true});
  }

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T>, UnitParams<T>, MatView<const T> x, MatView<const T>, MatView<const T> dy,
                MatView<T> dx, const UnitContext<T>& ctx) {
    check(x, dy, ctx.shape);
    if (dx.empty()) return;
    dev.for_each(static_cast<std::size_t>(dx.size()),
                 detail::TokenCopy<T>{dy.data, dx.data, dx.cols, ctx.shape.time - count_, count_, false});
  }

 private:
  [[noreturn]] DTRAIN_DECL void too_short(std::int64_t time) const;

  template <class X, class Y>
  void check(MatView<X> x, MatView<Y> y, SeqShape in) const {
    const SeqShape out = out_shape(in, in);
    detail::check_shape("nn::DropTokens", "input", x, in.rows(), x.cols);
    detail::check_shape("nn::DropTokens", "output", y, out.rows(), x.cols);
  }

  std::int64_t count_;
};

}  // namespace dtrain::nn

#if DTRAIN_DEFINE_IMPL
#include "dtrain/nn/drop_tokens.ipp"
#endif
