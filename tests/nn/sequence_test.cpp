// The sequence units (embeddings, causal self-attention, GELU MLP, the
// transformer block) and the new losses against float64 references and
// central finite differences of them, on the host in every dtype.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include "nn/sequence_reference.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/regression_loss.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/sandwich_block.hpp"
#include "dtrain/nn/transformer.hpp"

namespace t = dtrain::testing;
using dtrain::SeqShape;
using t::attention_reference;
using t::block_reference;
using t::composite;
using t::mlp_reference;
using t::positional_reference;
using t::rotary_attention_reference;

BOOST_AUTO_TEST_SUITE(sequence_units)

BOOST_AUTO_TEST_CASE_TEMPLATE(causal_self_attention, T, t::dtypes) {
  const SeqShape s{2, 5};
  t::check_unit<T>(dtrain::nn::CausalSelfAttention(8, 2), attention_reference(8, 2, s), s.rows(), 8, true, s,
                   composite<T>(8));
}

// Multi-head, grouped (2 query heads per key/value head) and multi-query,
// with and without rotation and biases. Without rotation a key bias has an
// exact zero gradient (it adds the same q.b to every score of a row), which
// no relative tolerance can check, so that case has an output bias only.
BOOST_AUTO_TEST_CASE_TEMPLATE(rotary_attention, T, t::dtypes) {
  const SeqShape s{2, 5};
  struct Case {
    std::int64_t kv_heads;
    float theta;
    bool qkv_bias, out_bias;
  };
  for (const Case c : {Case{4, 10000.f, false, false}, Case{2, 10000.f, true, false}, Case{1, 500.f, false, true},
                       Case{2, 0.f, false, true}}) {
    BOOST_TEST_CONTEXT("kv_heads " << c.kv_heads << ", theta " << c.theta << ", biases " << c.qkv_bias << c.out_bias) {
      const dtrain::nn::RotaryAttention unit(
          16, 4, {.kv_heads = c.kv_heads, .rope_theta = c.theta, .qkv_bias = c.qkv_bias, .out_bias = c.out_bias});
      t::check_unit<T>(unit, rotary_attention_reference(16, 4, c.kv_heads, c.theta, c.qkv_bias, c.out_bias, s),
                       s.rows(), 16, true, s, composite<T>(16));
    }
  }
}

// Past 64 positions the host multiplies the attention in row blocks of 64
// that skip the masked half (nn::detail::causal_gemm_batched): 100
// positions make two blocks, the second ragged, through both units' own
// calls. (That nothing reads the scores a block leaves unwritten is checked
// with NaN in them by causal_row_blocks_never_read_past_a_block, below.)
BOOST_AUTO_TEST_CASE(attention_over_row_blocks) {
  const SeqShape s{1, 100};
  t::check_unit<float>(dtrain::nn::CausalSelfAttention(8, 2), attention_reference(8, 2, s), s.rows(), 8, true, s,
                       composite<float>(8));
  t::check_unit<float>(dtrain::nn::RotaryAttention(8, 2, {.kv_heads = 1, .rope_theta = 10000.f, .out_bias = true}),
                       rotary_attention_reference(8, 2, 1, 10000.f, false, true, s), s.rows(), 8, true, s,
                       composite<float>(8));
}

