// Tied parameters (ParamSpec::tied_to): one stored weight read by two units.
// Its gradient is the sum of both uses (checked against a float64
// reference), under every strategy, micro-batch count and activation
// checkpointing (checked against DDP), through a checkpoint saved at one
// world size and strategy and resumed at another, and a bad tie is a
// config_error naming the parameter.
#define BOOST_TEST_MODULE strategy_tied
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common.hpp"
#include "support/strategy_options.hpp"
#include <boost/test/unit_test.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

constexpr std::int64_t width = features;  // the tied weight is [7, 7]

// x -> Linear(W, b0) -> ReLU -> Linear(W tied, b2) -> ReLU -> Linear(head): W is used twice.
struct TiedNet {
  nn::Linear in{features, width};
  nn::ReLU r1;
  nn::Linear mid{width, width, {.tie_weight = "0.weight"}};
  nn::ReLU r2;
  nn::Linear head{width, classes};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(in, r1, mid, r2, head); }
};

template <class Kind, int A>
Params train(int n, int steps, int first_step, const std::vector<std::int64_t>& sizes, TrainerOptions o,
             const std::filesystem::path& load_from = {}, const std::filesystem::path& save_to = {}) {
  Params out;
  std::mutex mu;
  run_ranks(n, [&](World& w) {
    TiedNet net;
    Trainer<TiedNet, Device<Host>, Strategy<Kind>, Accumulate<A>> t(w, net, SGD{.lr = 0.5f, .momentum = 0.9f}, o,
                                                                    kind_options<Kind>(n == 3 ? 3 : 1));
    if (!load_from.empty()) t.load(load_from);
    for (int s = first_step; s < first_step + steps; ++s) t.step(micro_batches(s, w.rank(), sizes));
    if (!save_to.empty()) t.save(save_to);
    auto p = t.parameters();
    std::lock_guard lock(mu);
    if (w.rank() == 0) out = std::move(p);
  });
  return out;
}

}  // namespace

