// The nn units and the loss on dtrain::Cuda against dtrain::Host, same random
// inputs, every dtype; plus the GPU's out-of-range label behaviour. Needs a
// GPU; exits 77 without one.
#include "support/gpu_main.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dtrain/device/cuda.hpp"
#include "dtrain/device/host.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/rms_norm.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/transformer.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/dropout.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "kernels/numeric.hpp"
#include "model/custom_model.hpp"
#include "nn/reference.hpp"
#include "nn/sequence_reference.hpp"
#include "nn/unit_harness.hpp"

namespace {

namespace t = dtrain::testing;

// Same math on both sides; fp32 differs by summation order and by the GPU's
// fused multiply-adds and math functions, a half dtype by up to one rounding
// per operation. `composite` counts the roundings of a unit made of several,
// as sequence_test.cpp's bounds against float64 do (each device within that
// of the reference, hence within twice of each other: the 2 below).
template <class T>
constexpr double cross_device_tol(double composite = 1) {
  return std::is_same_v<T, float> ? 1e-5 : composite * (2 * t::roundoff<T>() + 1e-4);
}

// `param_scale` multiplies the random parameters (magnitudes 0.1 to 1): the
// sequence units get 1/sqrt(width), the scale of their initialisation, so
// attention scores are O(1) as in training. Unscaled, the scores reach the
// hundreds, where one bf16 ulp is 1 or 2 and changes exp() by e or more: the
// softmax turns a rounding into a different answer on either device (seen on
// an H200: forward errors of 6% of the output in bf16).
template <class T, class U>
void compare_unit(U unit, std::int64_t rows, std::int64_t in, const std::string& name, dtrain::SeqShape shape = {},
                  double composite = 1, double param_scale = 1) {
  BOOST_TEST_CONTEXT(name << " " << dtrain::dtype_traits<T>::name) {
    dtrain::Host host(1);
    dtrain::Cuda cuda(0);
    t::UnitCase c = t::make_case(unit, rows, in, 31);
    for (auto& p : c.params)
      for (auto& v : p) v *= param_scale;
    const t::UnitResult h = t::run_unit<T>(host, unit, c, true, shape);
    const t::UnitResult g = t::run_unit<T>(cuda, unit, c, true, shape);
    const double tol = cross_device_tol<T>(composite);
    t::expect_close(g.y, h.y, tol, "forward");
    t::expect_close(g.dx, h.dx, tol, "input gradient");
    for (std::size_t i = 0; i < c.specs.size(); ++i)
      t::expect_close(g.grads[i], h.grads[i], tol, c.specs[i].name + " gradient");
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_units)

// Enough rows and columns that the GEMMs take cuBLAS's tiled paths and
// for_each more than one block.
BOOST_AUTO_TEST_CASE_TEMPLATE(units_match_host, T, t::dtypes) {
  compare_unit<T>(dtrain::nn::Linear(70, 33), 300, 70, "Linear");
  compare_unit<T>(dtrain::nn::Linear(70, 33, {.bias = false}), 300, 70, "Linear without bias");
  compare_unit<T>(dtrain::nn::ReLU{}, 300, 70, "ReLU");
  compare_unit<T>(dtrain::nn::GELU{}, 300, 70, "GELU");
  compare_unit<T>(dtrain::nn::LayerNorm(70), 300, 70, "LayerNorm");
  compare_unit<T>(dtrain::nn::LayerNorm(70, {.trainable = false}), 300, 70, "frozen LayerNorm");
  compare_unit<T>(dtrain::nn::GELUTanh{}, 300, 70, "GELUTanh");
  compare_unit<T>(dtrain::nn::SiLU{}, 300, 70, "SiLU");
  compare_unit<T>(dtrain::nn::SwiGLU{}, 300, 70, "SwiGLU");
  compare_unit<T>(dtrain::nn::RMSNorm(70), 300, 70, "RMSNorm");
  compare_unit<T>(dtrain::nn::Dropout(0.3f), 300, 70, "Dropout (training: the same mask)");
  compare_unit<T>(FeatureGain{70}, 300, 70, "FeatureGain");
}

// The sequence units: batched attention GEMMs, the causal softmax kernel and
// the block's residual adds, with sequences long enough for several blocks.
BOOST_AUTO_TEST_CASE_TEMPLATE(sequence_units_match_host, T, t::dtypes) {
  const dtrain::SeqShape s{3, 37};
  const double init = 1.0 / 8;  // 1/sqrt(64)
  // The composite factors of sequence_test.cpp: attention 8, MLP 4, block 16.
  compare_unit<T>(dtrain::nn::CausalSelfAttention(64, 4), s.rows(), 64, "CausalSelfAttention", s, 8, init);
  compare_unit<T>(dtrain::nn::GeluMLP(64, 96), s.rows(), 64, "GeluMLP", s, 4, init);
  compare_unit<T>(dtrain::nn::RotaryAttention(64, 4, {.kv_heads = 2, .qkv_bias = true}), s.rows(), 64,
                  "RotaryAttention", s, 8, init);
  compare_unit<T>(dtrain::nn::TransformerBlock(64, 4), s.rows(), 64, "TransformerBlock", s, 16, init);
  compare_unit<T>(dtrain::nn::PositionalEmbedding(40, 64), s.rows(), 64, "PositionalEmbedding", s, 1, init);
}

// Embedding on the GPU: ids read from device memory, the gradient summed per
// id in row order (no atomics), so both devices agree exactly.
BOOST_AUTO_TEST_CASE(embedding_matches_host) {
  const std::int64_t vocab = 50, dim = 48, rows = 400;
  std::mt19937_64 rng(5);
  const auto w = t::random_nonzero(static_cast<std::size_t>(vocab * dim), rng);
  const auto dy = t::random_nonzero(static_cast<std::size_t>(rows * dim), rng);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(vocab - 1));
  for (auto& v : ids) v = id(rng);
  auto run = [&]<class Dev>(Dev& dev) {
    dtrain::nn::Embedding emb(vocab, dim);
    auto idb = dtrain::make_buffer<std::int32_t>(dev, ids.size());
    dev.copy_from_host(idb.data(), ids.data(), ids.size());
    const auto wb = t::upload<float>(dev, w), dyb = t::upload<float>(dev, dy);
    auto yb = dtrain::make_buffer<float>(dev, rows * dim), gb = dtrain::make_buffer<float>(dev, vocab * dim);
    dtrain::DeviceBatch batch;
    batch.set("x", dtrain::DeviceTensor{dtrain::element_type::i32, {4, rows / 4},
                                        reinterpret_cast<const std::byte*>(idb.data()),
                                        reinterpret_cast<const std::byte*>(ids.data()), {}});
    const std::vector<dtrain::MatView<const float>> pv{{wb.data(), vocab, dim}};
    const std::vector<dtrain::MatView<float>> gv{{gb.data(), vocab, dim}};
    const dtrain::UnitContext<float> ctx{{4, rows / 4}, {}};
    emb.template forward<Dev, float>(dev, pv, batch, yb.view(rows, dim), ctx);
    emb.template backward<Dev, float>(dev, pv, gv, batch, std::as_const(yb).view(rows, dim),
                                      std::as_const(dyb).view(rows, dim), ctx);
    return std::pair{t::download<float>(dev, yb), t::download<float>(dev, gb)};
  };
  dtrain::Host host(1);
  dtrain::Cuda cuda(0);
  const auto [hy, hg] = run(host);
  const auto [gy, gg] = run(cuda);
  t::expect_close(gy, hy, 0.0, "embedding forward");
  t::expect_close(gg, hg, 0.0, "embedding gradient");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(cross_entropy_matches_host, T, t::dtypes) {
  const std::int64_t rows = 257, classes = 50;
  std::mt19937_64 rng(32);
  const std::vector<double> z = t::random_nonzero(static_cast<std::size_t>(rows * classes), rng, 4.0);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  std::uniform_int_distribution<std::int32_t> label(0, classes - 1);
  for (auto& l : labels) l = label(rng);
  dtrain::Host host(1);
  dtrain::Cuda cuda(0);
  const auto h = t::run_loss<T>(host, z, labels, classes, 0.01f);
  const auto g = t::run_loss<T>(cuda, z, labels, classes, 0.01f);
  BOOST_TEST(g.loss == h.loss, boost::test_tools::tolerance(1e-5));
  t::expect_close(g.dlogits, h.dlogits, cross_device_tol<T>(), "dlogits");
}

// Labels are checked on the batch's host copy before any kernel runs, so an
// out-of-range label never reaches the GPU.
BOOST_AUTO_TEST_CASE(out_of_range_label_throws_before_any_kernel) {
  dtrain::Cuda cuda(0);
  const std::int64_t rows = 3, classes = 4;
  const std::vector<std::int32_t> labels{2, 9, 0};
  auto z = t::upload<float>(cuda, std::vector<double>(rows * classes, 0.5));
  auto dz = t::upload<float>(cuda, std::vector<double>(rows * classes, 7.0));
  dtrain::Cuda::buffer<std::int32_t> storage;
  const auto batch = t::label_batch(cuda, labels, storage);
  dtrain::nn::SoftmaxCrossEntropy loss;
  const auto zv = std::as_const(z).view(rows, classes);
  const auto names_row_1 = [](const dtrain::config_error& e) {
    return std::string(e.what()).find("label 9 at row 1 is outside [0, 4)") != std::string::npos;
  };
  const auto forward = [&] { return loss.forward<dtrain::Cuda, float>(cuda, zv, batch); };
  const auto backward = [&] { loss.backward<dtrain::Cuda, float>(cuda, zv, batch, dz.view(rows, classes), 1.f); };
  BOOST_CHECK_EXCEPTION(forward(), dtrain::config_error, names_row_1);
  BOOST_CHECK_EXCEPTION(backward(), dtrain::config_error, names_row_1);
  for (double v : t::download<float>(cuda, dz)) BOOST_TEST(v == 7.0);
}

// Every unit on the GPU against the float64 references and finite
// differences the host is held to (nn_test, sequence_test), with the host's
// tolerances: the GPU computes the same functors, only its sums run in
// another order and its multiply-adds fuse.
BOOST_AUTO_TEST_CASE_TEMPLATE(units_match_float64_on_the_gpu, T, t::dtypes) {
  dtrain::Cuda dev(0);
  t::check_unit_on<T>(dev, dtrain::nn::Linear(5, 4), t::linear_reference(5, 4, true), 6, 5);
  t::check_unit_on<T>(dev, dtrain::nn::Linear(5, 3, {.bias = false}), t::linear_reference(5, 3, false), 6, 5);
  t::check_unit_on<T>(dev, dtrain::nn::ReLU{}, t::relu_reference(), 6, 9);
  t::check_unit_on<T>(dev, dtrain::nn::GELU{}, t::gelu_reference(), 6, 9);
  t::check_unit_on<T>(dev, dtrain::nn::GELUTanh{}, t::gelu_tanh_reference(), 6, 9);
  t::check_unit_on<T>(dev, dtrain::nn::SiLU{}, t::silu_reference(), 6, 9);
  t::check_unit_on<T>(dev, dtrain::nn::SwiGLU{}, t::swiglu_reference(5), 6, 10, true, {}, 2.0);
  for (const std::int64_t width : {std::int64_t{7}, std::int64_t{37}, std::int64_t{48}}) {
    BOOST_TEST_CONTEXT("width " << width) {
      t::check_unit_on<T>(dev, dtrain::nn::LayerNorm(width), t::layer_norm_reference(width, 1e-5), 19, width);
      t::check_unit_on<T>(dev, dtrain::nn::RMSNorm(width), t::rms_norm_reference(width, 1e-6), 19, width);
      t::check_unit_on<T>(dev, dtrain::nn::Linear(9, width), t::linear_reference(9, width, true), 21, 9);
    }
  }
  t::check_unit_on<T>(dev, dtrain::nn::RMSNorm(7, {.eps = 1e-5f, .trainable = false}), t::rms_norm_reference(7, 1e-5), 6, 7);
  t::check_unit_on<T>(dev, dtrain::nn::LayerNorm(7, {.trainable = false}), t::layer_norm_reference(7, 1e-5), 6, 7);
  const dtrain::SeqShape s{2, 5};
  t::check_unit_on<T>(dev, dtrain::nn::CausalSelfAttention(8, 2), t::attention_reference(8, 2, s), s.rows(), 8, true, s,
                      t::composite<T>(8));
  struct Rotary {
    std::int64_t kv_heads;
    float theta;
    bool qkv_bias, out_bias;
  };
  for (const Rotary c : {Rotary{4, 10000.f, false, false}, Rotary{2, 10000.f, true, false}, Rotary{1, 500.f, false, true}}) {
    BOOST_TEST_CONTEXT("rotary: kv_heads " << c.kv_heads << ", theta " << c.theta) {
      const dtrain::nn::RotaryAttention unit(16, 4, {.kv_heads = c.kv_heads, .rope_theta = c.theta,
                                                     .qkv_bias = c.qkv_bias, .out_bias = c.out_bias});
      t::check_unit_on<T>(dev, unit, t::rotary_attention_reference(16, 4, c.kv_heads, c.theta, c.qkv_bias, c.out_bias, s),
                          s.rows(), 16, true, s, t::composite<T>(16));
    }
  }
  t::check_unit_on<T>(dev, dtrain::nn::GeluMLP(6, 10), t::mlp_reference(6, 10), 7, 6, true, {7, 1}, t::composite<T>(4));
  const dtrain::SeqShape b{2, 4};
  t::check_unit_on<T>(dev, dtrain::nn::TransformerBlock(8, 2), t::block_reference(8, 2, b), b.rows(), 8, true, b,
                      t::composite<T>(16));
  const dtrain::SeqShape p{3, 4};
  t::check_unit_on<T>(dev, dtrain::nn::PositionalEmbedding(6, 5), t::positional_reference(5, p), p.rows(), 5, true, p);
}

// The causal softmax kernel with and without a padding mask (left padding
// and a hole), against float64, at a length whose rows end inside, at and
// past a warp's lanes.
BOOST_AUTO_TEST_CASE_TEMPLATE(causal_softmax_with_and_without_padding, T, t::dtypes) {
  const std::int64_t time = 37, heads = 2, batch = 2;
  std::mt19937_64 rng(11);
  const std::vector<double> scores = t::round_to<T>(t::random_nonzero(batch * heads * time * time, rng, 4.0));
  std::vector<std::int32_t> mask(static_cast<std::size_t>(batch * time), 1);
  for (std::int64_t j = 0; j < 5; ++j) mask[static_cast<std::size_t>(j)] = 0;
  for (std::int64_t j = 20; j < 23; ++j) mask[static_cast<std::size_t>(time + j)] = 0;
  dtrain::Cuda dev(0);
  auto mask_d = dtrain::make_buffer<std::int32_t>(dev, mask.size());
  dev.copy_from_host(mask_d.data(), mask.data(), mask.size());
  for (const bool padded : {false, true}) {
    BOOST_TEST_CONTEXT((padded ? "padded" : "causal only")) {
      auto att = t::upload<T>(dev, scores);
      const auto rows = static_cast<std::size_t>(batch * heads * time);
      if (padded)
        dev.for_each(rows, dtrain::CausalSoftmax<T, std::int32_t>{att.data(), time, mask_d.data(), heads});
      else
        dev.for_each(rows, dtrain::CausalSoftmax<T>{att.data(), time});
      t::expect_close(t::download<T>(dev, att),
                      t::masked_softmax_reference(scores, time, heads, padded ? mask : std::vector<std::int32_t>{}),
                      t::forward_tol<T>, "probabilities");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