// The row-block products and the block-bounded softmax kernels on their own,
// against float64, with every score and score gradient poisoned with NaN
// first: a product or kernel that read a row past its block's end would
// carry the NaN into a result. Forward O = softmax(scale Q K^T) V, backward
// dQ = dS K, dK = dS^T Q, dV = P^T dO with dS from the softmax's backward.
BOOST_AUTO_TEST_CASE(causal_row_blocks_never_read_past_a_block) {
  namespace d = dtrain::nn::detail;
  dtrain::Host dev(1);
  const std::int64_t time = 100, hd = 8, heads = 2, th = time * hd, tt = time * time;
  const float scale = 0.35f;
  std::mt19937_64 rng(11);
  auto draw = [&](std::int64_t n) {
    std::vector<float> v;
    for (double x : t::random_nonzero(static_cast<std::size_t>(n), rng)) v.push_back(static_cast<float>(x));
    return v;
  };
  const auto q = draw(heads * th), k = draw(heads * th), v = draw(heads * th), d_o = draw(heads * th);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> att(static_cast<std::size_t>(heads * tt), nan), d_att = att;
  std::vector<float> o(static_cast<std::size_t>(heads * th)), dq = o, dk = o, dv = o;
  const auto rows = static_cast<std::size_t>(heads * time);
  d::causal_gemm_batched(dev, d::causal_product::scores, time, hd, scale, q.data(), hd, th, k.data(), hd, th,
                         att.data(), time, tt, heads);
  constexpr std::int64_t block = d::causal_block_on<dtrain::Host>;
  dev.for_each(rows, dtrain::CausalSoftmax<float>{att.data(), time, nullptr, heads, nullptr, block});
  d::causal_gemm_batched(dev, d::causal_product::apply, time, hd, 1.f, att.data(), time, tt, v.data(), hd, th, o.data(),
                         hd, th, heads);
  d::causal_gemm_batched(dev, d::causal_product::scores, time, hd, 1.f, d_o.data(), hd, th, v.data(), hd, th,
                         d_att.data(), time, tt, heads);
  d::causal_gemm_batched(dev, d::causal_product::apply_transposed, time, hd, 1.f, att.data(), time, tt, d_o.data(), hd,
                         th, dv.data(), hd, th, heads);
  dev.for_each(rows, dtrain::CausalSoftmaxBackward<float>{att.data(), d_att.data(), time, scale, block});
  d::causal_gemm_batched(dev, d::causal_product::apply, time, hd, 1.f, d_att.data(), time, tt, k.data(), hd, th,
                         dq.data(), hd, th, heads);
  d::causal_gemm_batched(dev, d::causal_product::apply_transposed, time, hd, 1.f, d_att.data(), time, tt, q.data(), hd,
                         th, dk.data(), hd, th, heads);

  // float64: P, then dS = scale P (dP - rowsum(P dP)), dP = dO V^T
  std::vector<double> want_o(o.size()), want_dq(o.size()), want_dk(o.size()), want_dv(o.size());
  for (std::int64_t h = 0; h < heads; ++h) {
    const auto at = [&](const std::vector<float>& m, std::int64_t r, std::int64_t c) {
      return static_cast<double>(m[static_cast<std::size_t>(h * th + r * hd + c)]);
    };
    std::vector<double> pr(static_cast<std::size_t>(tt), 0.0), ds(static_cast<std::size_t>(tt), 0.0);
    for (std::int64_t i = 0; i < time; ++i) {
      double mx = -1e300, sum = 0, dot = 0;
      std::vector<double> srow(static_cast<std::size_t>(i + 1)), dp(srow.size());
      for (std::int64_t j = 0; j <= i; ++j) {
        double sc = 0, g = 0;
        for (std::int64_t c = 0; c < hd; ++c) sc += at(q, i, c) * at(k, j, c), g += at(d_o, i, c) * at(v, j, c);
        srow[static_cast<std::size_t>(j)] = scale * sc, dp[static_cast<std::size_t>(j)] = g;
        mx = std::max(mx, scale * sc);
      }
      for (double& x : srow) sum += (x = std::exp(x - mx));
      for (std::int64_t j = 0; j <= i; ++j) {
        const double pij = srow[static_cast<std::size_t>(j)] / sum;
        pr[static_cast<std::size_t>(i * time + j)] = pij;
        dot += pij * dp[static_cast<std::size_t>(j)];
      }
      for (std::int64_t j = 0; j <= i; ++j) {
        const auto n = static_cast<std::size_t>(i * time + j);
        ds[n] = scale * pr[n] * (dp[static_cast<std::size_t>(j)] - dot);
      }
    }
    for (std::int64_t i = 0; i < time; ++i)
      for (std::int64_t c = 0; c < hd; ++c) {
        const auto n = static_cast<std::size_t>(h * th + i * hd + c);
        for (std::int64_t j = 0; j < time; ++j) {
          const auto ij = static_cast<std::size_t>(i * time + j), ji = static_cast<std::size_t>(j * time + i);
          want_o[n] += pr[ij] * at(v, j, c);
          want_dq[n] += ds[ij] * at(k, j, c);
          want_dk[n] += ds[ji] * at(q, j, c);
          want_dv[n] += pr[ji] * at(d_o, j, c);
        }
      }
  }
  const auto wide = [](const std::vector<float>& f) { return std::vector<double>(f.begin(), f.end()); };
  t::expect_close(wide(o), want_o, 1e-5, "output");
  t::expect_close(wide(dq), want_dq, 1e-4, "query gradient");
  t::expect_close(wide(dk), want_dk, 1e-4, "key gradient");
  t::expect_close(wide(dv), want_dv, 1e-4, "value gradient");
}

