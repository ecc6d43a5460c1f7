#pragma once
// Float64 references of the sequence units (Llama-style rotary attention, the
// GELU MLP, the pre-LayerNorm transformer block, learned positions), written
// loop by loop independently of the library; shared by the host tests and
// the GPU tests.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "nn/reference.hpp"

namespace dtrain::testing {

inline std::vector<double> add(std::vector<double> a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

// Llama-style attention in float64: separate q/k/v projections, rotary
// embedding (half-split pairs, angle t / theta^(2i / hd)), key/value head
// h * kv_heads / heads for query head h, causal softmax, output projection.
inline RefForward rotary_attention_reference(std::int64_t dim, std::int64_t heads, std::int64_t kv_heads, double theta,
                                             bool qkv_bias, bool out_bias, SeqShape s) {
  return [=](const Params& p, const std::vector<double>& x) {
    const std::int64_t hd = dim / heads, kv = kv_heads * hd, half = hd / 2;
    const auto proj = [&](std::size_t w, std::int64_t out, int b) {
      Params wb{p[w]};
      if (b >= 0) wb.push_back(p[static_cast<std::size_t>(b)]);
      return linear_reference(dim, out, b >= 0)(wb, x);
    };
    auto q = proj(0, dim, qkv_bias ? 4 : -1);
    auto k = proj(1, kv, qkv_bias ? 5 : -1);
    const auto v = proj(2, kv, qkv_bias ? 6 : -1);
    const auto rotate = [&](std::vector<double>& m, std::int64_t width) {
      if (theta == 0.0) return;
      for (std::int64_t row = 0; row < s.rows(); ++row)
        for (std::int64_t h = 0; h < width / hd; ++h)
          for (std::int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(row % s.time) / std::pow(theta, 2.0 * i / hd);
            double& a = m[static_cast<std::size_t>(row * width + h * hd + i)];
            double& b = m[static_cast<std::size_t>(row * width + h * hd + i + half)];
            const double a0 = a, b0 = b;
            a = a0 * std::cos(angle) - b0 * std::sin(angle);
            b = b0 * std::cos(angle) + a0 * std::sin(angle);
          }
    };
    rotate(q, dim);
    rotate(k, kv);
    std::vector<double> merged(static_cast<std::size_t>(s.rows() * dim), 0.0);
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t g = h / (heads / kv_heads);
        for (std::int64_t t1 = 0; t1 < s.time; ++t1) {
          const std::int64_t row = b * s.time + t1;
          std::vector<double> score(static_cast<std::size_t>(t1 + 1));
          for (std::int64_t j = 0; j <= t1; ++j) {
            double dot = 0.0;
            for (std::int64_t d = 0; d < hd; ++d)
              dot += q[static_cast<std::size_t>(row * dim + h * hd + d)] *
                     k[static_cast<std::size_t>((b * s.time + j) * kv + g * hd + d)];
            score[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
          }
          const double mx = *std::max_element(score.begin(), score.end());
          double sum = 0.0;
          for (auto& e : score) sum += (e = std::exp(e - mx));
          for (std::int64_t d = 0; d < hd; ++d) {
            double o = 0.0;
            for (std::int64_t j = 0; j <= t1; ++j)
              o += score[static_cast<std::size_t>(j)] / sum *
                   v[static_cast<std::size_t>((b * s.time + j) * kv + g * hd + d)];
            merged[static_cast<std::size_t>(row * dim + h * hd + d)] = o;
          }
        }
      }
    Params ob{p[3]};
    if (out_bias) ob.push_back(p[qkv_bias ? 7 : 4]);
    return linear_reference(dim, dim, out_bias)(ob, merged);
  };
}

inline RefForward mlp_reference(std::int64_t dim, std::int64_t hidden) {
  return [=](const Params& p, const std::vector<double>& x) {
    const auto h = gelu_reference()({}, linear_reference(dim, hidden, true)(slice(p, 0, 2), x));
    return linear_reference(hidden, dim, true)(slice(p, 2, 2), h);
  };
}

inline RefForward block_reference(std::int64_t dim, std::int64_t heads, SeqShape s) {
  return [=](const Params& p, const std::vector<double>& x) {
    const auto r =
        add(x, attention_reference(dim, heads, s)(slice(p, 2, 4), layer_norm_reference(dim, 1e-5)(slice(p, 0, 2), x)));
    return add(r, mlp_reference(dim, 4 * dim)(slice(p, 8, 4), layer_norm_reference(dim, 1e-5)(slice(p, 6, 2), r)));
  };
}

// nn::SandwichBlock over LayerNorms, causal attention and a GELU MLP:
// r = x + post_attn(attn(ln1(x))), y = r + post_mlp(mlp(ln2(r))).
inline RefForward sandwich_reference(std::int64_t dim, std::int64_t heads, SeqShape s) {
  return [=](const Params& p, const std::vector<double>& x) {
    const auto ln = [&](std::size_t first, const std::vector<double>& v) {
      return layer_norm_reference(dim, 1e-5)(slice(p, first, 2), v);
    };
    const auto r = add(x, ln(6, attention_reference(dim, heads, s)(slice(p, 2, 4), ln(0, x))));
    return add(r, ln(14, mlp_reference(dim, 4 * dim)(slice(p, 10, 4), ln(8, r))));
  };
}

inline RefForward positional_reference(std::int64_t dim, SeqShape s) {
  return [=](const Params& p, std::vector<double> x) {
    for (std::int64_t r = 0; r < s.rows(); ++r)
      for (std::int64_t c = 0; c < dim; ++c)
        x[static_cast<std::size_t>(r * dim + c)] += p[0][static_cast<std::size_t>((r % s.time) * dim + c)];
    return x;
  };
}

// Composite units round in T at every step: wider bounds for 16-bit types.
template <class T>
double composite(double factor) {
  return std::is_same_v<T, float> ? 1.0 : factor;
}

}  // namespace dtrain::testing
