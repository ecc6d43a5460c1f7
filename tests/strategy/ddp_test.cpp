// DDP's correctness on the host path (N ranks equal one rank with all rows,
// replicas stay identical, accumulation, frozen parameters, mixed precision),
// with ranks as threads of this process over real Gloo communicators.
#define BOOST_TEST_MODULE strategy_ddp
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"
#include <boost/test/unit_test.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

// Uneven shapes (7x15, 16x15), a LayerNorm, and a frozen layer in the middle.
struct Net {
  nn::Linear l1{features, 15};
  nn::LayerNorm ln{15};
  nn::GELU act;
  nn::Linear frozen{15, 16, {.bias = true, .trainable = false}};
  nn::ReLU relu;
  nn::Linear head{16, classes};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, ln, act, frozen, relu, head); }
};

void require_close(const Params& a, const Params& b, double tol, const std::string& what) {
  require(a.size() == b.size(), what + ": different parameter sets");
  for (const auto& [name, va] : a) {
    const auto& vb = b.at(name);
    for (std::size_t i = 0; i < va.size(); ++i) {
      const double d = std::abs(static_cast<double>(va[i]) - vb[i]);
      require(
          d <= tol * std::max(1.0, std::abs(static_cast<double>(vb[i]))),
          what + ": " + name + "[" + std::to_string(i) + "] " + std::to_string(va[i]) + " vs " + std::to_string(vb[i]));
    }
  }
}

// Trains `steps` optimizer steps where rank r of n takes rows
// [r*B, (r+1)*B) of each step's global batch; returns every rank's parameters.
template <class... Ps, class Opt>
std::vector<Params> train_ranks(int n, std::int64_t per_rank, int steps, Opt opt) {
  std::vector<Params> out(static_cast<std::size_t>(n));
  run_ranks(n, [&](World& w) {
    Net net;
    Trainer<Net, Ps...> t(w, net, opt, {.seed = 42});
    for (int s = 0; s < steps; ++s) {
      const std::vector<Batch> mb{rows_of(s, w.rank() * per_rank, per_rank)};
      t.step(mb);
    }
    out[static_cast<std::size_t>(w.rank())] = t.parameters();
  });
  return out;
}

}  // namespace

// N ranks x B equals one rank x N*B, and replicas are identical.
BOOST_AUTO_TEST_CASE(n_ranks_times_b_equals_one_rank_times_nb) {
  for (int n : {2, 3}) {
    const auto sgd = SGD{.lr = 0.1f, .momentum = 0.9f};
    const auto single = train_ranks<Device<Host>>(1, 6 * n, 4, sgd);
    const auto multi = train_ranks<Device<Host>>(n, 6, 4, sgd);
    // fp32 sums in a different order: a few ulps per step, amplified by 4 steps of momentum SGD.
    require_close(multi[0], single[0], 2e-5, "SGD n=" + std::to_string(n));
    for (int r = 1; r < n; ++r) BOOST_TEST((multi[static_cast<std::size_t>(r)] == multi[0]));  // bit-identical replicas

    const auto adam = AdamW{.lr = 1e-2f};
    const auto single_a = train_ranks<Device<Host>>(1, 6 * n, 3, adam);
    const auto multi_a = train_ranks<Device<Host>>(n, 6, 3, adam);
    // Adam divides by sqrt(v): rounding differences in tiny gradients grow, so a looser bound.
    require_close(multi_a[0], single_a[0], 5e-4, "AdamW n=" + std::to_string(n));
  }
}