// The stored weight is named once and learns from both uses: plain SGD
// against a float64 forward and backward of the same network.
BOOST_AUTO_TEST_CASE(tied_gradient_is_the_sum_of_both_uses) {
  run_ranks(1, [](World& w) {
    TiedNet net;
    Trainer<TiedNet, Device<Host>> t(w, net, SGD{.lr = 0.5f}, {.seed = 5});
    std::map<std::string, std::vector<double>> ref;
    for (auto& [k, v] : t.parameters()) ref[k].assign(v.begin(), v.end());
    BOOST_TEST(ref.contains("0.weight"));
    BOOST_TEST(!ref.contains("2.weight"), "the tied weight must not be stored twice");
    BOOST_TEST(ref.contains("2.bias"));
    BOOST_TEST(t.layout().ties().size() == 1u);
    const int rows = 10;
    for (int s = 0; s < 4; ++s) {
      const Batch batch = rows_of(s, 0, rows);
      const auto x = batch.at("x").values<float>();
      const auto y = batch.at("y").values<std::int32_t>();
      t.step(std::vector<Batch>{batch});
      std::map<std::string, std::vector<double>> g;
      for (auto& [k, v] : ref) g[k].assign(v.size(), 0.0);
      const auto& W = ref["0.weight"];
      const auto &b0 = ref["0.bias"], &b2 = ref["2.bias"], &H = ref["4.weight"], &bh = ref["4.bias"];
      const int d = static_cast<int>(width);
      for (int r = 0; r < rows; ++r) {
        std::vector<double> z1(d), h1(d), z2(d), h2(d), o(classes);
        for (int j = 0; j < d; ++j) {
          z1[j] = b0[j];
          for (int i = 0; i < features; ++i) z1[j] += W[j * d + i] * x[r * features + i];
          h1[j] = z1[j] > 0 ? z1[j] : 0;
        }
        for (int j = 0; j < d; ++j) {
          z2[j] = b2[j];
          for (int i = 0; i < d; ++i) z2[j] += W[j * d + i] * h1[i];
          h2[j] = z2[j] > 0 ? z2[j] : 0;
        }
        double mx = -1e300, se = 0;
        for (int c = 0; c < classes; ++c) {
          o[c] = bh[c];
          for (int j = 0; j < d; ++j) o[c] += H[c * d + j] * h2[j];
          mx = std::max(mx, o[c]);
        }
        for (int c = 0; c < classes; ++c) se += std::exp(o[c] - mx);
        std::vector<double> dh2(d, 0.0), dz2(d), dh1(d, 0.0);
        for (int c = 0; c < classes; ++c) {
          const double dl = (std::exp(o[c] - mx) / se - (c == y[r] ? 1 : 0)) / rows;
          g["4.bias"][c] += dl;
          for (int j = 0; j < d; ++j) {
            g["4.weight"][c * d + j] += dl * h2[j];
            dh2[j] += dl * H[c * d + j];
          }
        }
        for (int j = 0; j < d; ++j) {
          dz2[j] = z2[j] > 0 ? dh2[j] : 0;
          g["2.bias"][j] += dz2[j];
          for (int i = 0; i < d; ++i) {
            g["0.weight"][j * d + i] += dz2[j] * h1[i];  // the second use
            dh1[i] += dz2[j] * W[j * d + i];
          }
        }
        for (int j = 0; j < d; ++j) {
          if (z1[j] <= 0) continue;
          g["0.bias"][j] += dh1[j];
          for (int i = 0; i < features; ++i) g["0.weight"][j * d + i] += dh1[j] * x[r * features + i];  // the first
        }
      }
      for (auto& [k, v] : ref)
        for (std::size_t i = 0; i < v.size(); ++i) v[i] -= 0.5 * g[k][i];
    }
    const auto got = t.parameters();
    double worst = 0;
    std::string where;
    for (const auto& [k, v] : ref)
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double e = std::abs(got.at(k)[i] - v[i]) / std::max(1.0, std::abs(v[i]));
        if (e > worst) worst = e, where = k + "[" + std::to_string(i) + "]";
      }
    BOOST_TEST_MESSAGE("tied SGD vs float64 after 4 steps: max rel diff " << worst << " at " << where);
    BOOST_TEST(worst <= 1e-5, "tied weights vs float64: " << worst << " at " << where);  // fp32 over 4 steps
  });
}

