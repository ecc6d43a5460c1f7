// Host functors with a span(begin, end) (backend/host/device_isa.hpp: row loops the
// host runs instead of one index at a time) must write exactly what their
// per-index operator() writes, the one a GPU runs: SwiGLU forward and
// backward, and the rotary attention's layout into the heads and back
// (rotated or not, grouped key/value heads, dims whose halves leave a
// tail). Checked bit for bit at every vector level this machine has, over
// whole ranges and over random pieces that start and end inside rows, as
// Host::for_each splits a range over threads.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device_isa.hpp"
#include "dtrain/core/view.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/rotary_attention.hpp"

using dtrain::host_isa;

namespace {

std::vector<float> random_values(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = u(rng);
    if (x == 0.f) x = 0.5f;
  }
  return v;
}

// The per-index loop at the current level: a wrapper without span.
template <class F>
struct Indices {
  F f;
  void operator()(std::size_t i) const { f(i); }
};

// The same functor's span, run by a loop of this translation unit: with
// separate compilation dtrain::runtime compiles the built-in functors' own
// loops (DTRAIN_INSTANTIATE_HOST_FOR_EACH) at its optimisation level, which
// may fuse multiply-adds differently; this compares the two ways of the
// functor's code under one compiler's flags.
template <class F>
struct Spans {
  F f;
  void operator()(std::size_t i) const { f(i); }
  void span(std::size_t begin, std::size_t end) { f.span(begin, end); }
};

// Runs `make(out)`'s functor over [0, n) both ways at every level; `out`
// is the buffer the functor writes (filled with a marker first).
template <class Make>
void check_span(std::size_t n, std::vector<float>& out, Make make, std::mt19937& rng) {
  const host_isa before = dtrain::current_host_isa();
  for (const host_isa isa : {host_isa::baseline, host_isa::avx2, host_isa::avx512}) {
    if (static_cast<int>(isa) > static_cast<int>(dtrain::detail::widest_host_isa())) continue;
    BOOST_TEST_CONTEXT("level " << dtrain::host_isa_name(isa)) {
      dtrain::set_host_isa(isa);
      std::fill(out.begin(), out.end(), -7.f);
      dtrain::detail::run_range(Indices<decltype(make())>{make()}, 0, n);
      const std::vector<float> want = out;
      // Whole, then in random pieces.
      std::fill(out.begin(), out.end(), -7.f);
      dtrain::detail::run_range(Spans<decltype(make())>{make()}, 0, n);
      BOOST_TEST(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0);
      std::fill(out.begin(), out.end(), -7.f);
      for (std::size_t begin = 0; begin < n;) {
        const std::size_t end = std::min(n, begin + 1 + rng() % 97);
        dtrain::detail::run_range(Spans<decltype(make())>{make()}, begin, end);
        begin = end;
      }
      BOOST_TEST(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)) == 0);
    }
  }
  dtrain::set_host_isa(before);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(host_span)

BOOST_AUTO_TEST_CASE(swiglu_forward_and_backward) {
  std::mt19937 rng(11);
  for (const std::int64_t hidden : {1, 7, 16, 45}) {
    const std::int64_t rows = 5;
    std::vector<float> x = random_values(static_cast<std::size_t>(rows * 2 * hidden), rng);
    std::vector<float> dy = random_values(static_cast<std::size_t>(rows * hidden), rng);
    std::vector<float> y(static_cast<std::size_t>(rows * hidden)), dx(x.size());
    const dtrain::MatView<const float> xv{x.data(), rows, 2 * hidden};
    const dtrain::MatView<const float> dyv{dy.data(), rows, hidden};
    BOOST_TEST_CONTEXT("hidden " << hidden) {
      check_span(
          y.size(), y,
          [&] {
            return dtrain::nn::detail::SwiGluForward<float>{xv, {y.data(), rows, hidden}};
          },
          rng);
      check_span(
          dy.size(), dx,
          [&] {
            return dtrain::nn::detail::SwiGluBackward<float>{xv, dyv, {dx.data(), rows, 2 * hidden}};
          },
          rng);
    }
  }
}

BOOST_AUTO_TEST_CASE(rotary_heads_both_ways) {
  std::mt19937 rng(12);
  struct Case {
    std::int64_t batch, time, heads, kv_heads, head_dim;
    bool rope;
  };
  for (const Case c : {Case{2, 5, 4, 2, 8, true}, Case{1, 3, 3, 3, 6, true}, Case{2, 4, 6, 1, 4, true},
                       Case{2, 3, 4, 2, 8, false}, Case{1, 2, 2, 1, 130, true}}) {
    const dtrain::nn::detail::GqaShape g{c.batch, c.time, c.heads, c.kv_heads, c.head_dim, c.rope};
    const std::int64_t rows = g.rows(), hd = g.head_dim, half = hd / 2;
    std::vector<float> q = random_values(static_cast<std::size_t>(rows * c.heads * hd), rng);
    std::vector<float> k = random_values(static_cast<std::size_t>(rows * c.kv_heads * hd), rng);
    std::vector<float> v = random_values(k.size(), rng);
    std::vector<float> cos_t = random_values(static_cast<std::size_t>(c.time * half), rng);
    std::vector<float> sin_t = random_values(cos_t.size(), rng);
    std::vector<float> heads(static_cast<std::size_t>(3 * g.head_elems()));
    BOOST_TEST_CONTEXT("B " << c.batch << " T " << c.time << " heads " << c.heads << "/" << c.kv_heads << " hd " << hd
                            << " rope " << c.rope) {
      check_span(
          heads.size(), heads,
          [&] {
            return dtrain::nn::detail::ToRotatedHeads<float>{
                g, q.data(), k.data(), v.data(), cos_t.data(), sin_t.data(), heads.data()};
          },
          rng);
      // Back: gradients in the head layout -> the three projections' rows,
      // written into one buffer (q rows, then k, then v).
      const std::vector<float> d_heads = random_values(heads.size(), rng);
      std::vector<float> back(q.size() + 2 * k.size());
      float* dq = back.data();
      float* dk = dq + q.size();
      float* dv = dk + k.size();
      check_span(
          static_cast<std::size_t>(rows * (c.heads + 2 * c.kv_heads) * hd), back,
          [&] {
            return dtrain::nn::detail::FromRotatedHeads<float>{g, d_heads.data(), cos_t.data(), sin_t.data(), dq, dk,
                                                               dv};
          },
          rng);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