// One rank against an independent float64 implementation of the same model
// and optimizer (Linear-ReLU-Linear, softmax cross-entropy, SGD + momentum).
BOOST_AUTO_TEST_CASE(one_rank_matches_float64_reference) {
  struct Small {
    nn::Linear a{features, 9};
    nn::ReLU r;
    nn::Linear b{9, classes};
    nn::SoftmaxCrossEntropy loss;
    auto units() { return std::tie(a, r, b); }
  };
  run_ranks(1, [](World& w) {
    Small net;
    Trainer<Small, Device<Host>> t(w, net, SGD{.lr = 0.5f, .momentum = 0.9f}, {.seed = 3});
    auto p = t.parameters();
    std::map<std::string, std::vector<double>> ref, mom;
    for (auto& [k, v] : p) {
      ref[k].assign(v.begin(), v.end());
      mom[k].assign(v.size(), 0.0);
    }
    const int rows = 12;
    for (int s = 0; s < 5; ++s) {
      const Batch batch = rows_of(s, 0, rows);
      const struct {
        std::span<const float> x;
        std::span<const std::int32_t> y;
      } b{batch.at("x").values<float>(), batch.at("y").values<std::int32_t>()};
      t.step(std::vector<Batch>{batch});
      // float64 forward/backward of the mean cross-entropy.
      std::map<std::string, std::vector<double>> g;
      for (auto& [k, v] : ref) g[k].assign(v.size(), 0.0);
      auto& W1 = ref["0.weight"];
      auto& b1 = ref["0.bias"];
      auto& W2 = ref["2.weight"];
      auto& b2 = ref["2.bias"];
      for (int r = 0; r < rows; ++r) {
        std::vector<double> h(9), z(9), o(classes);
        for (int j = 0; j < 9; ++j) {
          z[j] = b1[j];
          for (int i = 0; i < features; ++i) z[j] += W1[j * features + i] * b.x[r * features + i];
          h[j] = z[j] > 0 ? z[j] : 0;
        }
        double mx = -1e300;
        for (int c = 0; c < classes; ++c) {
          o[c] = b2[c];
          for (int j = 0; j < 9; ++j) o[c] += W2[c * 9 + j] * h[j];
          mx = std::max(mx, o[c]);
        }
        double se = 0;
        for (int c = 0; c < classes; ++c) se += std::exp(o[c] - mx);
        std::vector<double> dz(9, 0.0);
        for (int c = 0; c < classes; ++c) {
          const double d = (std::exp(o[c] - mx) / se - (c == b.y[r] ? 1 : 0)) / rows;
          g["2.bias"][c] += d;
          for (int j = 0; j < 9; ++j) {
            g["2.weight"][c * 9 + j] += d * h[j];
            dz[j] += d * W2[c * 9 + j];
          }
        }
        for (int j = 0; j < 9; ++j) {
          if (z[j] <= 0) continue;
          g["0.bias"][j] += dz[j];
          for (int i = 0; i < features; ++i) g["0.weight"][j * features + i] += dz[j] * b.x[r * features + i];
        }
      }
      for (auto& [k, v] : ref)
        for (std::size_t i = 0; i < v.size(); ++i) {
          mom[k][i] = 0.9 * mom[k][i] + g[k][i];
          v[i] -= 0.5 * mom[k][i];
        }
    }
    const auto got = t.parameters();
    Params want;
    for (auto& [k, v] : ref) want[k].assign(v.begin(), v.end());
    require_close(got, want, 1e-4, "float64 reference");  // fp32 vs float64 over 5 steps
  });
}

// Accumulate<A> with unequal micro-batches equals one batch of all rows.
BOOST_AUTO_TEST_CASE(accumulation_equals_the_whole_batch) {
  const std::vector<std::int64_t> sizes{5, 3, 8, 2};
  for (int n : {1, 2}) {
    std::vector<Params> acc(static_cast<std::size_t>(n)), whole(static_cast<std::size_t>(n));
    run_ranks(n, [&](World& w) {
      Net a, b;
      Trainer<Net, Device<Host>, Accumulate<4>> ta(w, a, AdamW{.lr = 1e-2f}, {.seed = 7});
      Trainer<Net, Device<Host>> tb(w, b, AdamW{.lr = 1e-2f}, {.seed = 7});
      const std::int64_t total = 18;
      for (int s = 0; s < 3; ++s) {
        std::vector<Batch> micro;
        std::int64_t first = w.rank() * total;
        for (auto k : sizes) {
          micro.push_back(rows_of(s, first, k));
          first += k;
        }
        ta.step(micro);
        tb.step(std::vector<Batch>{rows_of(s, w.rank() * total, total)});
      }
      acc[static_cast<std::size_t>(w.rank())] = ta.parameters();
      whole[static_cast<std::size_t>(w.rank())] = tb.parameters();
    });
    require_close(acc[0], whole[0], 5e-4, "accumulate n=" + std::to_string(n));
  }
}

