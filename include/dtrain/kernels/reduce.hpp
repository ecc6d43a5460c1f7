#pragma once
// Reductions over flat buffers, through dev.sum (a double read back to the
// host): the squared gradient norm for clipping and the non-finite check for
// fp16 loss scaling.
//
// One pass answers both: squares of finite floats sum to a finite double (the
// largest float squared is ~1e77, far below the double range), so the squared
// norm is inf or NaN exactly when some element is. NonFiniteCount is there to
// say how many, for messages.

#include <cstddef>
#include <span>
#include <type_traits>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/kernels/math.hpp"

namespace dtrain {

template <Dtype T>
struct SquaredNorm {
  const T* data;
  DTRAIN_HOST_DEVICE double operator()(std::size_t i) const {
    const double v = static_cast<float>(data[i]);
    return v * v;
  }
};

template <Dtype T>
struct NonFiniteCount {
  const T* data;
  DTRAIN_HOST_DEVICE double operator()(std::size_t i) const {
    return math::is_finite(static_cast<float>(data[i])) ? 0.0 : 1.0;
  }
};

// sum of x[i]^2 over a buffer on `dev` (T may be const-qualified).
template <class Dev, class T>
requires Dtype<std::remove_const_t<T>>
double squared_norm(Dev& dev, std::span<T> x) {
  return dev.sum(x.size(), SquaredNorm<std::remove_const_t<T>>{x.data()});
}

template <class Dev, class T>
requires Dtype<std::remove_const_t<T>> std::size_t count_non_finite(Dev& dev, std::span<T> x) {
  return static_cast<std::size_t>(dev.sum(x.size(), NonFiniteCount<std::remove_const_t<T>>{x.data()}));
}

}  // namespace dtrain

// The functors whose host loops are compiled once, for dtype T, fully
// qualified: EACH(F) for_each's, SUM(F) sum's (train/builtin_templates.hpp
// gathers the lists, backend/host/train_instances.hpp applies them).
#define DTRAIN_REDUCE_FUNCTORS(EACH, SUM, T) \
  SUM(::dtrain::SquaredNorm<T>)              \
  SUM(::dtrain::NonFiniteCount<T>)
