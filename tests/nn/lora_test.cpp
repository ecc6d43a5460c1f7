// LoRA adapters on the units' projections (nn/lora.hpp), on the host in
// every dtype: each unit with adapters against the float64 reference of the
// same unit without them whose weights are W + scale * B A (the definition
// of the adapter), its gradients against central finite differences of that
// reference (A and B trained, the adapted projections frozen); with
// lora_dropout, against the reference with the masks the library documents.
#include "dtrain/nn/lora.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "nn/reference.hpp"
#include "nn/sequence_reference.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/random.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/transformer.hpp"

namespace t = dtrain::testing;
using dtrain::SeqShape;
using dtrain::nn::LoraOptions;
using t::Params;
using t::RefForward;

namespace {

// One adapted weight in a unit's parameter list: W [out, in] at `w`, A
// [segments r, in] at `a`, B [out, r] at `b`.
struct Site {
  std::size_t w, a, b;
  std::int64_t out, in, r, segments;
  double scale;
};

// The base reference over the unit's parameters `base` (in the order the
// reference takes them) with every site's W replaced by W + scale * B A,
// output block s of a segmented site using A's rows [s r, (s + 1) r).
RefForward merged(RefForward base, std::vector<std::size_t> order, std::vector<Site> sites) {
  return [=](const Params& p, const std::vector<double>& x) {
    Params q = p;
    for (const Site& s : sites) {
      const std::int64_t per = s.out / s.segments;
      for (std::int64_t o = 0; o < s.out; ++o)
        for (std::int64_t i = 0; i < s.in; ++i) {
          double d = 0.0;
          for (std::int64_t k = 0; k < s.r; ++k)
            d += p[s.b][static_cast<std::size_t>(o * s.r + k)] *
                 p[s.a][static_cast<std::size_t>(((o / per) * s.r + k) * s.in + i)];
          q[s.w][static_cast<std::size_t>(o * s.in + i)] += s.scale * d;
        }
    }
    Params ordered;
    for (std::size_t k : order) ordered.push_back(q[k]);
    return base(ordered, x);
  };
}

RefForward swiglu_mlp_reference(std::int64_t dim, std::int64_t hidden) {
  return [=](const Params& p, const std::vector<double>& x) {
    const auto h = t::swiglu_reference(hidden)({}, t::linear_reference(dim, 2 * hidden, false)(t::slice(p, 0, 1), x));
    return t::linear_reference(hidden, dim, false)(t::slice(p, 1, 1), h);
  };
}

// The names of a unit's trainable parameters, in order.
template <class U>
std::vector<std::string> trainable(const U& unit) {
  std::vector<std::string> out;
  for (const auto& s : unit.params())
    if (s.trainable) out.push_back(s.name);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora)

BOOST_AUTO_TEST_CASE_TEMPLATE(linear, T, t::dtypes) {
  const LoraOptions o{.r = 2, .alpha = 3.f};
  const dtrain::nn::Linear unit(6, 8, {.lora = o});
  BOOST_TEST(trainable(unit) == (std::vector<std::string>{"lora_A", "lora_B"}), boost::test_tools::per_element());
  t::check_unit<T>(unit, merged(t::linear_reference(6, 8, true), {0, 1}, {{0, 2, 3, 8, 6, 2, 1, 1.5}}), 5, 6, true,
                   {5, 1}, t::composite<T>(4));
}

// Two adapters side by side on one projection (a fused gate|up), rsLoRA's scale.
BOOST_AUTO_TEST_CASE_TEMPLATE(linear_segments, T, t::dtypes) {
  const LoraOptions o{.r = 2, .alpha = 4.f, .rslora = true};
  const dtrain::nn::Linear unit(6, 8, {.bias = false, .lora = o, .lora_segments = 2});
  t::check_unit<T>(unit, merged(t::linear_reference(6, 8, false), {0}, {{0, 1, 2, 8, 6, 2, 2, 4.0 / std::sqrt(2.0)}}),
                   5, 6, true, {5, 1}, t::composite<T>(4));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gelu_mlp, T, t::dtypes) {
  const dtrain::nn::GeluMLP unit(6, 10, {.fc1_lora = {.r = 2, .alpha = 2.f}, .fc2_lora = {.r = 3, .alpha = 6.f}});
  BOOST_TEST(trainable(unit) == (std::vector<std::string>{"fc1.lora_A", "fc1.lora_B", "fc2.lora_A", "fc2.lora_B"}),
             boost::test_tools::per_element());
  // unit: fc1.weight fc1.bias fc1.lora_A fc1.lora_B fc2.weight fc2.bias fc2.lora_A fc2.lora_B
  t::check_unit<T>(
      unit, merged(t::mlp_reference(6, 10), {0, 1, 4, 5}, {{0, 2, 3, 10, 6, 2, 1, 1.0}, {4, 6, 7, 6, 10, 3, 1, 2.0}}),
      7, 6, true, {7, 1}, t::composite<T>(6));
}

// Llama's MLP: fc1 is gate|up, adapted as two projections (PEFT's gate_proj, up_proj).
BOOST_AUTO_TEST_CASE_TEMPLATE(swiglu_mlp, T, t::dtypes) {
  const dtrain::nn::MLP<dtrain::nn::SwiGLU> unit(6, 5, {.bias = false, .fc1_lora = {.r = 2}, .fc2_lora = {.r = 2}});
  // unit: fc1.weight fc1.lora_A fc1.lora_B fc2.weight fc2.lora_A fc2.lora_B
  t::check_unit<T>(
      unit, merged(swiglu_mlp_reference(6, 5), {0, 3}, {{0, 1, 2, 10, 6, 2, 2, 4.0}, {3, 4, 5, 6, 5, 2, 1, 4.0}}), 7, 6,
      true, {7, 1}, t::composite<T>(8));
}

// GPT-2's attention: c_attn (q|k|v fused, one adapter, as PEFT) and c_proj.
BOOST_AUTO_TEST_CASE_TEMPLATE(causal_self_attention, T, t::dtypes) {
  const SeqShape s{2, 5};
  const dtrain::nn::CausalSelfAttention unit(8, 2, {.qkv_lora = {.r = 2, .alpha = 4.f}, .proj_lora = {.r = 3}});
  // unit: qkv.weight qkv.bias proj.weight proj.bias qkv.lora_A qkv.lora_B proj.lora_A proj.lora_B
  t::check_unit<T>(unit,
                   merged(t::attention_reference(8, 2, s), {0, 1, 2, 3},
                          {{0, 4, 5, 24, 8, 2, 1, 2.0}, {2, 6, 7, 8, 8, 3, 1, 8.0 / 3.0}}),
                   s.rows(), 8, true, s, t::composite<T>(8));
}

// Llama's attention with grouped keys and Qwen2's q/k/v biases: an adapter
// on each projection (a small scale: four adapted projections of random
// values would otherwise saturate the softmax, beyond what 16 bits resolve).
BOOST_AUTO_TEST_CASE_TEMPLATE(rotary_attention, T, t::dtypes) {
  const SeqShape s{2, 5};
  const LoraOptions o{.r = 2, .alpha = 0.5f};
  const dtrain::nn::RotaryAttention unit(
      16, 4, {.kv_heads = 2, .qkv_bias = true, .q_lora = o, .k_lora = o, .v_lora = o, .o_lora = o});
  // unit: q k v o weights, q k v biases, then lora_A, lora_B of q, k, v, o
  t::check_unit<T>(unit,
                   merged(t::rotary_attention_reference(16, 4, 2, 10000.f, true, false, s), {0, 1, 2, 3, 4, 5, 6},
                          {{0, 7, 8, 16, 16, 2, 1, 0.25},
                           {1, 9, 10, 8, 16, 2, 1, 0.25},
                           {2, 11, 12, 8, 16, 2, 1, 0.25},
                           {3, 13, 14, 16, 16, 2, 1, 0.25}}),
                   s.rows(), 16, true, s, t::composite<T>(16));
}

// Only some projections adapted: the others keep training as before.
BOOST_AUTO_TEST_CASE(partial_targets) {
  const dtrain::nn::RotaryAttention unit(8, 2, {.v_lora = {.r = 1}});
  BOOST_TEST(trainable(unit) == (std::vector<std::string>{"q.weight", "k.weight", "o.weight", "v.lora_A", "v.lora_B"}),
             boost::test_tools::per_element());
  const SeqShape s{1, 4};
  t::check_unit<float>(unit,
                       merged(t::rotary_attention_reference(8, 2, 2, 10000.f, false, false, s), {0, 1, 2, 3},
                              {{2, 4, 5, 8, 8, 1, 1, 8.0}}),
                       s.rows(), 8, true, s);
}

// PEFT's initialisation: A Kaiming-uniform with a = sqrt(5), U(-1/sqrt(in),
// 1/sqrt(in)); B zeros, so an adapted model starts as its base.
BOOST_AUTO_TEST_CASE(initialisation) {
  const auto specs = dtrain::nn::Linear(9, 4, {.lora = {.r = 3}}).params();
  BOOST_REQUIRE_EQUAL(specs.size(), 4u);
  BOOST_TEST((specs[2].shape == std::vector<std::int64_t>{3, 9}));
  BOOST_TEST((specs[3].shape == std::vector<std::int64_t>{4, 3}));
  BOOST_TEST((specs[2].init.kind == dtrain::init_kind::uniform));
  BOOST_TEST(specs[2].init.b == 1.0 / 3.0, boost::test_tools::tolerance(1e-6));
  BOOST_TEST((specs[3].init.kind == dtrain::init_kind::zeros));
  BOOST_TEST((specs[2].tags == std::vector<std::string>{"lora"}));
}

// lora_dropout: in a training call each adapter (each segment) sees its own
// dropout of x, the mask being the documented pure function of the unit's
// stream; the frozen projection sees x. Reference: W x + b + scale * B A
// (m_s * x / (1 - p)) per output block s, with the masks the library draws.
RefForward dropout_linear_reference(std::int64_t in, std::int64_t out, std::int64_t r, std::int64_t segments,
                                    double scale, float p, std::uint64_t stream) {
  return [=](const Params& q, const std::vector<double>& x) {
    const auto rows = static_cast<std::int64_t>(x.size()) / in;
    std::vector<double> y = t::linear_reference(in, out, true)(t::slice(q, 0, 2), x);
    const std::int64_t per = out / segments;
    for (std::int64_t s = 0; s < segments; ++s) {
      const std::uint64_t key = dtrain::nn::detail::lora_stream_key + (static_cast<std::uint64_t>(s) << 16);
      const std::uint64_t st = dtrain::detail::derive_stream(stream, key);
      std::vector<double> xd(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) xd[i] = dtrain::detail::uniform01(st, i) >= p ? x[i] / (1.0 - p) : 0.0;
      for (std::int64_t row = 0; row < rows; ++row)
        for (std::int64_t k = 0; k < r; ++k) {
          double tk = 0.0;  // (xd A_s^T)[row, k]
          for (std::int64_t i = 0; i < in; ++i)
            tk += xd[static_cast<std::size_t>(row * in + i)] * q[2][static_cast<std::size_t>((s * r + k) * in + i)];
          for (std::int64_t o = s * per; o < (s + 1) * per; ++o)
            y[static_cast<std::size_t>(row * out + o)] += scale * q[3][static_cast<std::size_t>(o * r + k)] * tk;
        }
    }
    return y;
  };
}

BOOST_AUTO_TEST_CASE_TEMPLATE(linear_dropout, T, t::dtypes) {
  // the harness's training call uses stream 99
  const dtrain::nn::Linear one(12, 8, {.lora = {.r = 2, .alpha = 3.f, .dropout = 0.3f}});
  t::check_unit<T>(one, dropout_linear_reference(12, 8, 2, 1, 1.5, 0.3f, 99), 5, 12, true, {5, 1}, t::composite<T>(4));
  const dtrain::nn::Linear two(12, 8, {.lora = {.r = 2, .alpha = 2.f, .dropout = 0.25f}, .lora_segments = 2});
  t::check_unit<T>(two, dropout_linear_reference(12, 8, 2, 2, 1.0, 0.25f, 99), 5, 12, true, {5, 1}, t::composite<T>(4));
}

// The units whose adapters share an input or a saved view (attention's
// projections, the gated MLP's halves) with dropout: the training forward
// is a fixed function of x and the parameters (the masks depend on the
// stream only), so backward must give its derivatives. Checked in fp32
// against central differences of the unit's own forward (h = 1e-2, at 8
// random elements of x and of each adapter matrix; tolerance 2% of the
// largest gradient, far above the differences' own error and far below what
// a mask missing from one gradient changes).
template <class U>
void check_own_differences(U unit, std::int64_t rows, std::int64_t in, SeqShape shape, const std::string& what) {
  dtrain::Host dev(1);
  const t::UnitCase c = t::rounded<float>(t::make_case(unit, rows, in, 42));
  const t::UnitResult r = t::run_unit<float>(dev, unit, c, true, shape);
  const auto objective = [&](const t::UnitCase& k) {
    const auto y = t::run_unit<float>(dev, unit, k, false, shape).y;
    double sum = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) sum += k.dy[i] * y[i];
    return sum;
  };
  std::mt19937 gen(5);
  const auto check = [&](const std::vector<double>& grad, auto&& perturb, const std::string& name) {
    double largest = 0.0;
    for (double g : grad) largest = std::max(largest, std::abs(g));
    std::uniform_int_distribution<std::size_t> pick(0, grad.size() - 1);
    for (int n = 0; n < 8; ++n) {
      const std::size_t i = pick(gen);
      const double h = 1e-2;
      const double fd = (objective(perturb(i, h)) - objective(perturb(i, -h))) / (2 * h);
      BOOST_TEST(std::abs(fd - grad[i]) <= 0.02 * largest,
                 what << " " << name << "[" << i << "]: backward " << grad[i] << ", differences " << fd);
    }
  };
  check(
      r.dx,
      [&](std::size_t i, double h) {
        t::UnitCase k = c;
        k.x[i] += h;
        return k;
      },
      "input gradient");
  for (std::size_t p = 0; p < c.specs.size(); ++p) {
    if (!c.specs[p].trainable) continue;
    check(
        r.grads[p],
        [&](std::size_t i, double h) {
          t::UnitCase k = c;
          k.params[p][i] += h;
          return k;
        },
        c.specs[p].name + " gradient");
  }
}