BOOST_AUTO_TEST_CASE(rotary_attention_options_are_checked) {
  using dtrain::nn::RotaryAttention;
  BOOST_CHECK_THROW(RotaryAttention(16, 4, {.kv_heads = 3}), dtrain::config_error);
  BOOST_CHECK_THROW(RotaryAttention(12, 4, {.rope_theta = 10000.f}), dtrain::config_error);  // head_dim 3 is odd
  BOOST_CHECK_NO_THROW(RotaryAttention(12, 4, {.rope_theta = 0.f}));
  BOOST_TEST(RotaryAttention(16, 4, {.kv_heads = 1}).params()[1].shape[0] == 4);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gelu_mlp, T, t::dtypes) {
  t::check_unit<T>(dtrain::nn::GeluMLP(6, 10), mlp_reference(6, 10), 7, 6, true, {7, 1}, composite<T>(4));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(transformer_block, T, t::dtypes) {
  const SeqShape s{2, 4};
  t::check_unit<T>(dtrain::nn::TransformerBlock(8, 2), block_reference(8, 2, s), s.rows(), 8, true, s,
                   composite<T>(16));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(sandwich_block, T, t::dtypes) {
  const SeqShape s{2, 4};
  using dtrain::nn::LayerNorm;
  const auto ln = [] { return LayerNorm(8); };
  const dtrain::nn::SandwichBlock<LayerNorm, dtrain::nn::CausalSelfAttention, dtrain::nn::GeluMLP> block(
      8, ln(), dtrain::nn::CausalSelfAttention(8, 2), ln(), ln(), dtrain::nn::GeluMLP(8, 32), ln());
  t::check_unit<T>(block, t::sandwich_reference(8, 2, s), s.rows(), 8, true, s, composite<T>(24));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(positional_embedding, T, t::dtypes) {
  const SeqShape s{3, 4};
  t::check_unit<T>(dtrain::nn::PositionalEmbedding(6, 5), positional_reference(5, s), s.rows(), 5, true, s);
}

// Embedding: y = W[ids]; dW[v] = sum of dy over the rows holding v (exact in
// fp32 up to summation; ids repeat and some vocabulary rows are never used).
BOOST_AUTO_TEST_CASE(embedding_gathers_and_scatters) {
  dtrain::Host dev(1);
  const std::int64_t vocab = 7, dim = 3, rows = 10;
  dtrain::nn::Embedding emb(vocab, dim);
  std::mt19937_64 rng(3);
  const auto w = t::random_nonzero(static_cast<std::size_t>(vocab * dim), rng);
  const auto dy = t::random_nonzero(static_cast<std::size_t>(rows * dim), rng);
  const std::vector<std::int64_t> ids{3, 1, 3, 0, 6, 3, 1, 2, 2, 0};  // 4 and 5 unused
  const auto wb = t::upload<float>(dev, w), dyb = t::upload<float>(dev, dy);
  auto yb = dtrain::make_buffer<float>(dev, rows * dim), gb = dtrain::make_buffer<float>(dev, vocab * dim);
  dtrain::DeviceBatch batch;
  batch.set("x", dtrain::DeviceTensor{dtrain::element_type::i64,
                                      {2, 5},
                                      reinterpret_cast<const std::byte*>(ids.data()),
                                      reinterpret_cast<const std::byte*>(ids.data()),
                                      {}});
  const std::vector<dtrain::MatView<const float>> pv{{wb.data(), vocab, dim}};
  const std::vector<dtrain::MatView<float>> gv{{gb.data(), vocab, dim}};
  const dtrain::UnitContext<float> ctx{{2, 5}, {}};
  emb.forward<dtrain::Host, float>(dev, pv, batch, yb.view(rows, dim), ctx);
  emb.backward<dtrain::Host, float>(dev, pv, gv, batch, std::as_const(yb).view(rows, dim),
                                    std::as_const(dyb).view(rows, dim), ctx);
  std::vector<double> want_y, want_g(static_cast<std::size_t>(vocab * dim), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < dim; ++c) {
      const auto v = static_cast<std::size_t>(ids[static_cast<std::size_t>(r)]);
      want_y.push_back(w[v * dim + static_cast<std::size_t>(c)]);
      want_g[v * dim + static_cast<std::size_t>(c)] += dy[static_cast<std::size_t>(r * dim + c)];
    }
  t::expect_close(t::download<float>(dev, yb), want_y, 1e-7, "embedding forward");
  t::expect_close(t::download<float>(dev, gb), want_g, 1e-6, "embedding gradient");
  std::vector<std::int64_t> bad = ids;
  bad[4] = 7;
  batch.set("x", dtrain::DeviceTensor{dtrain::element_type::i64,
                                      {2, 5},
                                      reinterpret_cast<const std::byte*>(bad.data()),
                                      reinterpret_cast<const std::byte*>(bad.data()),
                                      {}});
  const auto forward = [&] { emb.forward<dtrain::Host, float>(dev, pv, batch, yb.view(rows, dim), ctx); };
  BOOST_CHECK_EXCEPTION(forward(), dtrain::config_error, [](const dtrain::config_error& e) {
    return std::string(e.what()).find("id 7 at position 4 is outside [0, 7)") != std::string::npos;
  });
}

// Gemma's embedding: each row of dy times the scale before the sums, and no
// gradient for the padding id's row (PyTorch's padding_idx), against float64.
BOOST_AUTO_TEST_CASE(embedding_gradient_scale_and_padding_idx) {
  dtrain::Host dev(1);
  const std::int64_t vocab = 5, dim = 3;
  const std::vector<std::int64_t> ids{0, 2, 0, 4, 2, 1};
  std::mt19937_64 rng(5);
  const auto dyd = t::random_nonzero(ids.size() * static_cast<std::size_t>(dim), rng);
  const std::vector<float> dy(dyd.begin(), dyd.end());
  std::vector<float> grad(static_cast<std::size_t>(vocab * dim), -1.f);
  dtrain::nn::detail::scatter_rows(dev, ids.data(), ids.size(), vocab, dy.data(), grad.data(), dim, 2.5f, 0);
  std::vector<double> want(grad.size(), 0.0);
  for (std::size_t r = 0; r < ids.size(); ++r)
    for (std::int64_t c = 0; c < dim; ++c)
      if (ids[r] != 0)
        want[static_cast<std::size_t>(ids[r] * dim + c)] += 2.5 * dy[r * static_cast<std::size_t>(dim) + c];
  t::expect_close(std::vector<double>(grad.begin(), grad.end()), want, 1e-6, "scaled gradient without the padding id");
}

// The host's by-rows forms of the embeddings' gradients (a table row per
// index, its columns in groups of math::lanes) have the bits of the element forms the
// GPU runs (an index per table element), in every dtype: rows wider than a
// group with a tail, ids repeated many times, most of the vocabulary unused.
BOOST_AUTO_TEST_CASE_TEMPLATE(embedding_gradients_by_rows_have_the_bits_of_the_element_forms, T, t::dtypes) {
  dtrain::Host dev(2);
  const std::int64_t vocab = 40, dim = 150, rows = 96;
  std::mt19937_64 rng(11);
  std::vector<std::int64_t> ids(rows);
  for (auto& id : ids) id = static_cast<std::int64_t>(rng() % 9) * 3;  // 9 of 40 ids, each about 11 times
  std::vector<std::int64_t> index(static_cast<std::size_t>(vocab) + 1 + static_cast<std::size_t>(rows), 0);
  std::int64_t* offsets = index.data();
  std::int64_t* order = index.data() + vocab + 1;
  for (const auto id : ids) ++offsets[id + 1];
  for (std::int64_t v = 0; v < vocab; ++v) offsets[v + 1] += offsets[v];
  std::vector<std::int64_t> next(offsets, offsets + vocab);
  for (std::int64_t r = 0; r < rows; ++r) order[next[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)])]++] = r;
  std::vector<T> dy;
  for (const double v : t::random_nonzero(static_cast<std::size_t>(rows * dim), rng))
    dy.push_back(T(static_cast<float>(v)));
  std::vector<T> by_elements(static_cast<std::size_t>(vocab * dim)), by_rows(by_elements.size());
  dev.for_each(by_elements.size(), dtrain::EmbeddingScatter<T>{offsets, order, dy.data(), by_elements.data(), dim});
  dev.for_each(static_cast<std::size_t>(vocab),
               dtrain::EmbeddingScatter<T>{offsets, order, dy.data(), by_rows.data(), dim, true});
  BOOST_TEST_REQUIRE(std::memcmp(by_rows.data(), by_elements.data(), by_rows.size() * sizeof(T)) == 0);
  // And both are the float64 sums, to the dtype's rounding.
  std::vector<double> want(by_rows.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < dim; ++c)
      want[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)] * dim + c)] +=
          static_cast<float>(dy[static_cast<std::size_t>(r * dim + c)]);
  std::vector<double> got;
  for (const T v : by_rows) got.push_back(static_cast<float>(v));
  t::expect_close(got, want, std::is_same_v<T, float> ? 1e-5 : 2e-2, "embedding gradient by rows");

  // The positional table's gradient (PositionGrad): rows past the sequence
  // length are zero; rows 0..time-1 sum the batch in order.
  const std::int64_t max_len = 40, batch = 4, time = 24;
  std::vector<T> pos_dy;
  for (const double v : t::random_nonzero(static_cast<std::size_t>(batch * time * dim), rng))
    pos_dy.push_back(T(static_cast<float>(v)));
  std::vector<T> pos_elements(static_cast<std::size_t>(max_len * dim)), pos_rows(pos_elements.size());
  dev.for_each(pos_elements.size(), dtrain::PositionGrad<T>{pos_dy.data(), pos_elements.data(), batch, time, dim});
  dev.for_each(static_cast<std::size_t>(max_len),
               dtrain::PositionGrad<T>{pos_dy.data(), pos_rows.data(), batch, time, dim, true});
  BOOST_TEST_REQUIRE(std::memcmp(pos_rows.data(), pos_elements.data(), pos_rows.size() * sizeof(T)) == 0);
  std::vector<double> pos_want(pos_rows.size(), 0.0), pos_got;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t r = 0; r < time; ++r)
      for (std::int64_t c = 0; c < dim; ++c)
        pos_want[static_cast<std::size_t>(r * dim + c)] +=
            static_cast<float>(pos_dy[static_cast<std::size_t>((b * time + r) * dim + c)]);
  for (const T v : pos_rows) pos_got.push_back(static_cast<float>(v));
  t::expect_close(pos_got, pos_want, std::is_same_v<T, float> ? 1e-5 : 2e-2, "position gradient by rows");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(losses)

