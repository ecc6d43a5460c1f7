// The nn units and the loss on dtrain::Cuda against dtrain::Host, same random
// inputs, every dtype; plus the GPU's out-of-range label behaviour. Needs a
// GPU; exits 77 without one.
#include "support/gpu_main.hpp"
// gpu_main.hpp first: it sets Boost.Test up for its own main() before anything includes Boost.Test.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/numeric.hpp"
#include "model/custom_model.hpp"
#include "nn/attention_reference.hpp"
#include "nn/reference.hpp"
#include "nn/sequence_reference.hpp"
#include "nn/unit_harness.hpp"
#include "nn/vision_reference.hpp"

#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/backend/host/device.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/dropout.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/patch_embedding.hpp"
#include "dtrain/nn/preference_loss.hpp"
#include "dtrain/nn/rms_norm.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/transformer.hpp"

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
  compare_unit<T>(dtrain::nn::QuickGELU{}, 300, 70, "QuickGELU");
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

// LoRA adapters (nn/lora.hpp) on every projection: the same as the host.
BOOST_AUTO_TEST_CASE_TEMPLATE(lora_units_match_host, T, t::dtypes) {
  const dtrain::SeqShape s{3, 37};
  const double init = 1.0 / 8;
  const dtrain::nn::LoraOptions o{.r = 4, .alpha = 2.f};
  compare_unit<T>(dtrain::nn::Linear(64, 48, {.lora = o}), s.rows(), 64, "Linear + LoRA", s, 2, init);
  compare_unit<T>(dtrain::nn::CausalSelfAttention(64, 4, {.qkv_lora = o, .proj_lora = o}), s.rows(), 64,
                  "CausalSelfAttention + LoRA", s, 8, init);
  compare_unit<T>(dtrain::nn::MLP<dtrain::nn::SwiGLU>(64, 48, {.bias = false, .fc1_lora = o, .fc2_lora = o}), s.rows(),
                  64, "SwiGLU MLP + LoRA", s, 4, init);
  compare_unit<T>(
      dtrain::nn::RotaryAttention(64, 4, {.kv_heads = 2, .q_lora = o, .k_lora = o, .v_lora = o, .o_lora = o}), s.rows(),
      64, "RotaryAttention + LoRA", s, 8, init);
  // lora_dropout: the same masks (a function of the stream and the element) on both devices
  const dtrain::nn::LoraOptions d{.r = 4, .alpha = 2.f, .dropout = 0.2f};
  compare_unit<T>(dtrain::nn::MLP<dtrain::nn::SwiGLU>(64, 48, {.bias = false, .fc1_lora = d, .fc2_lora = d}), s.rows(),
                  64, "SwiGLU MLP + LoRA dropout", s, 4, init);
  compare_unit<T>(dtrain::nn::RotaryAttention(64, 4, {.kv_heads = 2, .q_lora = d, .v_lora = d, .o_lora = d}), s.rows(),
                  64, "RotaryAttention + LoRA dropout", s, 8, init);
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
    batch.set("x", dtrain::DeviceTensor{dtrain::element_type::i32,
                                        {4, rows / 4},
                                        reinterpret_cast<const std::byte*>(idb.data()),
                                        reinterpret_cast<const std::byte*>(ids.data()),
                                        {}});
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

// nn::PreferenceLoss on the GPU (DTRAIN_GPU_PREFERENCE=on) against the host
// on the same logits, targets and reference: the loss (1e-5 relative) and
// the logits' gradient (cross-device tolerance); refused without the switch.
BOOST_AUTO_TEST_CASE(preference_loss_matches_host) {
  const std::int64_t pairs = 4, steps = 9, vocab = 300, seqs = 2 * pairs, rows = seqs * steps;
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<float> logit(-3.f, 3.f);
  std::uniform_real_distribution<double> reference(-30.0, -10.0);
  std::uniform_int_distribution<std::int32_t> token(0, vocab - 1);
  std::uniform_int_distribution<std::int64_t> prompt(2, 4);
  std::vector<float> z(static_cast<std::size_t>(rows * vocab));
  for (float& v : z) v = logit(rng);
  std::vector<std::int32_t> y(static_cast<std::size_t>(rows), -100);
  for (std::int64_t s = 0; s < seqs; ++s)
    for (std::int64_t t = prompt(rng); t < steps; ++t) y[static_cast<std::size_t>(s * steps + t)] = token(rng);
  std::vector<double> ref(static_cast<std::size_t>(seqs));
  for (double& v : ref) v = reference(rng);

  dtrain::Host host(1);
  dtrain::Cuda cuda(0);
  auto zd = dtrain::make_buffer<float>(cuda, z.size()), dzd = dtrain::make_buffer<float>(cuda, z.size());
  auto yd = dtrain::make_buffer<std::int32_t>(cuda, y.size());
  cuda.copy_from_host(zd.data(), z.data(), z.size());
  cuda.copy_from_host(yd.data(), y.data(), y.size());
  const auto* y_host = reinterpret_cast<const std::byte*>(y.data());
  const auto* ref_host = reinterpret_cast<const std::byte*>(ref.data());  // read on the host only
  dtrain::DeviceBatch on_host, on_gpu;
  on_host.set("y", dtrain::DeviceTensor{dtrain::element_type::i32, {seqs, steps}, y_host, y_host, "y"});
  on_gpu.set("y",
             dtrain::DeviceTensor{
                 dtrain::element_type::i32, {seqs, steps}, reinterpret_cast<const std::byte*>(yd.data()), y_host, "y"});
  for (auto* b : {&on_host, &on_gpu})
    b->set("ref_logps", dtrain::DeviceTensor{dtrain::element_type::f64, {seqs}, ref_host, ref_host, "ref_logps"});
  const dtrain::MatView<const float> zh{z.data(), rows, vocab}, zg{zd.data(), rows, vocab};

  dtrain::nn::PreferenceLoss loss({.beta = 0.3f});
  ::unsetenv("DTRAIN_GPU_PREFERENCE");
  BOOST_CHECK_EXCEPTION(loss.forward<dtrain::Cuda>(cuda, zg, on_gpu), dtrain::config_error,
                        [](const dtrain::config_error& e) {
                          return std::string(e.what()).find("DTRAIN_GPU_PREFERENCE=on") != std::string::npos;
                        });
  ::setenv("DTRAIN_GPU_PREFERENCE", "on", 1);
  const float scale = 0.25f;
  std::vector<float> dzh(z.size());
  const double want = loss.forward<dtrain::Host>(host, zh, on_host);
  loss.backward<dtrain::Host>(host, zh, on_host, dtrain::MatView<float>{dzh.data(), rows, vocab}, scale);
  const double got = loss.forward<dtrain::Cuda>(cuda, zg, on_gpu);
  loss.backward<dtrain::Cuda>(cuda, zg, on_gpu, dtrain::MatView<float>{dzd.data(), rows, vocab}, scale);
  ::unsetenv("DTRAIN_GPU_PREFERENCE");
  BOOST_TEST(got == want, boost::test_tools::tolerance(1e-5));
  const std::vector<double> g = t::download<float>(cuda, dzd), h(dzh.begin(), dzh.end());
  t::expect_close(g, h, cross_device_tol<float>(), "preference dlogits");
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
  t::check_unit_on<T>(dev, dtrain::nn::QuickGELU{}, t::quick_gelu_reference(), 6, 9);
  t::check_unit_on<T>(dev, dtrain::nn::SwiGLU{}, t::swiglu_reference(5), 6, 10, true, {}, 2.0);
  for (const std::int64_t width : {std::int64_t{7}, std::int64_t{37}, std::int64_t{48}}) {
    BOOST_TEST_CONTEXT("width " << width) {
      t::check_unit_on<T>(dev, dtrain::nn::LayerNorm(width), t::layer_norm_reference(width, 1e-5), 19, width);
      t::check_unit_on<T>(dev, dtrain::nn::RMSNorm(width), t::rms_norm_reference(width, 1e-6), 19, width);
      t::check_unit_on<T>(dev, dtrain::nn::Linear(9, width), t::linear_reference(9, width, true), 21, 9);
    }
  }
  t::check_unit_on<T>(dev, dtrain::nn::RMSNorm(7, {.eps = 1e-5f, .trainable = false}), t::rms_norm_reference(7, 1e-5),
                      6, 7);
  t::check_unit_on<T>(dev, dtrain::nn::LayerNorm(7, {.trainable = false}), t::layer_norm_reference(7, 1e-5), 6, 7);
  const dtrain::SeqShape s{2, 5};
  t::check_unit_on<T>(dev, dtrain::nn::CausalSelfAttention(8, 2), t::attention_reference(8, 2, s), s.rows(), 8, true, s,
                      t::composite<T>(8));
  struct Rotary {
    std::int64_t kv_heads;
    float theta;
    bool qkv_bias, out_bias;
  };
  for (const Rotary c :
       {Rotary{4, 10000.f, false, false}, Rotary{2, 10000.f, true, false}, Rotary{1, 500.f, false, true}}) {
    BOOST_TEST_CONTEXT("rotary: kv_heads " << c.kv_heads << ", theta " << c.theta) {
      const dtrain::nn::RotaryAttention unit(
          16, 4, {.kv_heads = c.kv_heads, .rope_theta = c.theta, .qkv_bias = c.qkv_bias, .out_bias = c.out_bias});
      t::check_unit_on<T>(dev, unit,
                          t::rotary_attention_reference(16, 4, c.kv_heads, c.theta, c.qkv_bias, c.out_bias, s),
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

// The new GPU paths (docs/gpu.md, "Kernel paths"), each against the path it
// would replace, on one GPU.
namespace {

dtrain::Cuda device_with(dtrain::CudaPaths paths) {
  dtrain::Cuda dev(0);
  dev.set_paths(paths);
  return dev;
}

constexpr dtrain::CudaPaths reference_paths{};
constexpr dtrain::CudaPaths lane_rows{.rows = dtrain::row_kernels::lanes};
constexpr dtrain::CudaPaths wide_elementwise{.elementwise = dtrain::elementwise_kernels::wide};
constexpr dtrain::CudaPaths cudnn_attention{.attention = dtrain::attention_kernels::cudnn};

// `path` against the reference paths: the same bits.
template <class T, class U>
void same_bits_with(const dtrain::CudaPaths& path, U unit, std::int64_t rows, std::int64_t in, const std::string& name,
                    dtrain::SeqShape shape = {}) {
  BOOST_TEST_CONTEXT(name << " " << dtrain::dtype_traits<T>::name) {
    auto thread = device_with(reference_paths);
    auto lanes = device_with(path);
    const t::UnitCase c = t::make_case(unit, rows, in, 17);
    const t::UnitResult a = t::run_unit<T>(thread, unit, c, true, shape);
    const t::UnitResult b = t::run_unit<T>(lanes, unit, c, true, shape);
    t::expect_close(b.y, a.y, 0.0, "forward");
    t::expect_close(b.dx, a.dx, 0.0, "input gradient");
    for (std::size_t i = 0; i < c.specs.size(); ++i)
      t::expect_close(b.grads[i], a.grads[i], 0.0, c.specs[i].name + " gradient");
  }
}

}  // namespace

// DTRAIN_ROW_KERNELS=lanes: a group of math::lanes threads per row gives the
// one-thread-per-row kernels' bits exactly (the same lane order and tree),
// at widths inside, at and past the lanes and at a GPT-2 width.
BOOST_AUTO_TEST_CASE_TEMPLATE(lane_rows_give_the_same_bits, T, t::dtypes) {
  for (const std::int64_t w : {std::int64_t{7}, std::int64_t{16}, std::int64_t{37}, std::int64_t{768}}) {
    same_bits_with<T>(lane_rows, dtrain::nn::LayerNorm(w), 301, w, "LayerNorm " + std::to_string(w));
    same_bits_with<T>(lane_rows, dtrain::nn::RMSNorm(w), 301, w, "RMSNorm " + std::to_string(w));
  }
  const dtrain::SeqShape s{3, 37};
  same_bits_with<T>(lane_rows, dtrain::nn::CausalSelfAttention(64, 4), s.rows(), 64, "CausalSelfAttention", s);
  same_bits_with<T>(lane_rows, dtrain::nn::RotaryAttention(64, 4, {.kv_heads = 2}), s.rows(), 64, "RotaryAttention", s);
  same_bits_with<T>(lane_rows, dtrain::nn::TransformerBlock(64, 4), s.rows(), 64, "TransformerBlock", s);

  // cross-entropy over a vocabulary-sized row: the gradient bit for bit, the
  // loss (a double sum over rows in another order) to double rounding
  const std::int64_t rows = 97, classes = 50257;
  std::mt19937_64 rng(8);
  const std::vector<double> z = t::round_to<T>(t::random_nonzero(static_cast<std::size_t>(rows * classes), rng, 4.0));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  std::uniform_int_distribution<std::int32_t> label(0, classes - 1);
  for (auto& l : labels) l = label(rng);
  labels[5] = -100;
  auto thread = device_with(reference_paths);
  auto lanes = device_with(lane_rows);
  const auto a = t::run_loss<T>(thread, z, labels, classes, 0.01f);
  const auto b = t::run_loss<T>(lanes, z, labels, classes, 0.01f);
  BOOST_TEST(b.loss == a.loss, boost::test_tools::tolerance(1e-12));
  t::expect_close(b.dlogits, a.dlogits, 0.0, "cross-entropy dlogits");

  // the padded causal softmax
  const std::int64_t time = 37, heads = 2, batch = 2;
  const std::vector<double> scores = t::round_to<T>(t::random_nonzero(batch * heads * time * time, rng, 4.0));
  std::vector<std::int32_t> mask(static_cast<std::size_t>(batch * time), 1);
  for (std::int64_t j = 0; j < 5; ++j) mask[static_cast<std::size_t>(j)] = 0;
  auto softmax = [&](dtrain::Cuda& dev) {
    auto m = dtrain::make_buffer<std::int32_t>(dev, mask.size());
    dev.copy_from_host(m.data(), mask.data(), mask.size());
    auto att = t::upload<T>(dev, scores);
    dev.for_each(static_cast<std::size_t>(batch * heads * time),
                 dtrain::CausalSoftmax<T, std::int32_t>{att.data(), time, m.data(), heads});
    return t::download<T>(dev, att);
  };
  t::expect_close(softmax(lanes), softmax(thread), 0.0, "padded causal softmax");
}

// DTRAIN_ELEMENTWISE=wide: four elements per access, the same bits; sizes
// with a tail (the last n % 4 one by one).
BOOST_AUTO_TEST_CASE_TEMPLATE(wide_elementwise_gives_the_same_bits, T, t::dtypes) {
  same_bits_with<T>(wide_elementwise, dtrain::nn::GELU{}, 301, 70, "GELU");
  same_bits_with<T>(wide_elementwise, dtrain::nn::GELUTanh{}, 301, 70, "GELUTanh");
  same_bits_with<T>(wide_elementwise, dtrain::nn::SiLU{}, 301, 70, "SiLU");
  same_bits_with<T>(wide_elementwise, dtrain::nn::QuickGELU{}, 301, 70, "QuickGELU");
  same_bits_with<T>(wide_elementwise, dtrain::nn::ReLU{}, 301, 70, "ReLU");
  const dtrain::SeqShape s{3, 37};
  same_bits_with<T>(wide_elementwise, dtrain::nn::TransformerBlock(64, 4), s.rows(), 64, "TransformerBlock", s);
}

#if DTRAIN_HAS_CUDNN
namespace {

// cuDNN's fused attention against the reference path on the same GPU, with
// and without padding (left padding and a hole; the padded positions get no
// upstream gradient, as in training, where they have no target; the outputs
// of queries before the first token, which attend to nothing, are not
// compared). Bounds: the cross-device bound of a composite of 8 roundings;
// cuDNN also rounds the probabilities to T before multiplying by v.
template <class T, class U>
void fused_matches_reference(U unit, dtrain::SeqShape s, std::int64_t dim, const std::string& name, bool padded) {
  BOOST_TEST_CONTEXT(name << " " << dtrain::dtype_traits<T>::name << (padded ? " padded" : "")) {
    auto ref = device_with(reference_paths);
    auto fused = device_with(cudnn_attention);
    BOOST_TEST_REQUIRE(dtrain::saved_size_of<T>(unit, fused, s, dim) < dtrain::saved_size_of(unit, s, dim),
                       "cuDNN takes the problem (the fused path keeps less than the reference)");
    t::UnitCase c = t::make_case(unit, s.rows(), dim, 23);
    for (auto& p : c.params)
      for (auto& v : p) v /= std::sqrt(static_cast<double>(dim));  // initialisation scale: O(1) scores
    std::vector<std::int32_t> mask(static_cast<std::size_t>(s.rows()), 1);
    if (padded) {
      for (std::int64_t j = 0; j < 3; ++j) mask[static_cast<std::size_t>(j)] = 0;  // left padding
      for (std::int64_t j = 9; j < 11; ++j) mask[static_cast<std::size_t>((s.batch - 1) * s.time + j)] = 0;  // a hole
      for (std::size_t r = 0; r < mask.size(); ++r)
        if (mask[r] == 0)
          for (std::int64_t k = 0; k < dim; ++k)
            c.dy[r * static_cast<std::size_t>(dim) + static_cast<std::size_t>(k)] = 0;
    }
    auto run = [&](dtrain::Cuda& dev) {
      auto m = dtrain::make_buffer<std::int32_t>(dev, mask.size());
      dev.copy_from_host(m.data(), mask.data(), mask.size());
      dtrain::DeviceBatch batch;
      if (padded)
        batch.set("attention_mask", dtrain::DeviceTensor{dtrain::element_type::i32,
                                                         {s.batch, s.time},
                                                         reinterpret_cast<const std::byte*>(m.data()),
                                                         reinterpret_cast<const std::byte*>(mask.data()),
                                                         {}});
      t::UnitResult r = t::run_unit<T>(dev, unit, c, true, s, &batch);
      for (std::int64_t j = 0; padded && j < 3; ++j)  // queries with nothing to attend to
        for (std::int64_t k = 0; k < dim; ++k) r.y[static_cast<std::size_t>(j * dim + k)] = 0;
      return r;
    };
    const t::UnitResult a = run(ref), b = run(fused);
    const double tol = cross_device_tol<T>(8);
    t::expect_close(b.y, a.y, tol, "forward");
    t::expect_close(b.dx, a.dx, tol, "input gradient");
    for (std::size_t i = 0; i < c.specs.size(); ++i) t::expect_close(b.grads[i], a.grads[i], tol, c.specs[i].name);
  }
}

}  // namespace

using half_types = std::tuple<dtrain::bf16, dtrain::fp16>;

// DTRAIN_ATTENTION=cudnn: head dims 64 and 128, multi-head and grouped-query,
// GPT-2's fused q|k|v and Llama's separate projections with rotary positions.
BOOST_AUTO_TEST_CASE_TEMPLATE(cudnn_attention_matches_the_reference, T, half_types) {
  for (const bool padded : {false, true}) {
    fused_matches_reference<T>(dtrain::nn::CausalSelfAttention(768, 12), {2, 64}, 768, "GPT-2 attention, hd 64",
                               padded);
    fused_matches_reference<T>(dtrain::nn::CausalSelfAttention(512, 4), {2, 48}, 512, "attention, hd 128", padded);
    fused_matches_reference<T>(dtrain::nn::RotaryAttention(512, 8, {.kv_heads = 2}), {2, 64}, 512,
                               "Llama attention, GQA 8/2, hd 64", padded);
    fused_matches_reference<T>(dtrain::nn::RotaryAttention(1024, 8, {.kv_heads = 1, .qkv_bias = true}), {1, 80}, 1024,
                               "Qwen2-style attention, MQA, hd 128, biases", padded);
  }
}
#else
BOOST_AUTO_TEST_CASE(cudnn_attention_is_built) {
  BOOST_FAIL(
      "this CUDA build has no cuDNN fused attention (DTRAIN_HAS_CUDNN): configure with DTRAIN_CUDNN=ON "
      "(cuDNN 9 and the cudnn-frontend headers, scripts/setup.sh) so the GPU check covers it");
}
#endif

BOOST_AUTO_TEST_SUITE_END()

// The vision units (nn/convolution.hpp, nn/patch_embedding.hpp). Their GPU
// path is off until a GPU run has passed these: DTRAIN_GPU_VISION=on here.
namespace {

struct GpuVisionOn {
  GpuVisionOn() { ::setenv("DTRAIN_GPU_VISION", "on", 1); }
  ~GpuVisionOn() { ::unsetenv("DTRAIN_GPU_VISION"); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_vision)

// The host test's cases against the float64 loops, with the host's tolerances.
BOOST_AUTO_TEST_CASE_TEMPLATE(vision_units_match_float64_on_the_gpu, T, t::dtypes) {
  const GpuVisionOn on;
  dtrain::Cuda dev(0);
  for (const auto& k : t::conv_cases) t::check_conv_on<T>(dev, k);
  t::check_conv_on<T>(dev, t::conv_cases[1], false);
  t::check_conv_on<T>(dev, t::conv_cases[1], true, false);
  for (const auto& k : t::patch_cases) t::check_patch_on<T>(dev, k);
}

// Sizes where cuBLAS tiles and for_each runs many blocks: the same as the host.
BOOST_AUTO_TEST_CASE_TEMPLATE(vision_units_match_host, T, t::dtypes) {
  const GpuVisionOn on;
  const t::ConvCase conv{.batch = 4,
                         .channels = 16,
                         .height = 30,
                         .width = 28,
                         .out_channels = 24,
                         .kernel_h = 3,
                         .kernel_w = 3,
                         .stride_h = 2,
                         .stride_w = 2,
                         .pad_h = 1,
                         .pad_w = 1,
                         .groups = 4};
  compare_unit<T>(conv.unit(), conv.batch, conv.in_size(), "grouped Conv2d", {}, 1, 1.0 / 6);
  t::PatchCase pc{.batch = 3, .channels = 3, .height = 42, .width = 56, .dim = 64, .patch = 14};
  dtrain::nn::PatchEmbedding pe = pc.unit();
  BOOST_TEST_CONTEXT("PatchEmbedding " << dtrain::dtype_traits<T>::name) {
    dtrain::Host host(1);
    dtrain::Cuda cuda(0);
    t::UnitCase c = t::make_patch_case(pc, pe, 5);
    for (auto& v : c.params[0]) v /= 24;  // fan-in 588: O(1) tokens
    const t::UnitResult h = t::run_patch<T>(host, pe, c), g = t::run_patch<T>(cuda, pe, c);
    t::expect_close(g.y, h.y, cross_device_tol<T>(), "tokens");
    t::expect_close(g.dx, h.dx, cross_device_tol<T>(), "input gradient");
    for (std::size_t i = 0; i < c.specs.size(); ++i)
      t::expect_close(g.grads[i], h.grads[i], cross_device_tol<T>(), c.specs[i].name + " gradient");
  }
}

// Without the switch a Cuda device refuses the vision units, naming it.
BOOST_AUTO_TEST_CASE(vision_units_are_off_without_the_switch) {
  ::unsetenv("DTRAIN_GPU_VISION");
  dtrain::Cuda dev(0);
  dtrain::nn::Conv2d unit = t::conv_cases[0].unit();
  const t::UnitCase c = t::make_case(unit, 2, t::conv_cases[0].in_size(), 1);
  BOOST_CHECK_EXCEPTION(t::run_unit<float>(dev, unit, c), dtrain::config_error, [](const dtrain::config_error& e) {
    return std::string(e.what()).find("DTRAIN_GPU_VISION=on") != std::string::npos;
  });
}

BOOST_AUTO_TEST_SUITE_END()

// The attention family's forms beyond causal self-attention (bidirectional,
// padded, packed, cross, QK-norm: nn/attention_policies.hpp). Their GPU path
// is off until a GPU run has passed these: DTRAIN_GPU_ATTENTION=on here.
namespace {

struct GpuAttentionOn {
  GpuAttentionOn() { ::setenv("DTRAIN_GPU_ATTENTION", "on", 1); }
  ~GpuAttentionOn() { ::unsetenv("DTRAIN_GPU_ATTENTION"); }
};

// `unit` on the GPU against the host at sizes where cuBLAS tiles, with the
// batch's masks; parameters at their initialisation's scale (compare_unit).
template <class T, class U>
void compare_family(U unit, const t::FamilySpec& f, t::FamilyInputs in, const std::string& name) {
  BOOST_TEST_CONTEXT(name << " " << dtrain::dtype_traits<T>::name) {
    dtrain::Host host(1);
    dtrain::Cuda cuda(0);
    t::UnitCase c = t::family_case<T>(unit, f, in);
    for (auto& p : c.params)
      for (auto& v : p) v /= std::sqrt(static_cast<double>(f.dim));
    const t::FamilyResult h = t::run_family<T>(host, unit, f, in, c), g = t::run_family<T>(cuda, unit, f, in, c);
    const double tol = cross_device_tol<T>(8);
    t::expect_close(g.unit.y, h.unit.y, tol, "forward");
    t::expect_close(g.unit.dx, h.unit.dx, tol, "input gradient");
    if (f.cross) t::expect_close(g.d_memory, h.d_memory, tol, "memory gradient");
    for (std::size_t i = 0; i < c.specs.size(); ++i)
      t::expect_close(g.unit.grads[i], h.unit.grads[i], tol, c.specs[i].name + " gradient");
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_attention_family)

// The host test's cases against the float64 loops, with the host's tolerances.
BOOST_AUTO_TEST_CASE_TEMPLATE(attention_family_matches_float64_on_the_gpu, T, t::dtypes) {
  const GpuAttentionOn on;
  dtrain::Cuda dev(0);
  for (const auto group :
       {t::FamilyGroup::bidirectional, t::FamilyGroup::qk_norm, t::FamilyGroup::packed, t::FamilyGroup::cross})
    t::family_cases(group, [&](const std::string& name, auto unit, const t::FamilySpec& f, const t::FamilyInputs& in) {
      BOOST_TEST_CONTEXT(name) { t::check_family_on<T>(dev, std::move(unit), f, in, t::family_scale<T>(f)); }
    });
}

// Head dim 64, 8 heads over 2 key/value heads, 64 queries: padded
// bidirectional self-attention with QK-norm, and cross-attention over a
// padded memory of 80 positions 384 wide.
BOOST_AUTO_TEST_CASE_TEMPLATE(attention_family_matches_host, T, t::dtypes) {
  const GpuAttentionOn on;
  namespace nn = dtrain::nn;
  t::FamilySpec f{.dim = 512, .heads = 8, .kv_heads = 2, .memory_dim = 512, .qk_norm = true, .out_bias = true};
  compare_family<T>(nn::Attention<nn::Bidirectional>(512, 8, t::family_options(f)), f,
                    {.shape = {2, 64}, .k_time = 64, .key_mask = t::padding_mask(2, 64, 5)}, "bidirectional, QK-norm");
  f.memory_dim = 384;
  f.cross = true;
  compare_family<T>(nn::Attention<nn::CrossInput, nn::Bidirectional>(512, 8, t::family_options(f)), f,
                    {.shape = {2, 64}, .k_time = 80, .key_mask = t::padding_mask(2, 80, 7)}, "cross, QK-norm");
}

// Without the switch a Cuda device refuses the new forms, naming it; causal
// self-attention keeps its GPU paths without it.
BOOST_AUTO_TEST_CASE(attention_family_is_off_without_the_switch) {
  ::unsetenv("DTRAIN_GPU_ATTENTION");
  namespace nn = dtrain::nn;
  dtrain::Cuda dev(0);
  nn::Attention<nn::Bidirectional> unit(16, 4);
  const t::UnitCase c = t::make_case(unit, 10, 16, 1);
  BOOST_CHECK_EXCEPTION(t::run_unit<float>(dev, unit, c, true, {2, 5}), dtrain::config_error,
                        [](const dtrain::config_error& e) {
                          return std::string(e.what()).find("DTRAIN_GPU_ATTENTION=on") != std::string::npos;
                        });
  nn::RotaryAttention causal(16, 4);
  BOOST_CHECK_NO_THROW(t::run_unit<float>(dev, causal, t::make_case(causal, 10, 16, 1), true, {2, 5}));
}

BOOST_AUTO_TEST_SUITE_END()
