#pragma once
// Float64 reference forwards of the nn units, written independently of the
// library, central finite differences over them, and the host check that
// compares a unit with both.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "nn/unit_harness.hpp"

#include "dtrain/backend/host/device.hpp"

namespace dtrain::testing {

using dtypes = std::tuple<float, bf16, fp16>;

// y = f(params, x) for one unit, rows inferred from x.
using RefForward =
    std::function<std::vector<double>(const std::vector<std::vector<double>>& params, const std::vector<double>& x)>;

// d f / d v of a scalar function by central differences. With h = 1e-6 in
// float64 the error is ~1e-9 (truncation h^2, cancellation eps/h): far below
// every tolerance the tests use.
inline std::vector<double> finite_difference(const std::function<double(const std::vector<double>&)>& f,
                                             std::vector<double> v) {
  std::vector<double> grad(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double old = v[i], h = 1e-6 * std::max(1.0, std::abs(old));
    v[i] = old + h;
    const double up = f(v);
    v[i] = old - h;
    const double down = f(v);
    v[i] = old;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

struct FdGrads {
  std::vector<double> dx;
  std::vector<std::vector<double>> grads;
};

// Gradients of sum(dy * ref(params, x)): what a unit's backward computes.
inline FdGrads finite_difference_grads(const RefForward& ref, const UnitCase& c) {
  const auto dot_dy = [&](const std::vector<double>& y) {
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += c.dy[i] * y[i];
    return s;
  };
  FdGrads fd;
  fd.dx = finite_difference([&](const std::vector<double>& x) { return dot_dy(ref(c.params, x)); }, c.x);
  for (std::size_t p = 0; p < c.params.size(); ++p)
    fd.grads.push_back(finite_difference(
        [&](const std::vector<double>& v) {
          auto params = c.params;
          params[p] = v;
          return dot_dy(ref(params, c.x));
        },
        c.params[p]));
  return fd;
}

// Tolerances against float64, relative to the largest reference element:
// fp32 computes to ~1e-6; bf16/fp16 add one rounding of the result.
template <class T>
constexpr double forward_tol = std::is_same_v<T, float> ? 1e-5 : roundoff<T>() + 2e-5;
template <class T>
constexpr double backward_tol = std::is_same_v<T, float> ? 1e-4 : roundoff<T>() + 1e-4;

// Runs `unit` on `dev` in dtype T on a random case and checks its forward
// against `ref` and every gradient against finite differences of `ref`.
// `scale` widens the tolerances for composite units, whose result passes
// through several roundings in T (1 for a single operation).
template <class T, class Dev, class U>
void check_unit_on(Dev& dev, U unit, const RefForward& ref, std::int64_t rows, std::int64_t in, bool want_dx = true,
                   SeqShape shape = {}, double scale = 1.0) {
  const UnitCase c = rounded<T>(make_case(unit, rows, in, 42));
  const UnitResult r = run_unit<T>(dev, unit, c, want_dx, shape);
  expect_close(r.y, ref(c.params, c.x), scale * forward_tol<T>, "forward");
  const FdGrads fd = finite_difference_grads(ref, c);
  if (want_dx) expect_close(r.dx, fd.dx, scale * backward_tol<T>, "input gradient");
  for (std::size_t i = 0; i < c.specs.size(); ++i) {
    if (c.specs[i].trainable)
      expect_close(r.grads[i], fd.grads[i], scale * backward_tol<T>, c.specs[i].name + " gradient");
    else
      BOOST_TEST(r.grads[i].empty(), c.specs[i].name + " is frozen and has no gradient");
  }
}

// The same on the host.
template <class T, class U>
void check_unit(U unit, const RefForward& ref, std::int64_t rows, std::int64_t in, bool want_dx = true,
                SeqShape shape = {}, double scale = 1.0) {
  Host dev(1);
  check_unit_on<T>(dev, std::move(unit), ref, rows, in, want_dx, shape, scale);
}

inline RefForward linear_reference(std::int64_t in, std::int64_t out, bool bias) {
  return [=](const std::vector<std::vector<double>>& p, const std::vector<double>& x) {
    const auto rows = static_cast<std::int64_t>(x.size()) / in;
    std::vector<double> y(static_cast<std::size_t>(rows * out));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        double acc = bias ? p[1][static_cast<std::size_t>(o)] : 0.0;
        for (std::int64_t i = 0; i < in; ++i)
          acc += x[static_cast<std::size_t>(r * in + i)] * p[0][static_cast<std::size_t>(o * in + i)];
        y[static_cast<std::size_t>(r * out + o)] = acc;
      }
    return y;
  };
}

inline RefForward elementwise_reference(double (*f)(double)) {
  return [=](const std::vector<std::vector<double>>&, std::vector<double> x) {
    std::transform(x.begin(), x.end(), x.begin(), f);
    return x;
  };
}

inline RefForward relu_reference() {
  return elementwise_reference([](double v) { return std::max(v, 0.0); });
}

// The exact GELU, x * Phi(x), as PyTorch's default.
inline RefForward gelu_reference() {
  return elementwise_reference([](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); });
}

// GPT-2's tanh approximation, written with tanh as transformers' gelu_new does.
inline RefForward gelu_tanh_reference() {
  return elementwise_reference([](double v) {
    return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::acos(-1.0)) * (v + 0.044715 * v * v * v)));
  });
}