// Token cross-entropy with an ignore index: ignored rows add nothing to the
// loss, the gradient or the count.
BOOST_AUTO_TEST_CASE(cross_entropy_ignores_targets) {
  dtrain::Host dev(1);
  const std::int64_t rows = 5, classes = 4;
  std::mt19937_64 rng(9);
  const auto z = t::random_nonzero(static_cast<std::size_t>(rows * classes), rng);
  const std::vector<std::int32_t> labels{2, -100, 0, -100, 3};
  dtrain::Batch host;
  host.set("y", dtrain::HostTensor::of(labels, {1, rows}));
  dtrain::nn::SoftmaxCrossEntropy loss;
  BOOST_TEST(loss.count(host) == 3.0);
  dtrain::Host::buffer<std::int32_t> storage;
  const auto batch = t::label_batch(dev, labels, storage);
  const auto zb = t::upload<float>(dev, z);
  auto dz = dtrain::make_buffer<float>(dev, z.size());
  const double sum = loss.forward<dtrain::Host, float>(dev, std::as_const(zb).view(rows, classes), batch);
  loss.backward<dtrain::Host, float>(dev, std::as_const(zb).view(rows, classes), batch, dz.view(rows, classes), 0.5f);
  std::vector<double> kept_z;
  std::vector<std::int32_t> kept;
  for (std::int64_t r = 0; r < rows; ++r)
    if (labels[static_cast<std::size_t>(r)] != -100) {
      kept.push_back(labels[static_cast<std::size_t>(r)]);
      kept_z.insert(kept_z.end(), z.begin() + r * classes, z.begin() + (r + 1) * classes);
    }
  BOOST_TEST(sum == t::cross_entropy_reference(kept_z, kept, classes), boost::test_tools::tolerance(1e-5));
  const auto d = t::download<float>(dev, dz);
  for (std::int64_t c = 0; c < classes; ++c) {
    BOOST_TEST(d[static_cast<std::size_t>(classes + c)] == 0.0);
    BOOST_TEST(d[static_cast<std::size_t>(3 * classes + c)] == 0.0);
  }
  const auto fd = t::finite_difference(
      [&](const std::vector<double>& v) {
        std::vector<double> kz;
        for (std::int64_t r = 0; r < rows; ++r)
          if (labels[static_cast<std::size_t>(r)] != -100)
            kz.insert(kz.end(), v.begin() + r * classes, v.begin() + (r + 1) * classes);
        return 0.5 * t::cross_entropy_reference(kz, kept, classes);
      },
      z);
  t::expect_close(d, fd, 1e-5, "token cross-entropy gradient");
}

