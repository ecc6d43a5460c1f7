// nn::PreferenceLoss against a float64 reference written here: every loss
// type's value, TRL's metrics and the logits' gradient (central
// differences of the float64 loss) on random logits, random completions
// (a random prompt length and trailing padding per sequence) and random
// reference log-probabilities; and its refusals.
#include "dtrain/nn/preference_loss.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"

namespace {

using dtrain::nn::PreferenceLoss;
using dtrain::nn::PreferenceLossOptions;
using dtrain::nn::PreferenceLossType;

static_assert(dtrain::Loss<PreferenceLoss, dtrain::Host, float>);
static_assert(dtrain::Loss<PreferenceLoss, dtrain::Host, dtrain::bf16>);

constexpr std::int64_t pairs = 3, steps = 6, vocab = 9, seqs = 2 * pairs, rows = seqs * steps;

struct Case {
  std::vector<float> logits;          // [rows, vocab]
  std::vector<std::int32_t> targets;  // [seqs, steps]
  std::vector<double> ref;            // [seqs]
};

Case random_case(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> z(-2.f, 2.f);
  std::uniform_real_distribution<double> r(-14.0, -4.0);
  std::uniform_int_distribution<std::int32_t> token(0, vocab - 1);
  std::uniform_int_distribution<std::int64_t> prompt(1, 3), pad(0, 1);
  Case c;
  c.logits.resize(rows * vocab);
  for (float& v : c.logits) v = z(rng);
  c.targets.assign(rows, -100);
  for (std::int64_t s = 0; s < seqs; ++s) {
    const std::int64_t first = prompt(rng), end = steps - pad(rng);
    for (std::int64_t t = first; t < end; ++t) c.targets[s * steps + t] = token(rng);
  }
  for (std::int64_t s = 0; s < seqs; ++s) c.ref.push_back(r(rng));
  return c;
}

dtrain::DeviceBatch batch_of(const Case& c) {
  dtrain::DeviceBatch b;
  const auto* y = reinterpret_cast<const std::byte*>(c.targets.data());
  const auto* ref = reinterpret_cast<const std::byte*>(c.ref.data());
  b.set("y", dtrain::DeviceTensor{dtrain::element_type::i32, {seqs, steps}, y, y, "y"});
  b.set("ref_logps", dtrain::DeviceTensor{dtrain::element_type::f64, {seqs}, ref, ref, "ref_logps"});
  return b;
}

double log_sigmoid(double x) { return -std::log1p(std::exp(-x)); }

// The float64 loss summed over the pairs, with TRL's formulas.
double reference_loss(const PreferenceLossOptions& o, const std::vector<double>& z, const Case& c) {
  std::vector<double> logp(seqs, 0.0), n(seqs, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t y = c.targets[r];
    if (y == -100) continue;
    double mx = -1e300, s = 0;
    for (std::int64_t v = 0; v < vocab; ++v) mx = std::max(mx, z[r * vocab + v]);
    for (std::int64_t v = 0; v < vocab; ++v) s += std::exp(z[r * vocab + v] - mx);
    logp[r / steps] += z[r * vocab + y] - mx - std::log(s);
    n[r / steps] += 1;
  }
  double total = 0;
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double sc = logp[i] - c.ref[i], sr = logp[pairs + i] - c.ref[pairs + i], b = o.beta;
    switch (o.type) {
      case PreferenceLossType::sigmoid: total += -log_sigmoid(b * (sc - sr)); break;
      case PreferenceLossType::hinge: total += std::max(0.0, 1.0 - b * (sc - sr)); break;
      case PreferenceLossType::ipo: total += std::pow(sc / n[i] - sr / n[pairs + i] - 1.0 / (2.0 * b), 2.0); break;
      case PreferenceLossType::robust: {
        const double e = o.label_smoothing;
        total += (-(1.0 - e) * log_sigmoid(b * (sc - sr)) + e * log_sigmoid(-b * (sc - sr))) / (1.0 - 2.0 * e);
        break;
      }
    }
  }
  return total;
}

