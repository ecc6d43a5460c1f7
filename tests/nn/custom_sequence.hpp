#pragma once
// The custom loss, sequence unit and models shown in docs/model.md. The
// regions between the snippet markers are what the page shows (docs_test
// checks it), so the documented code is always code that compiles and passes
// (custom_sequence_test.cpp tests and trains it).

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

// [snippet:model_huber_loss]
#include <dtrain/backend/host/device.hpp>
#include <dtrain/nn/activation.hpp>
#include <dtrain/nn/linear.hpp>

// Huber loss over float targets "y", one per predicted value, d = prediction - target:
//   0.5 d^2 where |d| <= delta, delta (|d| - delta / 2) beyond
// A mean over every element, as PyTorch's nn.HuberLoss: count() says how many.
struct HuberLoss {
  float delta = 1.f;

  // This micro-batch's share of the normaliser; the Trainer sums it over
  // micro-batches and ranks before any compute.
  double count(const dtrain::Batch& batch) const { return static_cast<double>(batch.at("y").numel()); }

  template <class T>
  struct RowLoss {  // the summed loss of one row
    dtrain::MatView<const T> pred;
    const float* y;
    float delta;
    DTRAIN_HOST_DEVICE double operator()(std::size_t i) const {
      const auto r = static_cast<std::int64_t>(i);
      double sum = 0.0;
      for (std::int64_t c = 0; c < pred.cols; ++c) {
        const float d = float(pred(r, c)) - y[r * pred.cols + c], a = d < 0.f ? -d : d;
        sum += a <= delta ? 0.5f * d * d : delta * (a - 0.5f * delta);
      }
      return sum;
    }
  };
  template <class T>
  struct Grad {  // d(loss)/d(prediction) * scale: d clamped to [-delta, delta]
    const T* pred;
    const float* y;
    T* dpred;
    float delta, scale;
    DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
      const float d = float(pred[i]) - y[i];
      dpred[i] = T((d > delta ? delta : (d < -delta ? -delta : d)) * scale);
    }
  };

  template <class Dev, class T>
  double forward(Dev& dev, dtrain::MatView<const T> pred, const dtrain::DeviceBatch& batch) {
    return dev.sum(static_cast<std::size_t>(pred.rows), RowLoss<T>{pred, targets(pred, batch), delta});
  }

  template <class Dev, class T>
  void backward(Dev& dev, dtrain::MatView<const T> pred, const dtrain::DeviceBatch& batch, dtrain::MatView<T> dpred,
                float scale) {
    dev.for_each(static_cast<std::size_t>(pred.size()),
                 Grad<T>{pred.data, targets(pred, batch), dpred.data, delta, scale});
  }

  template <class T>
  static const float* targets(dtrain::MatView<const T> pred, const dtrain::DeviceBatch& batch) {
    const dtrain::DeviceTensor& y = batch.at("y");
    if (y.numel() != pred.size())
      throw dtrain::config_error("HuberLoss: " + std::to_string(y.numel()) + " targets for " +
                                     std::to_string(pred.size()) + " predicted values",
                                 "give y one float per output of the last unit");
    return y.data<float>();  // throws unless y holds float32
  }
};

// Three features in, two regression targets out: x float [B, 3], y float [B, 2].
struct TinyRegressor {
  dtrain::nn::Linear fc1{3, 32};
  dtrain::nn::GELU act1;
  dtrain::nn::Linear fc2{32, 32};
  dtrain::nn::GELU act2;
  dtrain::nn::Linear head{32, 2};
  HuberLoss loss{.delta = 0.5f};

  auto units() { return std::tie(fc1, act1, fc2, act2, head); }
};

static_assert(dtrain::Loss<HuberLoss, dtrain::Host, float>);
static_assert(dtrain::Model<TinyRegressor>);
// [/snippet:model_huber_loss]

// [snippet:model_sequence_unit]
#include <dtrain/nn/regression_loss.hpp>

// A sequence unit over activations [rows = batch * time, width], row b * time + t:
//   y[b, t] = x[b, t] + gain * mean(x[b, 0..t])
// Each position mixes in the running mean of its own sequence up to itself.
// The means are kept from forward to backward in ctx.saved.
struct CausalMeanMix {
  std::int64_t features;