// Frozen parameters get no update, no gradient memory, no communication.
BOOST_AUTO_TEST_CASE(frozen_parameters_are_untouched) {
  run_ranks(2, [](World& w) {
    Net net;
    Trainer<Net, Device<Host>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 1});
    const auto before = t.parameters();
    for (int s = 0; s < 3; ++s) t.step(std::vector<Batch>{rows_of(s, w.rank() * 4, 4)});
    const auto after = t.parameters();
    require(after.at("3.weight") == before.at("3.weight") && after.at("3.bias") == before.at("3.bias"),
            "frozen parameters changed");
    require(after.at("0.weight") != before.at("0.weight"), "trainable parameters did not change");
    // Gradient and optimizer storage cover trainable parameters only, and so do the buckets.
    const std::size_t frozen = 15 * 16 + 16;
    const std::size_t trainable = 7 * 15 + 15 + 15 + 15 + 16 * 5 + 5;
    require(t.layout().trainable_numel() == trainable && t.layout().frozen_numel() == frozen, "layout sizes");
    std::size_t bucketed = 0;
    for (const auto& b : t.layout().buckets({}, 4)) bucketed += b.size;
    require(bucketed == trainable, "frozen parameters were bucketed for communication");
  });
}

// fp16 overflow skips the step, lowers the scale, and leaves the
// parameters alone; good steps raise the scale again after the window.
BOOST_AUTO_TEST_CASE(fp16_overflow_skips_the_step_and_lowers_the_scale) {
  run_ranks(2, [](World& w) {
    Net net;
    TrainerOptions o{.seed = 5};
    o.loss_scale = {.initial = 1e12f, .growth = 2.f, .backoff = 0.5f, .window = 3};
    Trainer<Net, Device<Host>, Precision<fp16>> t(w, net, AdamW{.lr = 1e-2f}, o);
    const auto before = t.parameters();
    auto st = t.step(std::vector<Batch>{rows_of(0, w.rank() * 8, 8)});
    require(st.skipped && st.loss_scale == 5e11f, "an fp16 overflow must skip the step and halve the scale");
    require(t.parameters() == before, "a skipped step changed parameters");
    int s = 1;
    while (st.skipped && s < 60) st = t.step(std::vector<Batch>{rows_of(s++, w.rank() * 8, 8)});
    require(!st.skipped, "the scale never came down to a usable value");
    const float settled = st.loss_scale;
    for (int k = 0; k < 3; ++k) st = t.step(std::vector<Batch>{rows_of(s++, w.rank() * 8, 8)});
    require(st.skipped || st.loss_scale == 2 * settled, "the scale did not grow after the window of good steps");
    require(t.parameters() != before, "training never updated the parameters");
  });
}

// Reduction happens in the reduce dtype (bf16 here): the result
// is the fp32 sum of each rank's bf16-rounded gradient, rounded once to bf16.
BOOST_AUTO_TEST_CASE(grad_reducer_reduces_in_the_reduce_dtype) {
  const std::size_t n = 1000;
  run_ranks(3, [&](World& w) {
    Host dev;
    GlooCommunicator comm(w);
    const ModelLayout layout({{ParamSpec{"w", {10, 100}}}});
    auto grads = dtrain::testing::random_values(n, 11 + static_cast<std::uint64_t>(w.rank()));
    std::vector<float> g(grads.begin(), grads.end());
    GradReducer<Host, bf16> reducer(dev, comm, layout.buckets({}, 2), g.data(), n);
    reducer.unit_done(0);
    reducer.finish();
    for (std::size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < 3; ++r)
        want += static_cast<float>(
            bf16(static_cast<float>(dtrain::testing::random_values(n, 11 + static_cast<std::uint64_t>(r))[i])));
      require(g[i] == static_cast<float>(bf16(static_cast<float>(want))),
              "bf16 reduction mismatch at " + std::to_string(i));
    }
  });
}