inline RefForward silu_reference() {
  return elementwise_reference([](double v) { return v / (1.0 + std::exp(-v)); });
}

// x [rows, 2 hidden] = gate | up  ->  silu(gate) * up; with `geglu` the
// tanh GELU (as PyTorch's gelu(approximate="tanh")) in silu's place.
inline RefForward swiglu_reference(std::int64_t hidden, bool geglu = false) {
  return [=](const std::vector<std::vector<double>>&, const std::vector<double>& x) {
    const auto rows = static_cast<std::int64_t>(x.size()) / (2 * hidden);
    std::vector<double> y(static_cast<std::size_t>(rows * hidden));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < hidden; ++j) {
        const double g = x[static_cast<std::size_t>(r * 2 * hidden + j)];
        const double u = x[static_cast<std::size_t>(r * 2 * hidden + hidden + j)];
        const double act =
            geglu ? 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / std::acos(-1.0)) * (g + 0.044715 * g * g * g)))
                  : g / (1.0 + std::exp(-g));
        y[static_cast<std::size_t>(r * hidden + j)] = act * u;
      }
    return y;
  };
}

// offset: Gemma's form, the scale offset + weight.
inline RefForward rms_norm_reference(std::int64_t features, double eps, double offset = 0.0) {
  return [=](const std::vector<std::vector<double>>& p, const std::vector<double>& x) {
    std::vector<double> y(x.size());
    for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(features); ++r) {
      const double* row = &x[r * static_cast<std::size_t>(features)];
      double ms = 0.0;
      for (std::int64_t c = 0; c < features; ++c) ms += row[c] * row[c] / static_cast<double>(features);
      for (std::int64_t c = 0; c < features; ++c)
        y[r * static_cast<std::size_t>(features) + static_cast<std::size_t>(c)] =
            row[c] / std::sqrt(ms + eps) * (offset + p[0][static_cast<std::size_t>(c)]);
    }
    return y;
  };
}

inline RefForward layer_norm_reference(std::int64_t features, double eps) {
  return [=](const std::vector<std::vector<double>>& p, const std::vector<double>& x) {
    const auto rows = static_cast<std::int64_t>(x.size()) / features;
    std::vector<double> y(x.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      const double* row = &x[static_cast<std::size_t>(r * features)];
      double mean = 0.0, var = 0.0;
      for (std::int64_t c = 0; c < features; ++c) mean += row[c] / static_cast<double>(features);
      for (std::int64_t c = 0; c < features; ++c)
        var += (row[c] - mean) * (row[c] - mean) / static_cast<double>(features);
      for (std::int64_t c = 0; c < features; ++c) {
        const auto k = static_cast<std::size_t>(c);
        y[static_cast<std::size_t>(r * features + c)] = (row[c] - mean) / std::sqrt(var + eps) * p[0][k] + p[1][k];
      }
    }
    return y;
  };
}