// MSE and L1 (means over every element, optionally weighted per row) against
// float64 and finite differences.
using RegressionKinds = std::tuple<dtrain::nn::MseKind, dtrain::nn::L1Kind>;
BOOST_AUTO_TEST_CASE_TEMPLATE(regression_losses, Kind, RegressionKinds) {
  dtrain::Host dev(1);
  const std::int64_t rows = 4, width = 3;
  std::mt19937_64 rng(4);
  const auto pred = t::random_nonzero(static_cast<std::size_t>(rows * width), rng);
  const auto target_d = t::random_nonzero(static_cast<std::size_t>(rows * width), rng);
  const std::vector<float> target(target_d.begin(), target_d.end()), weight{0.5f, 2.f, 1.f, 0.25f};
  const auto f = [&](const std::vector<double>& p, bool weighted) {
    double s = 0;
    for (std::int64_t i = 0; i < rows * width; ++i) {
      const double d = p[static_cast<std::size_t>(i)] - target[static_cast<std::size_t>(i)];
      const double l = std::is_same_v<Kind, dtrain::nn::MseKind> ? d * d : std::abs(d);
      s += weighted ? weight[static_cast<std::size_t>(i / width)] * l : l;
    }
    return s;
  };
  for (bool weighted : {false, true}) {
    dtrain::Batch host;
    host.set("y", dtrain::HostTensor::of(target, {rows, width}));
    host.set("w", dtrain::HostTensor::of(weight, {rows}));
    dtrain::nn::RegressionLoss<Kind> loss("y", weighted ? "w" : "");
    BOOST_TEST(loss.count(host) == (weighted ? 3.75 * width : static_cast<double>(rows * width)));
    dtrain::DeviceBatch batch;
    for (const auto& [name, ht] : host.tensors)
      batch.set(name, dtrain::DeviceTensor{ht.type, ht.shape, ht.bytes.data(), ht.bytes.data(), {}});
    const auto pb = t::upload<float>(dev, pred);
    auto db = dtrain::make_buffer<float>(dev, pred.size());
    const double sum = loss.template forward<dtrain::Host, float>(dev, std::as_const(pb).view(rows, width), batch);
    loss.template backward<dtrain::Host, float>(dev, std::as_const(pb).view(rows, width), batch, db.view(rows, width),
                                                1.f);
    BOOST_TEST(sum == f(t::round_to<float>(pred), weighted), boost::test_tools::tolerance(1e-5));
    t::expect_close(
        t::download<float>(dev, db),
        t::finite_difference([&](const std::vector<double>& v) { return f(v, weighted); }, t::round_to<float>(pred)),
        1e-4, std::string(Kind::name) + " gradient");
  }
}

BOOST_AUTO_TEST_SUITE_END()
