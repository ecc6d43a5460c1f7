#pragma once
// The attention family (nn/attention_policies.hpp) in float64, loop by loop,
// independently of the library: separate q/k/v projections (k and v from a
// memory for cross-attention), QK-norm, rotary positions, grouped-query heads,
// a causal or bidirectional mask refined by a key padding mask and packed
// records' position ids, the output projection. And the case a test runs a
// unit on: its inputs (a memory for cross-attention, the batch's masks), a
// runner for any device that brings every result back in float64, and the
// check against the reference and its central finite differences. Shared by
// the host tests (attention_family_test.cpp) and the GPU tests.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include "nn/sequence_reference.hpp"
#include "nn/unit_harness.hpp"

#include "dtrain/core/tensor.hpp"
#include "dtrain/nn/rotary_attention.hpp"

namespace dtrain::testing {

struct FamilySpec {
  std::int64_t dim = 16, heads = 4, kv_heads = 4, memory_dim = 16;
  bool causal = false, cross = false, qk_norm = false, qkv_bias = false, out_bias = false;
  double theta = 0.0;  // > 0: rotary positions
  double eps = 1e-6;   // QK-norm's
  // Gemma 3's forms: a sliding window (> 0: keys window or more positions
  // back are left out), the scores' scale (0: 1 / sqrt(head_dim)), QK-norm
  // scaling by offset + weight, and linear rope scaling by rope_factor.
  std::int64_t window = 0;
  double scale = 0.0, norm_offset = 0.0, rope_factor = 1.0;
};

// One call's inputs besides the unit's parameters, x and dy.
struct FamilyInputs {
  SeqShape shape{};                       // the queries'
  std::int64_t k_time = 0;                // the keys' length (cross: the memory's)
  std::vector<double> memory{};           // cross: [B * k_time, memory_dim]
  std::vector<std::int32_t> key_mask{};   // [B, k_time], 1 token / 0 padding, or empty
  std::vector<std::int64_t> positions{};  // packed records' [B, T], or empty
};

// y = attention(params, x, memory) in float64 (self-attention: memory = x).
inline std::vector<double> family_reference(const FamilySpec& f, const FamilyInputs& in, const Params& p,
                                            const std::vector<double>& x, const std::vector<double>& m) {
  const std::int64_t C = f.dim, hd = C / f.heads, kv = f.kv_heads * hd, half = hd / 2, B = in.shape.batch;
  const std::int64_t Tq = in.shape.time, Tk = in.k_time, M = f.cross ? f.memory_dim : C;
  const std::size_t norms = 4 + (f.qkv_bias ? 3 : 0) + (f.out_bias ? 1 : 0);
  const auto proj = [&](std::size_t w, const std::vector<double>& from, std::int64_t width, std::int64_t out, int b) {
    Params wb{p[w]};
    if (b >= 0) wb.push_back(p[static_cast<std::size_t>(b)]);
    return linear_reference(width, out, b >= 0)(wb, from);
  };
  auto q = proj(0, x, C, C, f.qkv_bias ? 4 : -1);
  auto k = proj(1, m, M, kv, f.qkv_bias ? 5 : -1);
  const auto v = proj(2, m, M, kv, f.qkv_bias ? 6 : -1);
  const auto pos = [&](std::int64_t b, std::int64_t t) {
    return in.positions.empty() ? t : in.positions[static_cast<std::size_t>(b * Tq + t)];
  };
  // QK-norm then rotation, head by head of `width` / hd heads per row
  const auto heads_of = [&](std::vector<double>& rows, std::int64_t width, std::int64_t time,
                            const Params::value_type* w) {
    for (std::int64_t r = 0; r < static_cast<std::int64_t>(rows.size()) / width; ++r)
      for (std::int64_t h = 0; h < width / hd; ++h) {
        double* e = &rows[static_cast<std::size_t>(r * width + h * hd)];
        if (w != nullptr) {
          double sq = 0.0;
          for (std::int64_t d = 0; d < hd; ++d) sq += e[d] * e[d];
          const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(hd) + f.eps);
          for (std::int64_t d = 0; d < hd; ++d) e[d] *= rstd * (f.norm_offset + (*w)[static_cast<std::size_t>(d)]);
        }
        if (f.theta > 0.0)
          for (std::int64_t i = 0; i < half; ++i) {
            const double angle =
                static_cast<double>(pos(r / time, r % time)) / std::pow(f.theta, 2.0 * i / hd) / f.rope_factor;
            const double a = e[i], b = e[i + half];
            e[i] = a * std::cos(angle) - b * std::sin(angle);
            e[i + half] = b * std::cos(angle) + a * std::sin(angle);
          }
      }
  };
  heads_of(q, C, Tq, f.qk_norm ? &p[norms] : nullptr);
  heads_of(k, kv, Tk, f.qk_norm ? &p[norms + 1] : nullptr);
  const auto kept = [&](std::int64_t b, std::int64_t t, std::int64_t j) {
    if (f.causal && j > t) return false;
    if (f.window > 0 && t - j >= f.window) return false;
    if (!in.key_mask.empty() && in.key_mask[static_cast<std::size_t>(b * Tk + j)] == 0) return false;
    return in.positions.empty() || j - pos(b, j) == t - pos(b, t);
  };
  std::vector<double> merged(static_cast<std::size_t>(B * Tq * C), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < f.heads; ++h) {
      const std::int64_t g = h / (f.heads / f.kv_heads);
      for (std::int64_t t = 0; t < Tq; ++t) {
        std::vector<double> w(static_cast<std::size_t>(Tk), 0.0);
        double mx = -1e300;
        for (std::int64_t j = 0; j < Tk; ++j) {
          if (!kept(b, t, j)) continue;
          double dot = 0.0;
          for (std::int64_t d = 0; d < hd; ++d)
            dot += q[static_cast<std::size_t>((b * Tq + t) * C + h * hd + d)] *
                   k[static_cast<std::size_t>((b * Tk + j) * kv + g * hd + d)];
          w[static_cast<std::size_t>(j)] = dot * (f.scale > 0.0 ? f.scale : 1.0 / std::sqrt(static_cast<double>(hd)));
          mx = std::max(mx, w[static_cast<std::size_t>(j)]);
        }
        double sum = 0.0;
        for (std::int64_t j = 0; j < Tk; ++j)
          sum += kept(b, t, j) ? (w[static_cast<std::size_t>(j)] = std::exp(w[static_cast<std::size_t>(j)] - mx))
                               : (w[static_cast<std::size_t>(j)] = 0.0);
        for (std::int64_t d = 0; d < hd && sum > 0.0; ++d) {
          double o = 0.0;
          for (std::int64_t j = 0; j < Tk; ++j)
            o += w[static_cast<std::size_t>(j)] / sum * v[static_cast<std::size_t>((b * Tk + j) * kv + g * hd + d)];
          merged[static_cast<std::size_t>((b * Tq + t) * C + h * hd + d)] = o;
        }
      }
    }
  Params ob{p[3]};
  if (f.out_bias) ob.push_back(p[f.qkv_bias ? 7 : 4]);
  return linear_reference(C, C, f.out_bias)(ob, merged);
}