using Params = std::vector<std::vector<double>>;

inline Params slice(const Params& p, std::size_t first, std::size_t count) {
  return {p.begin() + static_cast<std::ptrdiff_t>(first), p.begin() + static_cast<std::ptrdiff_t>(first + count)};
}

// Causal multi-head self-attention in float64, loop by loop.
inline RefForward attention_reference(std::int64_t dim, std::int64_t heads, SeqShape s) {
  return [=](const Params& p, const std::vector<double>& x) {
    const std::int64_t hd = dim / heads, n = s.rows();
    const auto qkv = linear_reference(dim, 3 * dim, true)(slice(p, 0, 2), x);
    std::vector<double> merged(static_cast<std::size_t>(n * dim), 0.0);
    const auto at = [&](std::int64_t row, std::int64_t part, std::int64_t h, std::int64_t d) {
      return qkv[static_cast<std::size_t>(row * 3 * dim + part * dim + h * hd + d)];
    };
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t t1 = 0; t1 < s.time; ++t1) {
          const std::int64_t row = b * s.time + t1;
          std::vector<double> score(static_cast<std::size_t>(t1 + 1));
          for (std::int64_t j = 0; j <= t1; ++j) {
            double dot = 0.0;
            for (std::int64_t d = 0; d < hd; ++d) dot += at(row, 0, h, d) * at(b * s.time + j, 1, h, d);
            score[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
          }
          const double mx = *std::max_element(score.begin(), score.end());
          double sum = 0.0;
          for (auto& v : score) sum += (v = std::exp(v - mx));
          for (std::int64_t d = 0; d < hd; ++d) {
            double o = 0.0;
            for (std::int64_t j = 0; j <= t1; ++j)
              o += score[static_cast<std::size_t>(j)] / sum * at(b * s.time + j, 2, h, d);
            merged[static_cast<std::size_t>(row * dim + h * hd + d)] = o;
          }
        }
    return linear_reference(dim, dim, true)(slice(p, 2, 2), merged);
  };
}

// Sum over rows of logsumexp(z) - z[label].
inline double cross_entropy_reference(const std::vector<double>& z, const std::vector<std::int32_t>& labels,
                                      std::int64_t classes) {
  double total = 0.0;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    const double* row = &z[r * static_cast<std::size_t>(classes)];
    const double mx = *std::max_element(row, row + classes);
    double s = 0.0;
    for (std::int64_t c = 0; c < classes; ++c) s += std::exp(row[c] - mx);
    total += mx + std::log(s) - row[labels[r]];
  }
  return total;
}

// Softmax of each row of scores [rows = batch * heads * time, time] over its
// causal columns that `mask` ([batch, time], 0 = padding; empty: none)
// keeps, in float64; masked columns are 0.
inline std::vector<double> masked_softmax_reference(const std::vector<double>& att, std::int64_t time,
                                                    std::int64_t heads, const std::vector<std::int32_t>& mask) {
  std::vector<double> out(att.size(), 0.0);
  const auto rows = static_cast<std::int64_t>(att.size()) / time;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t tq = r % time, seq = r / (heads * time);
    const auto on = [&](std::int64_t j) {
      return j <= tq && (mask.empty() || mask[static_cast<std::size_t>(seq * time + j)] != 0);
    };
    double mx = -1e300, sum = 0.0;
    for (std::int64_t j = 0; j < time; ++j)
      if (on(j)) mx = std::max(mx, att[static_cast<std::size_t>(r * time + j)]);
    for (std::int64_t j = 0; j < time; ++j)
      if (on(j)) sum += std::exp(att[static_cast<std::size_t>(r * time + j)] - mx);
    for (std::int64_t j = 0; j < time; ++j)
      if (on(j))
        out[static_cast<std::size_t>(r * time + j)] = std::exp(att[static_cast<std::size_t>(r * time + j)] - mx) / sum;
  }
  return out;
}

}  // namespace dtrain::testing