namespace {

template <class Kind>
void matches_ddp() {
  const std::vector<std::int64_t> one{6}, two{5, 2};
  for (int n : {1, 2, 3}) {
    for (bool recompute : {false, true}) {
      const TrainerOptions o{.seed = 9, .activation_checkpointing = recompute};
      const double d1 = max_rel_diff(train<Kind, 1>(n, 3, 0, one, o), train<DDP, 1>(n, 3, 0, one, o));
      const double d2 = max_rel_diff(train<Kind, 2>(n, 3, 0, two, o), train<DDP, 2>(n, 3, 0, two, o));
      BOOST_TEST(d1 <= 1e-5, Kind::name << " n=" << n << " recompute=" << recompute << " A=1: " << d1);
      BOOST_TEST(d2 <= 1e-5, Kind::name << " n=" << n << " recompute=" << recompute << " A=2: " << d2);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(fsdp_full_shard_matches_ddp) { matches_ddp<FSDP<FullShard>>(); }
BOOST_AUTO_TEST_CASE(fsdp_shard_grad_op_matches_ddp) { matches_ddp<FSDP<ShardGradOp>>(); }
BOOST_AUTO_TEST_CASE(fsdp_no_shard_matches_ddp) { matches_ddp<FSDP<NoShard>>(); }
BOOST_AUTO_TEST_CASE(fsdp_hybrid_shard_matches_ddp) { matches_ddp<FSDP<HybridShard>>(); }
BOOST_AUTO_TEST_CASE(zero1_matches_ddp) { matches_ddp<ZeRO1>(); }

// Saved by FSDP at 2 ranks, resumed by ZeRO1 at 3: the same parameters as an
// uninterrupted DDP run over the same global batches.
BOOST_AUTO_TEST_CASE(checkpoint_reshards_a_tied_model) {
  const auto dir = std::filesystem::temp_directory_path() / ("dtrain_tied_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const TrainerOptions o{.seed = 11};
  train<FSDP<FullShard>, 1>(2, 2, 0, {3}, o, {}, dir);
  const Params resumed = train<ZeRO1, 1>(3, 2, 2, {2}, o, dir);
  const Params whole = train<DDP, 1>(1, 4, 0, {6}, o);
  std::filesystem::remove_all(dir);
  const double d = max_rel_diff(resumed, whole);
  BOOST_TEST_MESSAGE("tied model resharded 2 ranks fsdp-full -> 3 ranks zero1 vs 1 rank ddp: " << d);
  BOOST_TEST(d <= 1e-5);
}

namespace {

struct BadTie {
  std::string to;
  std::int64_t out = width;
  nn::Linear in{features, width};
  nn::Linear other;
  nn::SoftmaxCrossEntropy loss;
  BadTie(std::string t, std::int64_t o = width) : to(t), out(o), other(width, o, {.tie_weight = t}) {}
  auto units() { return std::tie(in, other); }
};

std::string error_of(const std::string& to, std::int64_t out = width) {
  std::string what;
  run_ranks(1, [&](World& w) {
    BadTie net(to, out);
    try {
      Trainer<BadTie, Device<Host>> t(w, net, SGD{.lr = 0.1f});
    } catch (const config_error& e) {
      what = e.what();
    }
  });
  return what;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_bad_tie_is_a_config_error_naming_it) {
  const std::string missing = error_of("0.gain");
  BOOST_TEST(missing.find("1.weight is tied to '0.gain'") != std::string::npos, missing);
  BOOST_TEST(missing.find("0.weight") != std::string::npos, missing);  // what unit 0 has
  const std::string later = error_of("3.weight");
  BOOST_TEST(later.find("later unit") != std::string::npos, later);
  const std::string shape = error_of("0.weight", classes);
  BOOST_TEST(shape.find("shape differs (7x7 vs 5x7)") != std::string::npos, shape);
  const std::string name = error_of("weight");
  BOOST_TEST(name.find("not a parameter name") != std::string::npos, name);
}

namespace {

// A unit that declares two tied parameters around a stored one (0.weight
// [7, 7], its own [3], 0.bias [7]) and checks that it is handed them in that
// order; forward passes x through, backward writes zero gradients.
struct TwoTies {
  std::vector<ParamSpec> params() const {
    return {{"w", {width, width}, Init::zeros(), true, "0.weight"},
            {"own", {3}, Init::ones()},
            {"b", {width}, Init::zeros(), true, "0.bias"}};
  }
  std::int64_t out_features(std::int64_t in) const { return in; }
  template <class T>
  static void check(UnitParams<const T> p) {
    require(p.size() == 3 && p[0].rows == width && p[0].cols == width && p[1].rows == 3 && p[2].rows == width &&
                p[2].cols == 1,
            "TwoTies got its parameters in another order");
  }
  template <class Dev, class T>
  void forward(Dev& dev, UnitParams<const T> p, MatView<const T> x, MatView<T> y) {
    check(p);
    dev.copy(y.data, x.data, static_cast<std::size_t>(x.size()));
  }
  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> g, MatView<const T>, MatView<const T>,
                MatView<const T> dy, MatView<T> dx) {
    check(p);
    for (const auto& v : g)
      if (!v.empty()) std::fill_n(v.data, v.size(), T{});  // host memory: the test runs on Host
    dev.copy(dx.data, dy.data, static_cast<std::size_t>(dy.size()));
  }
};

struct TwoTiesNet {
  nn::Linear in{features, width};
  TwoTies two;
  nn::Linear head{width, classes};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(in, two, head); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(several_ties_in_one_unit_keep_declaration_order) {
  run_ranks(1, [](World& w) {
    TwoTiesNet net;
    Trainer<TwoTiesNet, Device<Host>> t(w, net, SGD{.lr = 0.1f});
    BOOST_TEST(t.layout().ties().size() == 2u);
    t.step(micro_batches(0, 0, {4}));
    const auto p = t.parameters();
    BOOST_TEST(p.contains("1.own"));
    BOOST_TEST(!p.contains("1.w"));
    BOOST_TEST(!p.contains("1.b"));
  });
}