// Left padding of `pad` keys in the first sequence and a hole of two in the
// last (never a sequence without keys).
inline std::vector<std::int32_t> padding_mask(std::int64_t batch, std::int64_t time, std::int64_t pad) {
  std::vector<std::int32_t> mask(static_cast<std::size_t>(batch * time), 1);
  for (std::int64_t j = 0; j < pad; ++j) mask[static_cast<std::size_t>(j)] = 0;
  for (std::int64_t j = time / 2; j < time / 2 + 2; ++j) mask[static_cast<std::size_t>((batch - 1) * time + j)] = 0;
  return mask;
}

struct FamilyResult {
  UnitResult unit;
  std::vector<double> d_memory;  // cross-attention's
};

// The batch's masks on `dev` (kept alive in `ints`, `longs`).
template <class Dev>
DeviceBatch family_batch(Dev& dev, const FamilySpec& f, const FamilyInputs& in,
                         typename Dev::template buffer<std::int32_t>& ints,
                         typename Dev::template buffer<std::int64_t>& longs) {
  DeviceBatch batch;
  if (!in.key_mask.empty()) {
    ints = make_buffer<std::int32_t>(dev, in.key_mask.size());
    dev.copy_from_host(ints.data(), in.key_mask.data(), in.key_mask.size());
    batch.set(f.cross ? "encoder_attention_mask" : "attention_mask",
              DeviceTensor{element_type::i32,
                           {in.shape.batch, in.k_time},
                           reinterpret_cast<const std::byte*>(ints.data()),
                           reinterpret_cast<const std::byte*>(in.key_mask.data()),
                           {}});
  }
  if (!in.positions.empty()) {
    longs = make_buffer<std::int64_t>(dev, in.positions.size());
    dev.copy_from_host(longs.data(), in.positions.data(), in.positions.size());
    batch.set("position_ids", DeviceTensor{element_type::i64,
                                           {in.shape.batch, in.shape.time},
                                           reinterpret_cast<const std::byte*>(longs.data()),
                                           reinterpret_cast<const std::byte*>(in.positions.data()),
                                           {}});
  }
  return batch;
}

