// The Trainer itself (train/trainer.hpp): TrainerCore with a strategy chosen
// at run time trains exactly as Trainer<M, Strategy<K>, ...> with the same
// kind (the same code behind AnyStrategy, so bit-identical), for every
// built-in strategy; its run-time arguments are checked; and backward stops
// at the lowest unit with trainable parameters.
#define BOOST_TEST_MODULE train
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "strategy/common.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

template <class Kind>
void runtime_equals_compile_time() {
  Params runtime, fixed;
  run_ranks(2, [&](World& w) {
    UnevenNet a, b;
    const TrainerOptions o{.seed = 21};
    TrainerCore<UnevenNet, Host, Precision<bf16>> chosen(w, a, AdamW{.lr = 1e-2f}, o, 2,
                                                         strategy_factory<Kind, Host, bf16, float>());
    Trainer<UnevenNet, Device<Host>, Strategy<Kind>, Precision<bf16>, Accumulate<2>> typed(w, b, AdamW{.lr = 1e-2f}, o);
    // On a rank's thread: require, not Boost.Test's assertions (not thread-safe).
    require(chosen.strategy_name() == Kind::name, "strategy_name() differs from the kind's name");
    require(chosen.micro_batches() == 2, "micro_batches() != 2");
    for (int s = 0; s < 3; ++s) {
      chosen.step(micro_batches(s, w.rank(), {3, 4}));
      typed.step(micro_batches(s, w.rank(), {3, 4}));
    }
    const Params pa = chosen.parameters(), pb = typed.parameters();
    if (w.rank() == 0) runtime = pa, fixed = pb;
  });
  BOOST_TEST((runtime == fixed), Kind::name << ": the run-time choice trained differently");
  BOOST_TEST(!runtime.empty());
}

// nn::Linear counting the calls of its backward.
struct CountedLinear : nn::Linear {
  using nn::Linear::Linear;
  int backward_calls = 0;

  template <class Dev, class T>
  void backward(Dev& dev, UnitParams<const T> p, UnitParams<T> grad, MatView<const T> x, MatView<const T> y,
                MatView<const T> dy, MatView<T> dx, const UnitContext<T>& ctx) {
    ++backward_calls;
    nn::Linear::backward<Dev, T>(dev, p, grad, x, y, dy, dx, ctx);
  }
};

// Frozen units below the only trainable one, and one above it.
struct FrozenPrefixNet {
  CountedLinear below1{features, 6, {.trainable = false}};
  nn::GELU act;
  CountedLinear below2{6, 7, {.trainable = false}};
  CountedLinear trained{7, 8};
  nn::GELU act2;
  CountedLinear above{8, classes, {.trainable = false}};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(below1, act, below2, trained, act2, above); }
};

template <class Kind>
void backward_stops_at_the_lowest_trained_unit() {
  run_ranks(2, [&](World& w) {
    FrozenPrefixNet net;
    Trainer<FrozenPrefixNet, Strategy<Kind>, Accumulate<2>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 3});
    const Params before = t.parameters();
    for (int s = 0; s < 3; ++s) t.step(micro_batches(s, w.rank(), {3, 4}));
    const Params after = t.parameters();
    const std::string kind(Kind::name);
    require(net.below1.backward_calls == 0 && net.below2.backward_calls == 0,
            kind + ": a frozen unit below every trained one ran backward");
    require(net.trained.backward_calls == 6 && net.above.backward_calls == 6,
            kind + ": the trained unit and the one above it run backward once per micro-batch");
    for (const auto& [name, v] : before)
      require((v != after.at(name)) == name.starts_with("3."), kind + ": " + name + " (only unit 3 trains)");
  });
}

}  // namespace

// No gradient is wanted below the lowest unit with trainable parameters (a
// frozen vision tower under LLaVA's first stage): those units' backward is
// skipped, under bucketed DDP (whose last bucket ends at unit 0), FSDP and
// ZeRO-1.
BOOST_AUTO_TEST_CASE(backward_stops_at_the_lowest_unit_with_trainable_parameters) {
  backward_stops_at_the_lowest_trained_unit<DDP>();
  backward_stops_at_the_lowest_trained_unit<FSDP<FullShard>>();
  backward_stops_at_the_lowest_trained_unit<ZeRO1>();
}

BOOST_AUTO_TEST_CASE(a_strategy_chosen_at_run_time_trains_as_the_compile_time_one) {
  []<class... Kind>(std::type_identity<std::tuple<Kind...>>) {
    (runtime_equals_compile_time<Kind>(), ...);
  }(std::type_identity<builtin_strategies>{});
}

BOOST_AUTO_TEST_CASE(bad_run_time_arguments_are_config_errors) {
  run_ranks(1, [](World& w) {
    UnevenNet net;
    using Core = TrainerCore<UnevenNet, Host, Precision<fp32>>;
    BOOST_CHECK_EXCEPTION(Core(w, net, SGD{.lr = 0.1f}, {}, 0, strategy_factory<DDP, Host, float, float>()),
                          config_error, [](const config_error& e) {
                            return std::string(e.what()).find("micro-batch count is 0") != std::string::npos;
                          });
    BOOST_CHECK_EXCEPTION(
        Core(w, net, SGD{.lr = 0.1f}, {}, 1, StrategyFactory<Host, float>{}), config_error,
        [](const config_error& e) { return std::string(e.what()).find("empty StrategyFactory") != std::string::npos; });
    BOOST_CHECK_EXCEPTION(
        Core(w, net, SGD{.lr = 0.1f}, {}, 1, strategy_factory<FSDP<FullShard>, Host, float, float>({.prefetch = -1})),
        config_error, [](const config_error& e) {
          return std::string(e.what()).find("FsdpOptions::prefetch = -1") != std::string::npos;
        });
  });
}

