// The documented custom loss, sequence unit and models (custom_sequence.hpp =
// docs/model.md): the sequence unit and the loss against float64 references
// and finite differences, and both models trained by a dtrain::Trainer on two
// ranks, the sequence model with and without activation checkpointing.
#include "nn/custom_sequence.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include "nn/unit_harness.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include <dtrain/trainer.hpp>

#if DTRAIN_HAS_CUDA
#include "dtrain/backend/cuda/device.hpp"
static_assert(dtrain::Unit<CausalMeanMix, dtrain::Cuda, dtrain::bf16>);
static_assert(dtrain::Loss<HuberLoss, dtrain::Cuda, dtrain::bf16>);
#endif
static_assert(dtrain::Unit<CausalMeanMix, dtrain::Host, dtrain::fp16>);
static_assert(dtrain::Loss<HuberLoss, dtrain::Host, dtrain::bf16>);

namespace {

namespace t = dtrain::testing;
using dtrain::SeqShape;
using Params = std::map<std::string, std::vector<float>>;

// y[b, t] = x[b, t] + gain * mean(x[b, 0..t]) in float64.
t::RefForward mean_mix_reference(SeqShape s) {
  return [=](const std::vector<std::vector<double>>& p, const std::vector<double>& x) {
    const auto width = static_cast<std::int64_t>(p[0].size());
    std::vector<double> y(x.size());
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t c = 0; c < width; ++c) {
        double sum = 0.0;
        for (std::int64_t tt = 0; tt < s.time; ++tt) {
          const auto i = static_cast<std::size_t>((b * s.time + tt) * width + c);
          sum += x[i];
          y[i] = x[i] + p[0][static_cast<std::size_t>(c)] * sum / static_cast<double>(tt + 1);
        }
      }
    return y;
  };
}

double huber_reference(const std::vector<double>& pred, const std::vector<double>& target, double delta) {
  double s = 0.0;
  for (std::size_t i = 0; i < pred.size(); ++i) {
    const double a = std::abs(pred[i] - target[i]);
    s += a <= delta ? 0.5 * a * a : delta * (a - 0.5 * delta);
  }
  return s;
}

// A host DeviceBatch over a host Batch: on Host the device pointer is the host one.
dtrain::DeviceBatch on_host(const dtrain::Batch& host) {
  dtrain::DeviceBatch b;
  for (const auto& [name, ht] : host.tensors)
    b.set(name, dtrain::DeviceTensor{ht.type, ht.shape, ht.bytes.data(), ht.bytes.data(), {}});
  return b;
}

// TinyRegressor's task: two smooth nonlinear functions of three features.
struct RegressionData {
  std::vector<float> x, y;
};

RegressionData regression_data(std::int64_t rows) {
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal;
  RegressionData d;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float a = normal(rng), b = normal(rng), c = normal(rng);
    d.x.insert(d.x.end(), {a, b, c});
    d.y.insert(d.y.end(), {std::sin(2.f * a) + b * c, std::abs(c) - 0.5f * a});
  }
  return d;
}

dtrain::Batch regression_rows(const RegressionData& d, std::int64_t first, std::int64_t rows) {
  dtrain::Batch b;
  b.set("x", dtrain::HostTensor::of(std::vector<float>(d.x.begin() + first * 3, d.x.begin() + (first + rows) * 3),
                                    {rows, 3}));
  b.set("y", dtrain::HostTensor::of(std::vector<float>(d.y.begin() + first * 2, d.y.begin() + (first + rows) * 2),
                                    {rows, 2}));
  return b;
}

// TinyRegressor's mean Huber loss over the data set in float64, from the
// parameters as the Trainer names them (units 0, 2 and 4 are the Linears).
double regressor_reference_loss(const Params& p, const RegressionData& d, double delta) {
  auto v = [&](const std::string& name) { return std::vector<double>(p.at(name).begin(), p.at(name).end()); };
  std::vector<double> h(d.x.begin(), d.x.end());
  h = t::linear_reference(3, 32, true)({v("0.weight"), v("0.bias")}, h);
  h = t::gelu_reference()({}, h);
  h = t::linear_reference(32, 32, true)({v("2.weight"), v("2.bias")}, h);
  h = t::gelu_reference()({}, h);
  h = t::linear_reference(32, 2, true)({v("4.weight"), v("4.bias")}, h);
  return huber_reference(h, std::vector<double>(d.y.begin(), d.y.end()), delta) / static_cast<double>(h.size());
}