// Runs `unit` (self-attention through run_unit, cross-attention through its
// two-input calls) in dtype T on `dev`.
template <class T, class Dev, class U>
FamilyResult run_family(Dev& dev, U& unit, const FamilySpec& f, const FamilyInputs& in, const UnitCase& c) {
  typename Dev::template buffer<std::int32_t> ints;
  typename Dev::template buffer<std::int64_t> longs;
  const DeviceBatch batch = family_batch(dev, f, in, ints, longs);
  if constexpr (detail::context_unit<U, Dev, T>) {
    return {run_unit<T>(dev, unit, c, true, in.shape, &batch), {}};
  } else {
    using buffer = typename Dev::template buffer<T>;
    const DeviceParams<T, Dev> d(dev, c, true);
    const auto& pv = d.values;
    const auto& gv = d.grad_views;
    const std::int64_t mem_rows = in.shape.batch * in.k_time;
    const buffer x = upload<T>(dev, c.x), dy = upload<T>(dev, c.dy), mem = upload<T>(dev, in.memory);
    buffer y = make_buffer<T>(dev, static_cast<std::size_t>(c.rows * f.dim));
    buffer dx = make_buffer<T>(dev, static_cast<std::size_t>(c.rows * f.dim));
    buffer dm = make_buffer<T>(dev, in.memory.size());
    buffer saved = make_buffer<T>(dev, static_cast<std::size_t>(unit.saved_size(in.shape, in.k_time)));
    const UnitContext<T> ctx{in.shape, saved.view(1, static_cast<std::int64_t>(saved.size())), true, 99, &batch};
    const MatView<const T> xv = x.view(c.rows, f.dim), mv = mem.view(mem_rows, f.memory_dim);
    unit.template forward<Dev, T>(dev, pv, xv, mv, y.view(c.rows, f.dim), ctx);
    unit.template backward<Dev, T>(dev, pv, gv, xv, mv, dy.view(c.rows, f.dim), dx.view(c.rows, f.dim),
                                   dm.view(mem_rows, f.memory_dim), ctx);
    FamilyResult r{{download<T>(dev, y), download<T>(dev, dx), {}}, download<T>(dev, dm)};
    for (const auto& g : d.grads) r.unit.grads.push_back(download<T>(dev, g));
    return r;
  }
}

