#pragma once
// A unit the consumer writes itself, to show that a model need not be built
// from dtrain's ready units alone: y = x * scale + shift, one learned scale and
// shift per feature. The library owns its parameters and gradients; the unit
// only declares them and computes on the views it is handed.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <dtrain/core/macros.hpp>
#include <dtrain/model/unit.hpp>

namespace consumer {

struct Affine {
  std::int64_t features;

  std::vector<dtrain::ParamSpec> params() const {
    return {{"scale", {features}, dtrain::Init::ones()}, {"shift", {features}, dtrain::Init::zeros()}};
  }
  std::int64_t out_features(std::int64_t in) const { return in; }

  // Kernels are functors over an element (or a column) index: dev.for_each
  // runs them in a host loop, or as a CUDA kernel when this header is
  // compiled by nvcc for dtrain::Cuda.
  template <class T>
  struct Forward {  // y[r, c] = x[r, c] * scale[c] + shift[c]
    const T* x;
    const T* scale;
    const T* shift;
    T* y;
    std::int64_t cols;
    DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
      const auto c = static_cast<std::int64_t>(i) % cols;
      y[i] = T(float(x[i]) * float(scale[c]) + float(shift[c]));
    }
  };
  template <class T>
  struct InputGrad {  // dx[r, c] = dy[r, c] * scale[c]
    const T* dy;
    const T* scale;
    T* dx;
    std::int64_t cols;
    DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
      dx[i] = T(float(dy[i]) * float(scale[static_cast<std::int64_t>(i) % cols]));
    }
  };
  // One thread per feature sums over the rows: dscale[c] = sum dy * x,
  // dshift[c] = sum dy. A null output is a frozen parameter and is skipped.
  template <class T>
  struct ParamGrad {
    dtrain::MatView<const T> x, dy;
    T* dscale;
    T* dshift;
    DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
      const auto c = static_cast<std::int64_t>(i);
      float ds = 0.f, db = 0.f;
      for (std::int64_t r = 0; r < x.rows; ++r) {
        ds += float(dy(r, c)) * float(x(r, c));
        db += float(dy(r, c));
      }
      if (dscale != nullptr) dscale[c] = T(ds);
      if (dshift != nullptr) dshift[c] = T(db);
    }
  };

  template <class Dev, class T>
  void forward(Dev& dev, dtrain::UnitParams<const T> p, dtrain::MatView<const T> x, dtrain::MatView<T> y) {
    dev.for_each(static_cast<std::size_t>(x.size()), Forward<T>{x.data, p[0].data, p[1].data, y.data, x.cols});
  }

  template <class Dev, class T>
  void backward(Dev& dev, dtrain::UnitParams<const T> p, dtrain::UnitParams<T> grad, dtrain::MatView<const T> x,
                dtrain::MatView<const T> y, dtrain::MatView<const T> dy, dtrain::MatView<T> dx) {
    (void)y;  // the gradients need x, not the output
    if (!dx.empty())
      dev.for_each(static_cast<std::size_t>(x.size()), InputGrad<T>{dy.data, p[0].data, dx.data, x.cols});
    if (!grad[0].empty() || !grad[1].empty())
      dev.for_each(static_cast<std::size_t>(x.cols), ParamGrad<T>{x, dy, grad[0].data, grad[1].data});
  }
};

}  // namespace consumer
