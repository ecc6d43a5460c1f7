#pragma once
// Runs one unit's forward and backward on any device from host-side float64
// inputs, the way a strategy would (library-owned buffers, views into them),
// and brings every result back as float64. Shared by the host tests (against
// float64 references) and the GPU tests (Cuda against Host).

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/numeric.hpp"
#include "support/batches.hpp"

#include "dtrain/core/view.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/model/param.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/cross_entropy.hpp"

namespace dtrain::testing {

// Inputs for one unit: parameters, input x [rows, in] and upstream gradient dy [rows, out].
struct UnitCase {
  std::int64_t rows = 0, in = 0, out = 0;
  std::vector<ParamSpec> specs;
  std::vector<std::vector<double>> params;
  std::vector<double> x, dy;
};

// Random non-zero values everywhere, parameters included (an initial LayerNorm
// weight of ones would hide a mistake in how the weight enters the gradient).
template <class U>
UnitCase make_case(const U& unit, std::int64_t rows, std::int64_t in, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  UnitCase c{rows, in, unit.out_features(in), unit.params(), {}, {}, {}};
  for (const auto& s : c.specs) c.params.push_back(random_nonzero(static_cast<std::size_t>(s.numel()), rng));
  c.x = random_nonzero(static_cast<std::size_t>(rows * in), rng, 2.0);
  c.dy = random_nonzero(static_cast<std::size_t>(rows * c.out), rng);
  return c;
}

// The same case with every value rounded to T, so a float64 reference sees
// exactly what a unit computing in T sees.
template <class T>
UnitCase rounded(UnitCase c) {
  for (auto& p : c.params) p = round_to<T>(std::move(p));
  c.x = round_to<T>(std::move(c.x));
  c.dy = round_to<T>(std::move(c.dy));
  return c;
}

struct UnitResult {
  std::vector<double> y, dx;
  std::vector<std::vector<double>> grads;  // empty for a frozen parameter
};

template <class T, class Dev>
typename Dev::template buffer<T> upload(Dev& dev, const std::vector<double>& v) {
  const std::vector<T> host = to_dtype<T>(v);
  auto b = make_buffer<T>(dev, host.size());
  dev.copy_from_host(b.data(), host.data(), host.size());
  return b;
}

template <class T, class Dev>
std::vector<double> download(Dev& dev, const typename Dev::template buffer<T>& b) {
  std::vector<T> host(b.size());
  dev.copy_to_host(host.data(), b.data(), b.size());
  return to_double<T>(std::span<const T>(host));
}

// A parameter of any rank is viewed as [shape[0], rest] (core/view.hpp).
template <class T>
MatView<T> param_view(T* data, const ParamSpec& s) {
  return {data, s.shape.at(0), s.numel() / s.shape.at(0)};
}

// A case's parameters on the device and their gradient buffers, with the
// views a unit takes. A frozen parameter gets no gradient memory (an empty
// view) unless every_grad asks for one.
template <class T, class Dev>
struct DeviceParams {
  std::vector<typename Dev::template buffer<T>> params, grads;
  std::vector<MatView<const T>> values;
  std::vector<MatView<T>> grad_views;

  DeviceParams(Dev& dev, const UnitCase& c, bool every_grad = false) {
    for (std::size_t i = 0; i < c.specs.size(); ++i) {
      const bool grad = every_grad || c.specs[i].trainable;
      params.push_back(upload<T>(dev, c.params[i]));
      values.push_back(param_view<const T>(params.back().data(), c.specs[i]));
      grads.push_back(grad ? make_buffer<T>(dev, static_cast<std::size_t>(c.specs[i].numel()))
                           : typename Dev::template buffer<T>{});
      grad_views.push_back(grad ? param_view<T>(grads.back().data(), c.specs[i]) : MatView<T>{});
    }
  }
};

// `shape`: the sequence shape (rows = batch * time) a context unit sees; its
// saved activations get a buffer of the size it asks for.
// `batch` (optional): what the unit finds as the batch (an attention_mask);
// `lanes` (optional): the lanes it reads and writes (the caller's buffers).
template <class T, class Dev, class U>
UnitResult run_unit(Dev& dev, U& unit, const UnitCase& c, bool want_dx = true, SeqShape shape = {},
                    const DeviceBatch* batch = nullptr, const Lanes<T>* lanes = nullptr) {
  using buffer = typename Dev::template buffer<T>;
  const DeviceParams<T, Dev> d(dev, c);
  const auto& pv = d.values;
  const auto& gv = d.grad_views;
  const buffer x = upload<T>(dev, c.x), dy = upload<T>(dev, c.dy);
  buffer y = make_buffer<T>(dev, static_cast<std::size_t>(c.rows * c.out));
  buffer dx = make_buffer<T>(dev, want_dx ? static_cast<std::size_t>(c.rows * c.in) : 0);
  const MatView<const T> xv = x.view(c.rows, c.in), dyv = dy.view(c.rows, c.out);
  const MatView<T> dxv = want_dx ? dx.view(c.rows, c.in) : MatView<T>{};
  if constexpr (detail::context_unit<U, Dev, T>) {
    if (shape.rows() != c.rows) shape = {c.rows, 1};
    buffer saved = make_buffer<T>(dev, static_cast<std::size_t>(saved_size_of<T>(unit, dev, shape, c.in)));
    // A training call with a fixed random stream: nn::Dropout draws the same mask on every device.
    const UnitContext<T> ctx{shape, saved.view(1, static_cast<std::int64_t>(saved.size())), true, 99, batch, lanes};
    unit.template forward<Dev, T>(dev, pv, xv, y.view(c.rows, c.out), ctx);
    unit.template backward<Dev, T>(dev, pv, gv, xv, std::as_const(y).view(c.rows, c.out), dyv, dxv, ctx);
  } else {
    unit.template forward<Dev, T>(dev, pv, xv, y.view(c.rows, c.out));
    unit.template backward<Dev, T>(dev, pv, gv, xv, std::as_const(y).view(c.rows, c.out), dyv, dxv);
  }
  UnitResult r{download<T>(dev, y), download<T>(dev, dx), {}};
  for (const auto& g : d.grads) r.grads.push_back(download<T>(dev, g));
  return r;
}

struct LossResult {
  double loss;
  std::vector<double> dlogits;
};

template <class T, class Dev, class L = nn::SoftmaxCrossEntropy>
LossResult run_loss(Dev& dev, const std::vector<double>& logits, const std::vector<std::int32_t>& labels,
                    std::int64_t classes, float scale) {
  const auto rows = static_cast<std::int64_t>(labels.size());
  const auto z = upload<T>(dev, logits);
  typename Dev::template buffer<std::int32_t> lab;
  const DeviceBatch batch = label_batch(dev, labels, lab);
  auto dz = make_buffer<T>(dev, logits.size());
  L loss;
  const double sum = loss.template forward<Dev, T>(dev, z.view(rows, classes), batch);
  loss.template backward<Dev, T>(dev, z.view(rows, classes), batch, dz.view(rows, classes), scale);
  return {sum, download<T>(dev, dz)};
}

}  // namespace dtrain::testing
