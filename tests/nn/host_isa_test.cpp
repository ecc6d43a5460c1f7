// Host::for_each runs every functor loop at the widest vector level the
// processor has (backend/host/device_isa.hpp). The units whose kernels reduce rows
// in lanes or columns in groups (LayerNorm, RMSNorm, Linear's bias, the
// causal softmax with and without a padding mask, cross-entropy) and the
// GELU that shares its exp, checked at every level this machine runs against
// the float64 references and finite differences of nn_test, on widths that
// fill whole groups of math::lanes and widths that leave a tail.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/backend/host/device_isa.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/kernels/math.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/rms_norm.hpp"

namespace t = dtrain::testing;
using dtrain::host_isa;

namespace {

std::vector<host_isa> levels_here() {
  std::vector<host_isa> out;
  for (const host_isa isa : {host_isa::baseline, host_isa::avx2, host_isa::avx512})
    if (static_cast<int>(isa) <= static_cast<int>(dtrain::detail::widest_host_isa())) out.push_back(isa);
  return out;
}

// Runs `check` once per level, then restores the level the process had.
template <class F>
void at_every_level(F check) {
  const host_isa before = dtrain::current_host_isa();
  for (const host_isa isa : levels_here()) {
    BOOST_TEST_CONTEXT("host level " << dtrain::host_isa_name(isa)) {
      dtrain::set_host_isa(isa);
      check();
    }
  }
  dtrain::set_host_isa(before);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(host_levels)

BOOST_AUTO_TEST_CASE(levels_are_named_and_checked) {
  BOOST_TEST(!levels_here().empty());
  BOOST_TEST(static_cast<int>(dtrain::current_host_isa()) <= static_cast<int>(dtrain::detail::widest_host_isa()));
  // A level above the processor's is refused, naming the widest.
  if (dtrain::detail::widest_host_isa() != host_isa::avx512)
    BOOST_CHECK_EXCEPTION(dtrain::set_host_isa(host_isa::avx512), dtrain::config_error,
                          [](const dtrain::config_error& e) {
                            return std::string(e.what()).find("widest level is") != std::string::npos;
                          });
  // DTRAIN_HOST_ISA is read through host_isa_from_env: a wrong value names the accepted ones.
  ::setenv("DTRAIN_HOST_ISA", "sse9", 1);
  BOOST_CHECK_EXCEPTION(dtrain::detail::host_isa_from_env(), dtrain::config_error, [](const dtrain::config_error& e) {
    const std::string m = e.what();
    return m.find("sse9") != std::string::npos && m.find("baseline, avx2 or avx512") != std::string::npos;
  });
  ::setenv("DTRAIN_HOST_ISA", "baseline", 1);
  BOOST_TEST(std::string(dtrain::host_isa_name(dtrain::detail::host_isa_from_env())) == "baseline");
  ::unsetenv("DTRAIN_HOST_ISA");
  BOOST_TEST(std::string(dtrain::host_isa_name(dtrain::detail::host_isa_from_env())) ==
             dtrain::host_isa_name(dtrain::detail::widest_host_isa()));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(row_and_column_reductions, T, t::dtypes) {
  at_every_level([] {
    for (const std::int64_t width : {std::int64_t{37}, std::int64_t{48}}) {
      BOOST_TEST_CONTEXT("width " << width) {
        t::check_unit<T>(dtrain::nn::LayerNorm(width), t::layer_norm_reference(width, 1e-5), 19, width);
        t::check_unit<T>(dtrain::nn::RMSNorm(width), t::rms_norm_reference(width, 1e-6), 19, width);
        t::check_unit<T>(dtrain::nn::Linear(9, width), t::linear_reference(9, width, true), 21, 9);
        t::check_unit<T>(dtrain::nn::GELU{}, t::gelu_reference(), 3, width);
      }
    }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(causal_softmax_with_and_without_padding, T, t::dtypes) {
  // time 37: rows whose causal span ends inside, at and past a lane group
  const std::int64_t time = 37, heads = 2, batch = 2;
  std::mt19937_64 rng(11);
  const std::vector<double> scores = t::round_to<T>(t::random_nonzero(batch * heads * time * time, rng, 4.0));
  std::vector<std::int32_t> mask(static_cast<std::size_t>(batch * time), 1);
  for (std::int64_t j = 0; j < 5; ++j) mask[static_cast<std::size_t>(j)] = 0;           // left padding
  for (std::int64_t j = 20; j < 23; ++j) mask[static_cast<std::size_t>(time + j)] = 0;  // a hole
  at_every_level([&] {
    for (const bool padded : {false, true}) {
      BOOST_TEST_CONTEXT((padded ? "padded" : "causal only")) {
        std::vector<T> att(scores.size());
        for (std::size_t i = 0; i < att.size(); ++i) att[i] = T(static_cast<float>(scores[i]));
        dtrain::Host dev(1);
        const auto rows = static_cast<std::size_t>(batch * heads * time);
        if (padded)
          dev.for_each(rows, dtrain::CausalSoftmax<T, std::int32_t>{att.data(), time, mask.data(), heads});
        else
          dev.for_each(rows, dtrain::CausalSoftmax<T>{att.data(), time});
        std::vector<double> got(att.size());
        for (std::size_t i = 0; i < att.size(); ++i) got[i] = static_cast<double>(static_cast<float>(att[i]));
        t::expect_close(got,
                        t::masked_softmax_reference(scores, time, heads, padded ? mask : std::vector<std::int32_t>{}),
                        t::forward_tol<T>, "probabilities");
      }
    }
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(cross_entropy_over_lane_groups, T, t::dtypes) {
  at_every_level([] {
    const std::int64_t rows = 6, classes = 37;
    const float scale = 0.5f;
    std::mt19937_64 rng(13);
    const std::vector<double> z = t::round_to<T>(t::random_nonzero(rows * classes, rng, 3.0));
    const std::vector<std::int32_t> labels{0, 36, 16, 31, 5, 32};
    dtrain::Host dev(1);
    const auto [loss, dlogits] = t::run_loss<T>(dev, z, labels, classes, scale);
    BOOST_TEST(loss == t::cross_entropy_reference(z, labels, classes), boost::test_tools::tolerance(1e-5));
    const auto scaled = [&](const std::vector<double>& v) {
      return scale * t::cross_entropy_reference(v, labels, classes);
    };
    t::expect_close(dlogits, t::finite_difference(scaled, z), t::backward_tol<T>, "dlogits");
  });
}

BOOST_AUTO_TEST_CASE(attention_at_every_level) {
  // The host's in-place head layout (leading dimension 3 dim), time 37
  const dtrain::SeqShape s{2, 37};
  at_every_level([&] {
    t::check_unit<float>(dtrain::nn::CausalSelfAttention(16, 2), t::attention_reference(16, 2, s), s.rows(), 16, true,
                         s);
  });
}

BOOST_AUTO_TEST_SUITE_END()