BOOST_AUTO_TEST_CASE(dropout_in_composite_units) {
  const LoraOptions d{.r = 2, .alpha = 4.f, .dropout = 0.25f};
  const SeqShape s{2, 5};
  check_own_differences(dtrain::nn::CausalSelfAttention(8, 2, {.qkv_lora = d, .proj_lora = d}), s.rows(), 8, s,
                        "CausalSelfAttention");
  check_own_differences(dtrain::nn::RotaryAttention(8, 2, {.kv_heads = 1, .q_lora = d, .v_lora = d, .o_lora = d}),
                        s.rows(), 8, s, "RotaryAttention");
  check_own_differences(dtrain::nn::MLP<dtrain::nn::SwiGLU>(8, 12, {.bias = false, .fc1_lora = d, .fc2_lora = d}),
                        s.rows(), 8, s, "SwiGLU MLP");
}

// Out of training (evaluate(), predict()) the adapter sees x: the same outputs
// as without dropout; in training some inputs are dropped.
BOOST_AUTO_TEST_CASE(dropout_only_in_training) {
  dtrain::Host dev(1);
  dtrain::nn::Linear with(8, 4, {.lora = {.r = 2, .dropout = 0.5f}});
  dtrain::nn::Linear without(8, 4, {.lora = {.r = 2}});
  std::vector<float> w(32, 0.25f), b(4, 0.5f), a(16), bb(8), x(24), y0(12), y1(12), y2(12);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
  for (std::size_t i = 0; i < bb.size(); ++i) bb[i] = 0.3f - 0.05f * static_cast<float>(i);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.f + 0.1f * static_cast<float>(i);
  const dtrain::MatView<const float> p[] = {{w.data(), 4, 8}, {b.data(), 4, 1}, {a.data(), 2, 8}, {bb.data(), 4, 2}};
  std::vector<float> saved_with(static_cast<std::size_t>(with.saved_size({3, 1}, 8))),
      saved_without(static_cast<std::size_t>(without.saved_size({3, 1}, 8)));
  BOOST_TEST(saved_with.size() == 3u * (2u + 8u));  // t, then the dropped input
  BOOST_TEST(saved_without.size() == 3u * 2u);
  const dtrain::MatView<const float> xv{x.data(), 3, 8};
  const auto run = [&](auto& unit, std::vector<float>& saved, std::vector<float>& y, bool training) {
    const dtrain::UnitContext<float> ctx{
        {3, 1}, {saved.data(), 1, static_cast<std::int64_t>(saved.size())}, training, 7, nullptr};
    unit.template forward<dtrain::Host, float>(dev, p, xv, {y.data(), 3, 4}, ctx);
  };
  run(with, saved_with, y0, false);
  run(without, saved_without, y1, false);
  BOOST_TEST(y0 == y1, boost::test_tools::per_element());
  run(with, saved_with, y2, true);
  BOOST_TEST(y2 != y1);
}