void check(const PreferenceLossOptions& o, std::uint32_t seed) {
  const Case c = random_case(seed);
  dtrain::Host dev(1);
  PreferenceLoss loss(o);
  const dtrain::DeviceBatch b = batch_of(c);
  const dtrain::MatView<const float> zv{c.logits.data(), rows, vocab};
  const std::vector<double> z(c.logits.begin(), c.logits.end());
  const double want = reference_loss(o, z, c);
  const double got = loss.forward<dtrain::Host, float>(dev, zv, b);
  BOOST_TEST_INFO(preference_loss_name(o.type) << " seed " << seed << ": " << got << " vs " << want);
  BOOST_TEST(std::abs(got - want) <= 1e-5 * std::max(1.0, std::abs(want)));

  const float scale = 0.37f;
  std::vector<float> dz(rows * vocab, 5.f);
  loss.backward<dtrain::Host, float>(dev, zv, b, {dz.data(), rows, vocab}, scale);
  double worst = 0, largest = 0;
  for (std::int64_t k = 0; k < rows * vocab; ++k) {
    std::vector<double> up = z, down = z;
    const double h = 1e-5;
    up[k] += h;
    down[k] -= h;
    const double fd = (reference_loss(o, up, c) - reference_loss(o, down, c)) / (2 * h) * scale;
    worst = std::max(worst, std::abs(fd - dz[k]));
    largest = std::max(largest, std::abs(fd));
  }
  BOOST_TEST_INFO(preference_loss_name(o.type) << " gradient: worst " << worst << " of " << largest);
  BOOST_TEST(largest > 1e-4);  // the pairs' gradients are not all zero
  BOOST_TEST(worst <= 1e-5 * largest);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(preference_loss)

// Float32 logits: the loss within 1e-5 (relative) and the gradient within
// 1e-5 of its largest element of the float64 reference.
BOOST_AUTO_TEST_CASE(sigmoid_matches_float64) {
  for (std::uint32_t seed : {1u, 2u}) check({.type = PreferenceLossType::sigmoid, .beta = 0.1f}, seed);
  check({.type = PreferenceLossType::sigmoid, .beta = 2.5f}, 3);
}
BOOST_AUTO_TEST_CASE(hinge_matches_float64) { check({.type = PreferenceLossType::hinge, .beta = 0.3f}, 4); }
BOOST_AUTO_TEST_CASE(ipo_matches_float64) {
  check({.type = PreferenceLossType::ipo, .beta = 0.1f}, 5);
  check({.type = PreferenceLossType::ipo, .beta = 1.5f}, 6);
}
BOOST_AUTO_TEST_CASE(robust_matches_float64) {
  check({.type = PreferenceLossType::robust, .beta = 0.2f, .label_smoothing = 0.1f}, 7);
}

// TRL's metrics: the rewards beta * (logp - ref) and their comparisons.
BOOST_AUTO_TEST_CASE(metrics_are_trls) {
  const Case c = random_case(11);
  dtrain::Host dev(1);
  PreferenceLoss loss({.beta = 0.5f});
  const dtrain::DeviceBatch b = batch_of(c);
  (void)loss.forward<dtrain::Host, float>(dev, {c.logits.data(), rows, vocab}, b);
  std::vector<double> logp(seqs, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    if (c.targets[r] == -100) continue;
    double s = 0;
    for (std::int64_t v = 0; v < vocab; ++v) s += std::exp(static_cast<double>(c.logits[r * vocab + v]));
    logp[r / steps] += c.logits[r * vocab + c.targets[r]] - std::log(s);
  }
  double rc = 0, rr = 0, acc = 0, lc = 0, lr = 0;
  for (std::int64_t i = 0; i < pairs; ++i) {
    const double a = 0.5 * (logp[i] - c.ref[i]), d = 0.5 * (logp[pairs + i] - c.ref[pairs + i]);
    rc += a;
    rr += d;
    acc += a > d;
    lc += logp[i];
    lr += logp[pairs + i];
  }
  const dtrain::nn::PreferenceSums s = loss.take_sums();
  BOOST_TEST(s.pairs == pairs);
  BOOST_TEST(s.rewards_chosen == rc, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(s.rewards_rejected == rr, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(s.accuracies == acc);
  BOOST_TEST(s.margins == rc - rr, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(s.logps_chosen == lc, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(s.logps_rejected == lr, boost::test_tools::tolerance(1e-5));
  BOOST_TEST(loss.sums().pairs == 0, "take_sums starts afresh");
}

BOOST_AUTO_TEST_CASE(bad_input_is_refused_by_name) {
  const auto says = [](std::string what) {
    return [what](const dtrain::config_error& e) { return std::string(e.what()).find(what) != std::string::npos; };
  };
  BOOST_CHECK_EXCEPTION(dtrain::nn::preference_loss_named("kto"), dtrain::config_error, says("'kto'"));
  BOOST_TEST((dtrain::nn::preference_loss_named("ipo") == PreferenceLossType::ipo));
  BOOST_CHECK_EXCEPTION(PreferenceLoss({.type = PreferenceLossType::sigmoid, .label_smoothing = 0.1f}),
                        dtrain::config_error, says("use loss_type robust"));
  BOOST_CHECK_EXCEPTION(PreferenceLoss({.type = PreferenceLossType::robust, .label_smoothing = 0.5f}),
                        dtrain::config_error, says("outside [0, 0.5)"));
  BOOST_CHECK_EXCEPTION(PreferenceLoss({.beta = 0.f}), dtrain::config_error, says("beta"));

  dtrain::Host dev(1);
  PreferenceLoss loss;
  Case c = random_case(21);
  for (std::int64_t t = 0; t < steps; ++t) c.targets[(pairs + 1) * steps + t] = -100;  // pair 1's rejected: empty
  const dtrain::MatView<const float> zv{c.logits.data(), rows, vocab};
  BOOST_CHECK_EXCEPTION(loss.forward<dtrain::Host>(dev, zv, batch_of(c)), dtrain::config_error,
                        says("rejected sequence of pair 1 has no completion token"));

  const Case ok = random_case(22);
  dtrain::DeviceBatch no_ref;
  const auto* y = reinterpret_cast<const std::byte*>(ok.targets.data());
  no_ref.set("y", dtrain::DeviceTensor{dtrain::element_type::i32, {seqs, steps}, y, y, "y"});
  const dtrain::MatView<const float> okv{ok.logits.data(), rows, vocab};
  BOOST_CHECK_EXCEPTION(loss.forward<dtrain::Host>(dev, okv, no_ref), dtrain::config_error, says("ref_logps"));
  dtrain::DeviceBatch odd;  // 5 sequences of 6 tokens (30 rows of the 36)
  odd.set("y", dtrain::DeviceTensor{dtrain::element_type::i32, {seqs - 1, steps}, y, y, "y"});
  const dtrain::MatView<const float> odd_v{ok.logits.data(), rows - steps, vocab};
  BOOST_CHECK_EXCEPTION(loss.forward<dtrain::Host>(dev, odd_v, odd), dtrain::config_error, says("an even batch size"));
  Case bad_ref = random_case(23);
  bad_ref.ref[2] = std::nan("");
  const dtrain::MatView<const float> bad_v{bad_ref.logits.data(), rows, vocab};
  const dtrain::DeviceBatch bad_b = batch_of(bad_ref);
  BOOST_CHECK_EXCEPTION(loss.forward<dtrain::Host>(dev, bad_v, bad_b), dtrain::config_error, says("sequence 2"));
  BOOST_TEST(loss.sums().pairs == 0, "nothing counted from refused batches");
}

BOOST_AUTO_TEST_SUITE_END()