// A random case for `unit`, rounded to T: parameters, x, dy and the memory.
template <class T, class U>
UnitCase family_case(const U& unit, const FamilySpec& f, FamilyInputs& in) {
  UnitCase c = rounded<T>(make_case(unit, in.shape.rows(), f.dim, 42));
  if (f.cross) {
    std::mt19937_64 rng(7);
    in.memory = round_to<T>(random_nonzero(static_cast<std::size_t>(in.shape.batch * in.k_time * f.memory_dim), rng));
  }
  return c;
}

// Checks `unit` on `dev` in dtype T: forward against family_reference,
// every gradient (the memory's too) against its central finite differences.
// `scale` widens the tolerances as check_unit's does.
template <class T, class Dev, class U>
void check_family_on(Dev& dev, U unit, const FamilySpec& f, FamilyInputs in, double scale) {
  const UnitCase c = family_case<T>(unit, f, in);
  const FamilyResult r = run_family<T>(dev, unit, f, in, c);
  const auto memory_of = [&](const std::vector<double>& x) { return f.cross ? in.memory : x; };
  const auto y_of = [&](const Params& p, const std::vector<double>& x, const std::vector<double>& m) {
    return family_reference(f, in, p, x, m);
  };
  const auto dot_dy = [&](const std::vector<double>& y) {
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += c.dy[i] * y[i];
    return s;
  };
  expect_close(r.unit.y, y_of(c.params, c.x, memory_of(c.x)), scale * forward_tol<T>, "forward");
  const auto dx =
      finite_difference([&](const std::vector<double>& x) { return dot_dy(y_of(c.params, x, memory_of(x))); }, c.x);
  expect_close(r.unit.dx, dx, scale * backward_tol<T>, "input gradient");
  if (f.cross) {
    const auto dm =
        finite_difference([&](const std::vector<double>& m) { return dot_dy(y_of(c.params, c.x, m)); }, in.memory);
    expect_close(r.d_memory, dm, scale * backward_tol<T>, "memory gradient");
  }
  for (std::size_t i = 0; i < c.specs.size(); ++i) {
    const auto g = finite_difference(
        [&](const std::vector<double>& v) {
          Params p = c.params;
          p[i] = v;
          return dot_dy(y_of(p, c.x, memory_of(c.x)));
        },
        c.params[i]);
    expect_close(r.unit.grads[i], g, scale * backward_tol<T>, c.specs[i].name + " gradient");
  }
}

// The unit's options for a spec.
inline nn::GroupedAttentionOptions family_options(const FamilySpec& f) {
  return {.kv_heads = f.kv_heads,
          .rope_theta = static_cast<float>(f.theta),
          .qkv_bias = f.qkv_bias,
          .out_bias = f.out_bias,
          .qk_norm = f.qk_norm,
          .qk_norm_eps = static_cast<float>(f.eps),
          .qk_norm_offset = static_cast<float>(f.norm_offset),
          .memory_dim = f.memory_dim,
          .window = f.window,
          .scale = static_cast<float>(f.scale),
          .rope_factor = static_cast<float>(f.rope_factor)};
}

// The tolerances' widening in dtype T: check_unit's 16x for the attention
// units in bf16 and fp16 (composite), 24x with QK-norm (two more roundings
// in T per head before the scores); 1 in fp32.
template <class T>
double family_scale(const FamilySpec& f) {
  return composite<T>(f.qk_norm ? 24 : 16);
}

// The cases the host and GPU tests check, by group; check(name, unit, spec,
// inputs) is called for each.
enum class FamilyGroup { bidirectional, qk_norm, packed, cross, sliding_window };