BOOST_AUTO_TEST_CASE(bad_options) {
  using dtrain::config_error;
  // a rank larger than the layer
  BOOST_CHECK_THROW(dtrain::nn::Linear(4, 8, {.lora = {.r = 5}}), config_error);
  BOOST_CHECK_THROW(dtrain::nn::Linear(8, 6, {.lora = {.r = 4}, .lora_segments = 2}), config_error);
  BOOST_CHECK_THROW(dtrain::nn::Linear(8, 8, {.lora = {.r = -1}}), config_error);
  BOOST_CHECK_THROW(dtrain::nn::Linear(8, 8, {.lora = {.r = 2, .alpha = 0.f}}), config_error);
  // dropout outside [0, 1)
  BOOST_CHECK_THROW(dtrain::nn::Linear(8, 8, {.lora = {.r = 2, .dropout = 1.f}}), config_error);
  BOOST_CHECK_THROW(dtrain::nn::Linear(8, 8, {.lora = {.r = 2, .dropout = -0.1f}}), config_error);
  BOOST_CHECK_THROW(dtrain::nn::RotaryAttention(8, 2, {.kv_heads = 1, .k_lora = {.r = 5}}), config_error);
  // an adapter needs the saved view: the context-free call refuses
  dtrain::nn::Linear unit(4, 4, {.lora = {.r = 1}});
  dtrain::Host dev(1);
  std::vector<float> v(64, 1.f);
  const dtrain::MatView<const float> p[] = {{v.data(), 4, 4}, {v.data(), 4, 1}, {v.data(), 1, 4}, {v.data(), 4, 1}};
  const dtrain::MatView<const float> x{v.data(), 2, 4};
  const dtrain::MatView<float> y{v.data() + 32, 2, 4};
  BOOST_CHECK_THROW((unit.forward<dtrain::Host, float>(dev, p, x, y)), config_error);
}

BOOST_AUTO_TEST_SUITE_END()