BOOST_AUTO_TEST_CASE(different_models_fail_fast_naming_rank_and_parameter) {
  struct Wide {
    nn::Linear a;
    nn::SoftmaxCrossEntropy loss;
    auto units() { return std::tie(a); }
  };
  std::vector<std::string> errors(2);
  run_ranks(2, [&](World& w) {
    Wide net{nn::Linear(features, w.rank() == 1 ? 6 : classes), {}};
    try {
      Trainer<Wide, Device<Host>> t(w, net, AdamW{});
    } catch (const config_error& e) {
      errors[static_cast<std::size_t>(w.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    BOOST_TEST_INFO(e);
    BOOST_TEST(e.find("rank 1 built a different model") != std::string::npos);
    BOOST_TEST(e.find("0.weight [6x7]") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(wrong_micro_batch_count_is_a_config_error) {
  run_ranks(1, [](World& w) {
    Net net;
    Trainer<Net, Device<Host>, Accumulate<2>> t(w, net, AdamW{});
    dtrain::testing::require_throws<config_error>([&] { t.step(std::vector<Batch>{rows_of(0, 0, 4)}); });
  });
}

// Clipping by global norm: with plain SGD the update is exactly
// -lr * g * max_norm / (|g| + 1e-6), so its norm is lr * max_norm (to rounding).
BOOST_AUTO_TEST_CASE(gradient_clipping_bounds_the_update_norm) {
  run_ranks(2, [](World& w) {
    Net net;
    TrainerOptions o{.seed = 9};
    o.clip.max_norm = 0.01f;
    Trainer<Net, Device<Host>> t(w, net, SGD{.lr = 0.1f}, o);
    const auto before = t.parameters();
    const auto st = t.step(std::vector<Batch>{rows_of(0, w.rank() * 8, 8)});
    require(st.grad_norm > 0.1, "the test needs a gradient well above max_norm");
    const auto after = t.parameters();
    double sq = 0;
    for (const auto& [name, v] : after)
      for (std::size_t i = 0; i < v.size(); ++i) sq += std::pow(static_cast<double>(v[i]) - before.at(name)[i], 2);
    const double want = 0.1 * 0.01 * st.grad_norm / (st.grad_norm + 1e-6);
    // differences of fp32 parameters near 0.1-1 carry ~1e-8 absolute error each
    require(std::abs(std::sqrt(sq) - want) < 1e-4 * want + 1e-6,
            "update norm " + std::to_string(std::sqrt(sq)) + " is not lr * max_norm = " + std::to_string(want));
  });
}

// TrainerOptions::grad_norm = false skips the norm (NaN) without changing the
// step; clipping still computes it.
BOOST_AUTO_TEST_CASE(grad_norm_off_reports_nan_and_trains_identically) {
  run_ranks(2, [](World& w) {
    Net a, b, c;
    Trainer<Net, Device<Host>> with(w, a, SGD{.lr = 0.1f}, {.seed = 9});
    Trainer<Net, Device<Host>> without(w, b, SGD{.lr = 0.1f}, {.seed = 9, .grad_norm = false});
    TrainerOptions clipped{.seed = 9, .grad_norm = false};
    clipped.clip.max_norm = 1e6f;
    Trainer<Net, Device<Host>> clipping(w, c, SGD{.lr = 0.1f}, clipped);
    const std::vector<Batch> batch{rows_of(0, w.rank() * 8, 8)};
    const auto sa = with.step(batch), sb = without.step(batch), sc = clipping.step(batch);
    require(sa.grad_norm > 0 && std::isnan(sb.grad_norm), "grad_norm = false must report NaN");
    require(sc.grad_norm == sa.grad_norm, "clipping must still compute the norm");
    require(with.parameters() == without.parameters(), "skipping the norm must not change the step");
  });
}
