#pragma once
// The custom unit and model shown in docs/model.md. The region between the
// snippet markers is what the page shows (docs_test checks it), so the
// documented code is always code that compiles and passes.

// [snippet:model_custom_unit]
#include <dtrain/nn/activation.hpp>
#include <dtrain/nn/cross_entropy.hpp>
#include <dtrain/nn/layer_norm.hpp>
#include <dtrain/nn/linear.hpp>

// y = x * gain: one learned gain per feature, initialised to 1.
struct FeatureGain {
  std::int64_t features;

  std::vector<dtrain::ParamSpec> params() const { return {{"gain", {features}, dtrain::Init::ones()}}; }
  std::int64_t out_features(std::int64_t in) const { return in; }

  // Kernels are functors: dev.for_each runs them in a host loop or a GPU kernel.
  template <class T>
  struct TimesGain {  // out = a * gain, the gain broadcast over the rows
    const T* a;
    const T* gain;
    T* out;
    std::int64_t cols;
    DTRAIN_HOST_DEVICE void operator()(std::size_t i) const { out[i] = T(float(a[i]) * float(gain[i % cols])); }
  };
  template <class T>
  struct GainGrad {  // dgain[c] = sum over the rows of dy * x
    dtrain::MatView<const T> x, dy;
    T* dgain;
    DTRAIN_HOST_DEVICE void operator()(std::size_t c) const {
      float acc = 0.f;
      for (std::int64_t r = 0; r < x.rows; ++r) acc += float(dy(r, c)) * float(x(r, c));
      dgain[c] = T(acc);
    }
  };

  template <class Dev, class T>
  void forward(Dev& dev, dtrain::UnitParams<const T> p, dtrain::MatView<const T> x, dtrain::MatView<T> y) {
    dev.for_each(x.size(), TimesGain<T>{x.data, p[0].data, y.data, x.cols});
  }

  template <class Dev, class T>
  void backward(Dev& dev, dtrain::UnitParams<const T> p, dtrain::UnitParams<T> grad, dtrain::MatView<const T> x,
                dtrain::MatView<const T> y, dtrain::MatView<const T> dy, dtrain::MatView<T> dx) {
    (void)y;  // y = x * gain is not needed here
    if (!dx.empty()) dev.for_each(x.size(), TimesGain<T>{dy.data, p[0].data, dx.data, x.cols});
    if (!grad[0].empty()) dev.for_each(x.cols, GainGrad<T>{x, dy, grad[0].data});  // empty: frozen
  }
};

struct TinyClassifier {
  dtrain::nn::Linear fc1{4, 16};
  dtrain::nn::GELU act;
  FeatureGain gain{16};
  dtrain::nn::LayerNorm norm{16};
  dtrain::nn::Linear head{16, 3};
  dtrain::nn::SoftmaxCrossEntropy loss;

  auto units() { return std::tie(fc1, act, gain, norm, head); }
};

static_assert(dtrain::Model<TinyClassifier>);
// [/snippet:model_custom_unit]
