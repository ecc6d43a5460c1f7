// nn::Dropout: the mask's statistics and scale against float64, the same
// mask in forward and backward, identity outside training; and through the
// Trainer, masks that depend on seed, rank, step and micro-batch only: the
// same training under DDP and FSDP, and a resumed run equal to an
// uninterrupted one.
#define BOOST_TEST_MODULE dropout
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>

#include "kernels/numeric.hpp"
#include "strategy/common.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/trainer.hpp>

using namespace dtrain;
using dtrain::testing::run_ranks;

namespace {

struct Run {
  std::vector<float> y, dx;
};

Run run(float p, bool training, std::uint64_t stream, const std::vector<float>& x, const std::vector<float>& dy,
        std::int64_t rows, std::int64_t cols) {
  Host dev(1);
  nn::Dropout unit(p);
  Run r{std::vector<float>(x.size()), std::vector<float>(x.size())};
  const UnitContext<float> ctx{{rows, 1}, {}, training, stream};
  const MatView<const float> xv{x.data(), rows, cols}, dyv{dy.data(), rows, cols};
  unit.forward<Host, float>(dev, {}, xv, {r.y.data(), rows, cols}, ctx);
  unit.backward<Host, float>(dev, {}, {}, xv, {r.y.data(), rows, cols}, dyv, {r.dx.data(), rows, cols}, ctx);
  return r;
}

std::vector<float> random_nonzero(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(0.5f, 2.f);
  std::vector<float> v(n);
  for (auto& e : v) e = (g() % 2 ? 1.f : -1.f) * u(g);
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(drops_p_of_the_elements_and_scales_the_rest) {
  const std::int64_t rows = 200, cols = 500;
  const auto x = random_nonzero(rows * cols, 1), dy = random_nonzero(rows * cols, 2);
  for (const float p : {0.1f, 0.3f, 0.5f}) {
    BOOST_TEST_CONTEXT("p = " << p) {
      const Run r = run(p, true, 77, x, dy, rows, cols);
      std::size_t dropped = 0;
      double worst = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const bool keep = dtrain::detail::uniform01(77, i) >= p;  // the documented mask
        const double want_y = keep ? static_cast<double>(x[i]) / (1.0 - p) : 0.0;
        const double want_dx = keep ? static_cast<double>(dy[i]) / (1.0 - p) : 0.0;
        worst = std::max({worst, std::abs(r.y[i] - want_y) / std::abs(want_y == 0 ? 1 : want_y),
                          std::abs(r.dx[i] - want_dx) / std::abs(want_dx == 0 ? 1 : want_dx)});
        dropped += keep ? 0 : 1;
      }
      BOOST_TEST(worst <= 2e-7);  // one rounding of x * (1 / (1 - p)) in fp32
      // 100,000 Bernoulli(p) draws: the dropped fraction is within 4 standard deviations.
      const double n = static_cast<double>(x.size()), frac = static_cast<double>(dropped) / n;
      BOOST_TEST(std::abs(frac - p) <= 4 * std::sqrt(p * (1 - p) / n), "dropped fraction " << frac);
    }
  }
}

BOOST_AUTO_TEST_CASE(streams_and_modes) {
  const auto x = random_nonzero(4000, 3), dy = random_nonzero(4000, 4);
  const Run a = run(0.5f, true, 11, x, dy, 40, 100), again = run(0.5f, true, 11, x, dy, 40, 100);
  const Run other = run(0.5f, true, 12, x, dy, 40, 100);
  BOOST_TEST((a.y == again.y));
  std::size_t same = 0;
  for (std::size_t i = 0; i < x.size(); ++i) same += (a.y[i] == 0) == (other.y[i] == 0) ? 1 : 0;
  BOOST_TEST(same < x.size() * 6 / 10, "another stream draws another mask (" << same << " of 4000 agree)");
  for (const Run& id : {run(0.5f, false, 11, x, dy, 40, 100), run(0.f, true, 11, x, dy, 40, 100)}) {
    BOOST_TEST((id.y == x));
    BOOST_TEST((id.dx == dy));
  }
  BOOST_CHECK_THROW(nn::Dropout(1.f), config_error);
  BOOST_CHECK_THROW(nn::Dropout(-0.1f), config_error);
}

namespace {

struct DropNet {
  explicit DropNet(float p) : drop(p) {}
  nn::Linear l1{dtrain::testing::features, 24};
  nn::GELU act;
  nn::Dropout drop;
  nn::Linear head{24, dtrain::testing::classes};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, act, drop, head); }
};

using Params = std::map<std::string, std::vector<float>>;

template <class Kind>
Params train(int steps, float p, const std::filesystem::path& save_at = {},
             const std::filesystem::path& load_from = {}) {
  Params out;
  run_ranks(2, [&](World& w) {
    DropNet net(p);
    Trainer<DropNet, Strategy<Kind>, Accumulate<2>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 5});
    if (!load_from.empty()) t.load(load_from);
    for (int s = static_cast<int>(t.steps_taken()); s < steps; ++s) {
      t.step(dtrain::testing::micro_batches(s, w.rank(), {3, 4}));
      if (s + 1 == 2 && !save_at.empty()) t.save(save_at);
    }
    Params p = t.parameters();
    if (w.rank() == 0) out = std::move(p);
  });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(trainer_masks_follow_seed_rank_step_and_micro_batch) {
  // FSDP reduces each micro-batch's gradient, DDP their sum: equal to fp32
  // rounding (1e-5, as the strategy tests state), while the masks move the
  // parameters by orders of magnitude more (against no dropout).
  const Params ddp = train<DDP>(4, 0.3f), fsdp = train<FSDP<FullShard>>(4, 0.3f), none = train<DDP>(4, 0.f);
  BOOST_TEST(dtrain::testing::max_rel_diff(fsdp, ddp) <= 1e-5, "the same masks under DDP and FSDP");
  BOOST_TEST(dtrain::testing::max_rel_diff(none, ddp) >= 1e-3, "the masks matter at this tolerance");
  const auto dir = std::filesystem::path(DTRAIN_TEST_BINARY_DIR) / "dropout_ckpt";
  std::filesystem::remove_all(dir);
  train<DDP>(2, 0.3f, dir);
  const Params resumed = train<DDP>(4, 0.3f, {}, dir);
  BOOST_TEST((resumed == ddp), "a resumed run draws the masks of an uninterrupted one");
}