// RunningMeanRegressor's task: per position, the running mean of the first
// input and the second input less its running mean. A model that sees one
// position at a time cannot fit it.
dtrain::Batch sequences(std::int64_t first, std::int64_t batch, std::int64_t time) {
  std::vector<float> x, y;
  for (std::int64_t b = first; b < first + batch; ++b) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(1000 + b));
    std::normal_distribution<float> normal;
    float sum0 = 0.f, sum1 = 0.f;
    for (std::int64_t tt = 0; tt < time; ++tt) {
      const float a = normal(rng), c = normal(rng);
      sum0 += a, sum1 += c;
      const float n = static_cast<float>(tt + 1);
      x.insert(x.end(), {a, c});
      y.insert(y.end(), {sum0 / n, c - sum1 / n});
    }
  }
  dtrain::Batch out;
  out.set("x", dtrain::HostTensor::of(x, {batch, time, 2}));
  out.set("y", dtrain::HostTensor::of(y, {batch, time, 2}));
  return out;
}

struct SequenceRun {
  std::vector<double> losses;
  Params params;
  std::size_t activations = 0;
};

// RunningMeanRegressor on 2 ranks, each with 8 sequences of 12 positions per step.
SequenceRun train_sequences(bool checkpointing, int steps) {
  SequenceRun out;
  t::run_ranks(2, [&](dtrain::World& w) {
    RunningMeanRegressor model;
    dtrain::TrainerOptions options{.seed = 5};
    options.activation_checkpointing = checkpointing;
    dtrain::Trainer<RunningMeanRegressor, dtrain::Device<dtrain::Host>> trainer(w, model, dtrain::AdamW{.lr = 1e-2f},
                                                                                options);
    const std::vector<dtrain::Batch> batch{sequences(w.rank() * 8, 8, 12)};
    std::vector<double> losses;
    std::size_t activations = 0;
    for (int s = 0; s < steps; ++s) {
      const dtrain::StepStats st = trainer.step(batch);
      t::require(st.count == 2.0 * 8 * 12 * 2, "MSELoss counts every target element of both ranks");
      losses.push_back(st.loss);
      if (s == 0) activations = st.memory.activations;
    }
    Params params = trainer.parameters();
    if (w.rank() == 0) out = {losses, params, activations};
  });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(custom_sequence)

// Forward against float64, input and gain gradients against finite
// differences, on 3 sequences of 4 positions (a unit mixing across
// sequences, or ignoring the time axis, fails).
BOOST_AUTO_TEST_CASE_TEMPLATE(causal_mean_mix, T, t::dtypes) {
  const SeqShape s{3, 4};
  t::check_unit<T>(CausalMeanMix{5}, mean_mix_reference(s), s.rows(), 5, true, s, std::is_same_v<T, float> ? 1.0 : 2.0);
}

// The Huber loss's sum, count and gradient against float64 and finite
// differences, with differences on both sides of delta.
BOOST_AUTO_TEST_CASE(huber_loss) {
  dtrain::Host dev(1);
  const std::int64_t rows = 6, width = 3;
  const double delta = 0.5;
  std::mt19937_64 rng(8);
  const auto pred = t::round_to<float>(t::random_nonzero(static_cast<std::size_t>(rows * width), rng));
  const auto target_d = t::random_nonzero(static_cast<std::size_t>(rows * width), rng);
  const std::vector<float> target(target_d.begin(), target_d.end());
  int inside = 0, outside = 0;
  for (std::size_t i = 0; i < pred.size(); ++i) (std::abs(pred[i] - target[i]) <= delta ? inside : outside) += 1;
  BOOST_TEST_REQUIRE((inside > 0 && outside > 0), "the case covers both branches");

  dtrain::Batch host;
  host.set("y", dtrain::HostTensor::of(target, {rows, width}));
  HuberLoss loss{.delta = static_cast<float>(delta)};
  BOOST_TEST(loss.count(host) == static_cast<double>(rows * width));
  const dtrain::DeviceBatch batch = on_host(host);
  const auto pb = t::upload<float>(dev, pred);
  auto db = dtrain::make_buffer<float>(dev, pred.size());
  const std::vector<double> tv(target.begin(), target.end());
  const double sum = loss.forward<dtrain::Host, float>(dev, std::as_const(pb).view(rows, width), batch);
  BOOST_TEST(sum == huber_reference(pred, tv, delta), boost::test_tools::tolerance(1e-6));
  loss.backward<dtrain::Host, float>(dev, std::as_const(pb).view(rows, width), batch, db.view(rows, width), 0.25f);
  t::expect_close(
      t::download<float>(dev, db),
      t::finite_difference([&](const std::vector<double>& v) { return 0.25 * huber_reference(v, tv, delta); }, pred),
      1e-5, "Huber gradient");

  // Targets of the wrong element type or size are refused.
  dtrain::Batch wrong;
  wrong.set(
      "y", dtrain::HostTensor::of(std::vector<std::int32_t>(static_cast<std::size_t>(rows * width), 1), {rows, width}));
  const dtrain::DeviceBatch wrong_type = on_host(wrong);
  const auto forward = [&](const dtrain::DeviceBatch& b, std::int64_t n) {
    return loss.forward<dtrain::Host, float>(dev, std::as_const(pb).view(n, width), b);
  };
  BOOST_CHECK_THROW(forward(wrong_type, rows), dtrain::config_error);
  BOOST_CHECK_THROW(forward(batch, rows - 1), dtrain::config_error);
}

// TinyRegressor and its Huber loss trained by the Trainer under DDP on 2
// ranks, 32 rows each: the first step's loss is the float64 loss of the
// initial parameters over both ranks' rows, and the loss falls to a small
// fraction of it.
BOOST_AUTO_TEST_CASE(tiny_regressor_learns_on_two_ranks) {
  const std::int64_t per_rank = 32;
  const int steps = 200;
  const RegressionData data = regression_data(2 * per_rank);
  Params initial;
  std::vector<double> losses;
  t::run_ranks(2, [&](dtrain::World& w) {
    TinyRegressor model;
    dtrain::Trainer<TinyRegressor, dtrain::Device<dtrain::Host>> trainer(w, model, dtrain::AdamW{.lr = 1e-2f},
                                                                         {.seed = 11});
    Params before = trainer.parameters();
    const std::vector<dtrain::Batch> batch{regression_rows(data, w.rank() * per_rank, per_rank)};
    std::vector<double> l;
    for (int s = 0; s < steps; ++s) {
      const dtrain::StepStats st = trainer.step(batch);
      t::require(st.count == 2.0 * per_rank * 2, "the Huber count summed over both ranks");
      l.push_back(st.loss);
    }
    if (w.rank() == 0) initial = std::move(before), losses = std::move(l);
  });
  BOOST_TEST(losses.front() == regressor_reference_loss(initial, data, 0.5), boost::test_tools::tolerance(1e-5));
  BOOST_TEST_MESSAGE("TinyRegressor Huber loss " << losses.front() << " -> " << losses.back());
  BOOST_TEST(std::isfinite(losses.back()));
  BOOST_TEST(losses.back() < 0.02 * losses.front());
}

// RunningMeanRegressor learns its task on 2 ranks; with activation
// checkpointing the losses and parameters are the same to the bit, and the
// two CausalMeanMix units share one saved buffer (fewer activation bytes).
BOOST_AUTO_TEST_CASE(running_mean_regressor_learns_and_checkpoints_exactly) {
  const int steps = 150;
  const SequenceRun keep = train_sequences(false, steps), recompute = train_sequences(true, steps);
  BOOST_TEST_MESSAGE("RunningMeanRegressor MSE " << keep.losses.front() << " -> " << keep.losses.back()
                                                 << "; activations " << keep.activations << " -> "
                                                 << recompute.activations << " bytes with checkpointing");
  BOOST_TEST(std::isfinite(keep.losses.back()));
  BOOST_TEST(keep.losses.back() < 0.02 * keep.losses.front());
  BOOST_TEST(keep.losses == recompute.losses, boost::test_tools::per_element());
  BOOST_TEST((keep.params == recompute.params), "activation checkpointing changed the parameters");
  BOOST_TEST(keep.params.at("1.gain") != std::vector<float>(16, 0.f));  // the mixing was learned
  // One mix unit's means: 16 sequences x 12 positions / 2 ranks x 16 floats.
  BOOST_TEST(keep.activations - recompute.activations == 8u * 12 * 16 * sizeof(float));
}

BOOST_AUTO_TEST_SUITE_END()