  std::vector<dtrain::ParamSpec> params() const { return {{"gain", {features}, dtrain::Init::zeros()}}; }
  std::int64_t out_features(std::int64_t in) const { return in; }
  // Elements of ctx.saved the unit needs: one mean per activation.
  std::int64_t saved_size(dtrain::SeqShape shape, std::int64_t in) const { return shape.rows() * in; }

  template <class T>
  struct Forward {  // one (sequence, feature) pair per index, forward in time
    dtrain::MatView<const T> x;
    const T* gain;
    dtrain::MatView<T> mean, y;
    std::int64_t time;
    DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
      const auto b = static_cast<std::int64_t>(i) / x.cols, c = static_cast<std::int64_t>(i) % x.cols;
      float sum = 0.f;
      for (std::int64_t t = 0; t < time; ++t) {
        const std::int64_t r = b * time + t;
        sum += float(x(r, c));
        mean(r, c) = T(sum / float(t + 1));
        y(r, c) = T(float(x(r, c)) + float(gain[c]) * float(mean(r, c)));
      }
    }
  };
  template <class T>
  struct InputGrad {  // dx[b, s] = dy[b, s] + gain * sum over t >= s of dy[b, t] / (t + 1)
    dtrain::MatView<const T> dy;
    const T* gain;
    dtrain::MatView<T> dx;
    std::int64_t time;
    DTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
      const auto b = static_cast<std::int64_t>(i) / dy.cols, c = static_cast<std::int64_t>(i) % dy.cols;
      float acc = 0.f;
      for (std::int64_t t = time - 1; t >= 0; --t) {
        const std::int64_t r = b * time + t;
        acc += float(dy(r, c)) / float(t + 1);
        dx(r, c) = T(float(dy(r, c)) + float(gain[c]) * acc);
      }
    }
  };
  template <class T>
  struct GainGrad {  // dgain[c] = sum over the rows of dy * mean
    dtrain::MatView<const T> dy, mean;
    T* dgain;
    DTRAIN_HOST_DEVICE void operator()(std::size_t c) const {
      float acc = 0.f;
      for (std::int64_t r = 0; r < dy.rows; ++r) acc += float(dy(r, c)) * float(mean(r, c));
      dgain[c] = T(acc);
    }
  };

  template <class Dev, class T>
  void forward(Dev& dev, dtrain::UnitParams<const T> p, dtrain::MatView<const T> x, dtrain::MatView<T> y,
               const dtrain::UnitContext<T>& ctx) {
    const dtrain::MatView<T> mean{ctx.saved.data, x.rows, x.cols};
    dev.for_each(static_cast<std::size_t>(ctx.shape.batch * x.cols), Forward<T>{x, p[0].data, mean, y, ctx.shape.time});
  }

  template <class Dev, class T>
  void backward(Dev& dev, dtrain::UnitParams<const T> p, dtrain::UnitParams<T> grad, dtrain::MatView<const T> x,
                dtrain::MatView<const T> y, dtrain::MatView<const T> dy, dtrain::MatView<T> dx,
                const dtrain::UnitContext<T>& ctx) {
    (void)y;
    // The means of this micro-batch's forward (recomputed just before this
    // call under activation checkpointing).
    const dtrain::MatView<const T> mean{ctx.saved.data, x.rows, x.cols};
    if (!dx.empty())
      dev.for_each(static_cast<std::size_t>(ctx.shape.batch * x.cols), InputGrad<T>{dy, p[0].data, dx, ctx.shape.time});
    if (!grad[0].empty()) dev.for_each(static_cast<std::size_t>(x.cols), GainGrad<T>{dy, mean, grad[0].data});
  }
};

// Two features per position in, two targets per position out: x float
// [B, T, 2] (the Trainer takes B and T from its shape), y float [B, T, 2].
struct RunningMeanRegressor {
  dtrain::nn::Linear in{2, 16};
  CausalMeanMix mix1{16};
  dtrain::nn::GELU act;
  CausalMeanMix mix2{16};
  dtrain::nn::Linear out{16, 2};
  dtrain::nn::MSELoss loss;

  auto units() { return std::tie(in, mix1, act, mix2, out); }
};

static_assert(dtrain::Unit<CausalMeanMix, dtrain::Host, float>);
static_assert(dtrain::Model<RunningMeanRegressor>);
// [/snippet:model_sequence_unit]