template <class Check>
void family_cases(FamilyGroup group, Check&& check) {
  using nn::Attention;
  if (group == FamilyGroup::bidirectional)  // multi-head and grouped, with and without the batch's padding
    for (const std::int64_t kv : {4, 2})
      for (const bool padded : {false, true}) {
        const FamilySpec f{.kv_heads = kv, .out_bias = true};
        FamilyInputs in{.shape = {2, 7}, .k_time = 7};
        if (padded) in.key_mask = padding_mask(2, 7, 2);
        check(std::string("bidirectional, kv_heads ") + std::to_string(kv) + (padded ? ", padded" : ""),
              Attention<nn::Bidirectional>(16, 4, family_options(f)), f, in);
      }
  if (group == FamilyGroup::qk_norm) {
    // with q/k/v biases, which QK-norm makes matter to the keys; grouped heads
    FamilySpec f{.kv_heads = 2, .qk_norm = true, .qkv_bias = true, .out_bias = true};
    check("QK-norm, bidirectional, padded", Attention<nn::Bidirectional>(16, 4, family_options(f)), f,
          FamilyInputs{.shape = {2, 7}, .k_time = 7, .key_mask = padding_mask(2, 7, 2)});
    f.causal = true;
    f.theta = 10000.0;
    check("QK-norm, causal, rotary (Qwen3)", Attention<nn::Rotary>(16, 4, family_options(f)), f,
          FamilyInputs{.shape = {2, 7}, .k_time = 7});
  }
  if (group == FamilyGroup::sliding_window) {
    // a window of 3 keys over 7 positions (Gemma 3's local layers), alone,
    // padded, packed, and with Gemma 3's QK-norm (1 + weight), scale and
    // linearly scaled rotation
    FamilySpec f{.kv_heads = 2, .causal = true, .out_bias = true, .theta = 500.0, .window = 3};
    check("sliding window 3", Attention<nn::Rotary>(16, 4, family_options(f)), f,
          FamilyInputs{.shape = {2, 7}, .k_time = 7});
    check("sliding window 3, padded", Attention<nn::Rotary>(16, 4, family_options(f)), f,
          FamilyInputs{.shape = {2, 7}, .k_time = 7, .key_mask = padding_mask(2, 7, 2)});
    check("sliding window 3, packed", Attention<nn::Rotary>(16, 4, family_options(f)), f,
          FamilyInputs{.shape = {2, 7}, .k_time = 7, .positions = {0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6}});
    f.qk_norm = true;
    f.norm_offset = 1.0;
    f.scale = 0.3;
    f.rope_factor = 2.0;
    check("sliding window 3, Gemma 3's QK-norm, scale and rope scaling",
          Attention<nn::Rotary>(16, 4, family_options(f)), f, FamilyInputs{.shape = {2, 7}, .k_time = 7});
  }
  if (group == FamilyGroup::packed) {
    // two records (4 + 3 tokens) in the first sequence, one in the second:
    // each stays within its record, rotated by the record's positions
    const FamilySpec f{.kv_heads = 2, .out_bias = true, .theta = 500.0};
    check("packed, bidirectional, rotary", Attention<nn::Bidirectional, nn::Rotary>(16, 4, family_options(f)), f,
          FamilyInputs{.shape = {2, 7}, .k_time = 7, .positions = {0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6}});
  }
  if (group == FamilyGroup::cross)  // 5 queries over a padded memory of 9, 12 wide
    for (const std::int64_t kv : {4, 2, 1})
      for (const bool qk_norm : {false, true}) {
        const FamilySpec f{
            .kv_heads = kv, .memory_dim = 12, .cross = true, .qk_norm = qk_norm, .qkv_bias = qk_norm, .out_bias = true};
        check(std::string("cross, kv_heads ") + std::to_string(kv) + (qk_norm ? ", QK-norm" : ""),
              Attention<nn::CrossInput, nn::Bidirectional>(16, 4, family_options(f)), f,
              FamilyInputs{.shape = {2, 5}, .k_time = 9, .key_mask = padding_mask(2, 9, 3)});
      }
}

}  // namespace dtrain::testing