// evaluate with metrics at 2 ranks (rank 0 four batches, rank 1 one),
// against float64 sums over predict()'s outputs of every
// batch at 1 rank: loss (softmax cross-entropy), accuracy and a user metric.
// Tolerance 1e-5 relative: fp32 outputs, sums in fp32 over ranks.
BOOST_AUTO_TEST_CASE(evaluate_gives_metrics_over_every_rank_and_predict_the_outputs) {
  std::vector<Batch> all;
  for (int b = 0; b < 5; ++b) all.push_back(rows_of(b, 0, 3 + b));
  double ref_loss = 0, ref_count = 0, ref_correct = 0, ref_user = 0;
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet> t(w, net, AdamW{}, {.seed = 4});
    for (const Batch& b : all) {
      const std::vector<float> out = t.predict(b);
      const auto y = b.at("y").values<std::int32_t>();
      require(out.size() == y.size() * classes, "predict: [rows, classes]");
      for (std::size_t r = 0; r < y.size(); ++r) {
        const float* row = out.data() + r * classes;
        double mx = row[0];
        std::size_t best = 0;
        for (std::size_t c = 1; c < classes; ++c)
          if (row[c] > row[best]) best = c;
        mx = row[best];
        double z = 0;
        for (std::size_t c = 0; c < classes; ++c) z += std::exp(row[c] - mx);
        ref_loss += std::log(z) + mx - row[y[r]];
        ref_count += 1;
        ref_correct += best == static_cast<std::size_t>(y[r]) ? 1 : 0;
        ref_user += row[0];
      }
    }
  });
  const Metric first_logit = [](const EvalBatch& e, MetricSums& s) {
    for (std::int64_t r = 0; r < e.rows; ++r) s.add("first_logit", e.row(r)[0]);
  };
  double accuracy = -1;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<FSDP<FullShard>>> t(w, net, AdamW{}, {.seed = 4});
    std::vector<Batch> mine;
    for (std::size_t b = 0; b < all.size(); ++b)
      if ((b < 4) == (w.rank() == 0)) mine.push_back(all[b]);
    const std::vector<Metric> metrics{metrics::accuracy(), first_logit};
    const EvalResult r = t.evaluate(mine, metrics);
    const auto close = [](double a, double b) { return std::abs(a - b) <= 1e-5 * std::max(1.0, std::abs(b)); };
    require(close(r.loss, ref_loss / ref_count), "loss " + std::to_string(r.loss));
    require(r.count == ref_count, "count");
    require(close(r.metrics.at("accuracy"), ref_correct / ref_count), "accuracy");
    if (w.rank() == 0) accuracy = r.metrics.at("accuracy");
    require(close(r.metrics.at("first_logit"), ref_user / ref_count), "user metric");
    require(close(r.perplexity(), std::exp(ref_loss / ref_count)), "perplexity");
    std::vector<Batch> none;
    require_throws<config_error>([&] { t.evaluate(none); });
  });
  BOOST_TEST(std::abs(accuracy - ref_correct / ref_count) <= 1e-6);
}

// metrics::mean_squared_error at 2 ranks (rank 0 four batches, rank 1 one)
// against a float64 sum over predict()'s outputs at 1 rank; the targets are
// random non-zero floats shaped like the output. Tolerance 1e-5 relative
// (fp32 outputs and sums). A target of another shape or type is a
// config_error naming it.
BOOST_AUTO_TEST_CASE(mean_squared_error_over_every_rank) {
  std::vector<Batch> all;
  for (int b = 0; b < 5; ++b) {
    const std::int64_t rows = 2 + b;
    Batch batch = rows_of(b, 0, rows);
    std::vector<float> target;
    for (double v : random_values(static_cast<std::size_t>(rows * classes), 7000 + static_cast<std::uint64_t>(b)))
      target.push_back(static_cast<float>(v));
    batch.set("t", HostTensor::of(target, {rows, classes}));
    all.push_back(std::move(batch));
  }
  double ref_sum = 0, ref_count = 0;
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet> t(w, net, AdamW{}, {.seed = 4});
    for (const Batch& b : all) {
      const std::vector<float> out = t.predict(b);
      const auto target = b.at("t").values<float>();
      require(out.size() == target.size(), "predict: [rows, classes]");
      for (std::size_t i = 0; i < out.size(); ++i) {
        const double d = static_cast<double>(out[i]) - static_cast<double>(target[i]);
        ref_sum += d * d;
        ref_count += 1;
      }
    }
    Batch wrong = all.front();
    wrong.set("t", HostTensor::of(std::vector<float>{1.5f, -2.0f}, {2}));
    const std::vector<Metric> on_t{metrics::mean_squared_error("t")}, on_y{metrics::mean_squared_error("y")};
    const std::vector<Batch> wrong_shape{wrong}, int_targets{all.front()};
    require_throws<config_error>([&] { t.evaluate(wrong_shape, on_t); });
    require_throws<config_error>([&] { t.evaluate(int_targets, on_y); });
  });
  BOOST_TEST(ref_sum > 0);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<DDP>> t(w, net, AdamW{}, {.seed = 4});
    std::vector<Batch> mine;
    for (std::size_t b = 0; b < all.size(); ++b)
      if ((b < 4) == (w.rank() == 0)) mine.push_back(all[b]);
    const std::vector<Metric> mse{metrics::mean_squared_error("t")};
    const EvalResult r = t.evaluate(mine, mse);
    const double want = ref_sum / ref_count;
    require(std::abs(r.metrics.at("mse") - want) <= 1e-5 * std::max(1.0, want),
            "mse " + std::to_string(r.metrics.at("mse")) + ", float64 reference " + std::to_string(want));
  });
}
