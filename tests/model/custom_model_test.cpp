// The documented custom unit and model (custom_model.hpp = docs/model.md):
// the unit's gradients against finite differences, the model trained by hand
// the way a strategy drives units (docs_test keeps docs/model.md in sync
// with the code).
#define BOOST_TEST_MODULE model
#include "model/custom_model.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/reference.hpp"
#include "nn/unit_harness.hpp"
#include "support/batches.hpp"
#include <boost/test/unit_test.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/kernels/optimizer.hpp"

#if DTRAIN_HAS_CUDA
#include "dtrain/backend/cuda/device.hpp"
static_assert(dtrain::Unit<FeatureGain, dtrain::Cuda, dtrain::bf16>);
#endif
static_assert(dtrain::Unit<FeatureGain, dtrain::Host, float>);
static_assert(dtrain::Unit<FeatureGain, dtrain::Host, dtrain::fp16>);

namespace {

namespace t = dtrain::testing;
using dtrain::Host;

// One unit's library-owned storage: parameters, gradients and their views.
struct UnitStorage {
  std::vector<Host::buffer<float>> params, grads;
  std::vector<dtrain::MatView<const float>> pv;
  std::vector<dtrain::MatView<float>> gv;
};

template <class U>
UnitStorage allocate_unit(Host& dev, const U& unit, std::mt19937_64& rng) {
  UnitStorage s;
  for (const auto& spec : unit.params()) {
    const auto n = static_cast<std::size_t>(spec.numel());
    auto& p = s.params.emplace_back(dtrain::make_buffer<float>(dev, n));
    std::uniform_real_distribution<float> uniform(spec.init.a, spec.init.b);
    for (float& v : p.span())
      v = spec.init.kind == dtrain::init_kind::uniform ? uniform(rng)
          : spec.init.kind == dtrain::init_kind::ones  ? 1.f
                                                       : 0.f;
    auto& g = s.grads.emplace_back(dtrain::make_buffer<float>(dev, n));
    s.pv.push_back(t::param_view<const float>(p.data(), spec));
    s.gv.push_back(t::param_view<float>(g.data(), spec));
  }
  return s;
}

// Calls f(unit, index) for every unit, first to last or last to first.
template <bool Reverse, class Tuple, class F>
void visit_units(Tuple&& units, F&& f) {
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<Tuple>>;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (f(std::get < Reverse ? n - 1 - I : I > (units), Reverse ? n - 1 - I : I), ...);
  }
  (std::make_index_sequence<n>{});
}

// Full-batch SGD on TinyClassifier, driving the units exactly as the unit
// contract says a strategy does. Returns the mean loss of every step.
std::vector<double> train_by_hand(TinyClassifier& model, const std::vector<float>& x,
                                  const std::vector<std::int32_t>& labels, int steps) {
  Host dev(1);
  std::mt19937_64 rng(5);
  auto units = model.units();
  constexpr std::size_t n_units = std::tuple_size_v<decltype(units)>;
  const auto rows = static_cast<std::int64_t>(labels.size());

  std::vector<UnitStorage> storage;
  std::vector<std::int64_t> width{4};
  visit_units<false>(units, [&](auto& u, std::size_t) {
    storage.push_back(allocate_unit(dev, u, rng));
    width.push_back(u.out_features(width.back()));
  });
  std::vector<Host::buffer<float>> act, dact;  // activations and their gradients, per boundary
  for (std::int64_t w : width) {
    act.push_back(dtrain::make_buffer<float>(dev, static_cast<std::size_t>(rows * w)));
    dact.push_back(dtrain::make_buffer<float>(dev, static_cast<std::size_t>(rows * w)));
  }
  dev.copy_from_host(act[0].data(), x.data(), x.size());
  const auto view = [&](std::vector<Host::buffer<float>>& b, std::size_t i) { return b[i].view(rows, width[i]); };

  Host::buffer<std::int32_t> label_storage;
  const dtrain::DeviceBatch batch = dtrain::testing::label_batch(dev, labels, label_storage);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    visit_units<false>(units, [&](auto& u, std::size_t i) {
      u.template forward<Host, float>(dev, storage[i].pv, view(act, i), view(act, i + 1));
    });
    const dtrain::MatView<const float> logits = view(act, n_units);
    losses.push_back(model.loss.forward<Host, float>(dev, logits, batch) / static_cast<double>(rows));
    // The loss normaliser (1 / rows) is folded into the loss gradient.
    model.loss.backward<Host, float>(dev, logits, batch, view(dact, n_units), 1.f / static_cast<float>(rows));
    visit_units<true>(units, [&](auto& u, std::size_t i) {
      u.template backward<Host, float>(dev, storage[i].pv, storage[i].gv, view(act, i), view(act, i + 1),
                                       view(dact, i + 1), i == 0 ? dtrain::MatView<float>{} : view(dact, i));
    });
    for (auto& s : storage)
      for (std::size_t p = 0; p < s.params.size(); ++p)
        dev.for_each(s.params[p].size(),
                     dtrain::SgdStep<>({.param = s.params[p].data(), .grad = s.grads[p].data()}, {.lr = 0.5f}));
  }
  return losses;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(custom_model)

BOOST_AUTO_TEST_CASE_TEMPLATE(custom_unit_gradients, T, t::dtypes) {
  const t::RefForward ref = [](const std::vector<std::vector<double>>& p, std::vector<double> x) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] *= p[0][i % p[0].size()];
    return x;
  };
  t::check_unit<T>(FeatureGain{5}, ref, 4, 5);
}

BOOST_AUTO_TEST_CASE(tiny_classifier_learns) {
  // Three classes separated by the sign pattern of a fixed linear map.
  std::mt19937_64 rng(6);
  std::normal_distribution<float> normal;
  const std::int64_t rows = 48;
  std::vector<float> x(static_cast<std::size_t>(rows * 4));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = &x[static_cast<std::size_t>(r * 4)];
    for (int c = 0; c < 4; ++c) row[c] = normal(rng);
    const float a = row[0] + row[1], b = row[2] - row[3];
    labels[static_cast<std::size_t>(r)] = a > 0 ? 0 : (b > 0 ? 1 : 2);
  }
  TinyClassifier model;
  const std::vector<double> losses = train_by_hand(model, x, labels, 60);
  BOOST_TEST_INFO("initial loss " << losses.front() << ", final " << losses.back());
  BOOST_TEST(std::isfinite(losses.back()));
  BOOST_TEST(losses.back() < 0.25 * losses.front());
}

BOOST_AUTO_TEST_SUITE_END()
