// Optimizers as rules (optim/config.hpp's Optimizer concept) run by
// FlatOptimizer with parameter groups: AdamW and Lion against float64
// references with per-element groups, a user's optimizer through the
// Trainer and every strategy, groups resolved against a model (no weight
// decay on biases and norms), and groups recorded in checkpoints.
#define BOOST_TEST_MODULE optimizer
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
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

namespace user {
// [snippet:user_optimizer]
// A user's optimizer, outside dtrain: sign descent with decoupled decay and
// no state (max_states 0), modelling dtrain::Optimizer and nothing else.
struct SignDescent {
  static constexpr std::string_view name = "sign_descent";
  static constexpr std::size_t max_states = 0;
  float lr = 1e-3f;
  float weight_decay = 0.f;
  struct coefficients {
    float lr, decay;
  };
  void validate() const {
    if (!(lr > 0)) throw config_error("SignDescent.lr must be > 0", "set .lr");
  }
  std::vector<std::string_view> state_names() const { return {}; }
  coefficients coefficients_for(const GroupHyper& h) const { return {h.lr, 1.f - h.lr * h.weight_decay}; }
  DTRAIN_HOST_DEVICE static void update(float& p, float g, float*, const coefficients& c) {
    p = p * c.decay - c.lr * (g > 0.f ? 1.f : g < 0.f ? -1.f : 0.f);
  }
};
static_assert(dtrain::Optimizer<SignDescent>);
// [/snippet:user_optimizer]
}  // namespace user

static_assert(Optimizer<AdamW> && Optimizer<SGD> && Optimizer<Lion>);

namespace {

// Random non-zero values in [-1, -0.05] u [0.05, 1].
std::vector<float> nonzero(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mag(0.05, 1.0);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((rng() & 1 ? 1 : -1) * mag(rng));
  return v;
}

struct Group {
  double lr_factor, weight_decay;
};

// Float64 AdamW (PyTorch's formulas) over the same steps.
void adamw_reference(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                     const std::vector<float>& g, const std::vector<std::uint8_t>& ids,
                     const std::vector<Group>& groups, double lr, int step, double scale) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const Group& gr = groups[ids[i]];
    const double l = lr * gr.lr_factor, gi = g[i] * scale;
    p[i] *= 1 - l * gr.weight_decay;
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    p[i] -= l / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
  }
}

void lion_reference(std::vector<double>& p, std::vector<double>& m, const std::vector<float>& g,
                    const std::vector<std::uint8_t>& ids, const std::vector<Group>& groups, double lr, double scale) {
  const double b1 = 0.9, b2 = 0.99;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const Group& gr = groups[ids[i]];
    const double l = lr * gr.lr_factor, gi = g[i] * scale;
    const double c = b1 * m[i] + (1 - b1) * gi;
    p[i] = p[i] * (1 - l * gr.weight_decay) - l * ((c > 0) - (c < 0));
    m[i] = b2 * m[i] + (1 - b2) * gi;
  }
}

double worst_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1e-3, std::abs(want[i])));
  return worst;
}

}  // namespace

// Three groups over 1000 elements in runs of random length, 5 steps with
// random gradients and a gradient scale. Tolerance: float32 against float64
// after 5 steps, 2e-5 relative (a few ulps per step through sqrt and
// division; Lion moves every element by exactly +-lr, so its error is
// rounding only).
BOOST_AUTO_TEST_CASE(grouped_adamw_and_lion_match_float64_references) {
  Host dev;
  const std::size_t n = 1000;
  std::vector<std::uint8_t> ids(n);
  std::mt19937_64 rng(5);
  for (std::size_t i = 0; i < n;) {
    const std::size_t run = 1 + rng() % 40;
    const auto id = static_cast<std::uint8_t>(rng() % 3);
    for (std::size_t k = 0; k < run && i < n; ++k) ids[i++] = id;
  }
  const std::vector<Group> groups{{1.0, 0.1}, {0.5, 0.0}, {2.0, 0.3}};
  std::vector<GroupRate> rates;
  for (const Group& g : groups) rates.push_back({static_cast<float>(g.lr_factor), static_cast<float>(g.weight_decay)});

  const std::vector<float> init = nonzero(n, 11);
  std::vector<float> pa = init, pl = init;
  std::vector<double> ra(init.begin(), init.end()), rl = ra, ma(n), va(n), ml(n);
  FlatOptimizer<Host> adam(dev, AdamW{.lr = 1e-2f}, n, rates, ids);
  FlatOptimizer<Host> lion(dev, Lion{.lr = 1e-3f}, n, rates, ids);
  BOOST_TEST(adam.state().size() == 2u);
  BOOST_TEST(lion.state().size() == 1u);
  BOOST_TEST(lion.name() == "lion");
  const float scale = 0.75f;
  for (int step = 1; step <= 5; ++step) {
    const std::vector<float> g = nonzero(n, 100 + static_cast<std::uint64_t>(step));
    adam.step<float>(pa.data(), g.data(), nullptr, {.lr = 1e-2f, .step = step, .grad_scale = scale});
    lion.step<float>(pl.data(), g.data(), nullptr, {.lr = 1e-3f, .step = step, .grad_scale = scale});
    adamw_reference(ra, ma, va, g, ids, groups, 1e-2, step, scale);
    lion_reference(rl, ml, g, ids, groups, 1e-3, scale);
  }
  BOOST_TEST(worst_rel(pa, ra) < 2e-5);
  BOOST_TEST(worst_rel(pl, rl) < 2e-5);
}

BOOST_AUTO_TEST_CASE(flat_optimizer_rejects_bad_groups) {
  Host dev;
  BOOST_CHECK_THROW(FlatOptimizer<Host>(dev, AdamW{}, 4, {{1.f, 0.f}}, {0, 0, 1, 0}), config_error);
  BOOST_CHECK_THROW(FlatOptimizer<Host>(dev, AdamW{}, 4, {{1.f, 0.f}, {1.f, 0.f}}, {0, 1}), config_error);
  BOOST_CHECK_THROW(FlatOptimizer<Host>(dev, Lion{.lr = -1.f}, 4), config_error);
}

namespace {

TrainerOptions grouped(std::vector<ParamGroup> groups) {
  TrainerOptions o{.seed = 3};
  o.param_groups = std::move(groups);
  return o;
}

}  // namespace

// UnevenNet's biases and LayerNorm go to no_decay; the frozen layer to no group.
BOOST_AUTO_TEST_CASE(groups_resolve_by_tag_glob_and_predicate) {
  std::size_t groups = 0;
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet> t(w, net, AdamW{.lr = 1e-3f, .weight_decay = 0.1f},
                         grouped({no_decay_group(), {.name = "head", .params = {"7.*"}, .lr = 5e-4f}}));
    const auto& g = t.param_groups();
    groups = g.size();
    require(g.size() == 3, "three groups");
    require(g[0].name == "default" && g[0].params == std::vector<std::string>{"0.weight", "5.weight"},
            "default group: the two trainable weights that are not the head's");
    require(g[1].params == std::vector<std::string>{"0.bias", "1.weight", "1.bias", "5.bias", "7.bias"},
            "no_decay: biases and the LayerNorm (the head's bias is taken by the first group that selects it)");
    require(g[1].weight_decay == 0.f && g[1].lr == 1e-3f, "no_decay keeps the lr");
    require(g[2].params == std::vector<std::string>{"7.weight"} && g[2].lr == 5e-4f && g[2].weight_decay == 0.1f,
            "head group");
    Trainer<UnevenNet> p(w, net, AdamW{},
                         grouped({{.name = "1d",
                                   .where = [](const ParamSlot& s) { return s.spec.shape.size() == 1; },
                                   .weight_decay = 0.f}}));
    require(p.param_groups()[1].params.size() == 5, "the predicate selects the five 1-D trainable parameters");
    require_throws<config_error>(
        [&] { Trainer<UnevenNet>(w, net, AdamW{}, grouped({{.name = "x", .params = {"*.gamma"}}})); });
    require_throws<config_error>([&] {
      Trainer<UnevenNet>(w, net, AdamW{}, grouped({no_decay_group(), no_decay_group()}));
    });
    require_throws<config_error>([&] { Trainer<UnevenNet>(w, net, AdamW{}, grouped({{.name = "empty"}})); });
    require_throws<config_error>(
        [&] { Trainer<UnevenNet>(w, net, AdamW{}, grouped({{.name = "neg", .params = {"*"}, .lr = -1.f}})); });
  });
  BOOST_TEST(groups == 3u);
}

// One AdamW step with weight decay 0.5 on everything, and the same with
// no_decay: the step from the same gradients differs exactly by the decay
// term p0 x lr x 0.5 on the no_decay parameters, and not at all elsewhere.
// Then every strategy at 2 ranks trains the grouped model as DDP does,
// bit for bit (the group of every element of a shard is the one of its
// parameter).
BOOST_AUTO_TEST_CASE(no_decay_group_skips_decay_exactly_on_its_parameters_under_every_strategy) {
  Params before, all, some;
  std::vector<std::string> no_decay;
  run_ranks(1, [&](World& w) {
    UnevenNet a, b;
    Trainer<UnevenNet> ta(w, a, AdamW{.lr = 1e-2f, .weight_decay = 0.5f}, {.seed = 3});
    Trainer<UnevenNet> tb(w, b, AdamW{.lr = 1e-2f, .weight_decay = 0.5f}, grouped({no_decay_group()}));
    before = ta.parameters();
    ta.step(micro_batches(0, 0, {6}));
    tb.step(micro_batches(0, 0, {6}));
    all = ta.parameters(), some = tb.parameters();
    no_decay = tb.param_groups()[1].params;
  });
  for (const auto& [name, p0] : before) {
    const bool exempt = std::find(no_decay.begin(), no_decay.end(), name) != no_decay.end();
    for (std::size_t i = 0; i < p0.size(); ++i) {
      const double diff = static_cast<double>(some.at(name)[i]) - all.at(name)[i];
      const double want = exempt ? p0[i] * 1e-2 * 0.5 : 0.0;
      BOOST_TEST(std::abs(diff - want) <= 1e-6 * (1 + std::abs(p0[i])), name << "[" << i << "]");
    }
  }

  const auto train = [](auto kind, auto optimizer) {
    using Kind = decltype(kind);
    Params out;
    run_ranks(2, [&](World& w) {
      UnevenNet net;
      TrainerCore<UnevenNet, Host, Precision<fp32>> t(
          w, net, optimizer, grouped({no_decay_group(), {.name = "l2", .params = {"5.weight"}, .lr = 3e-3f}}), 1,
          strategy_factory<Kind, Host, float, float>());
      for (int s = 0; s < 3; ++s) t.step(micro_batches(s, w.rank(), {4}));
      const Params p = t.parameters();
      if (w.rank() == 0) out = p;
    });
    return out;
  };
  const auto check_all = [&](auto optimizer) {
    const Params ddp = train(DDP{}, optimizer);
    const auto same = [&](auto kind) {
      BOOST_TEST((train(kind, optimizer) == ddp), decltype(kind)::name << " differs from DDP with parameter groups");
    };
    std::apply([&](auto... kind) { (same(kind), ...); }, builtin_strategies{});
  };
  check_all(AdamW{.lr = 1e-2f, .weight_decay = 0.1f});
  check_all(user::SignDescent{.lr = 1e-3f, .weight_decay = 0.1f});
}

// Lion, written against the public concept only, trains: the loss on a
// fixed batch falls to under half in 30 steps at 2 ranks under FSDP.
BOOST_AUTO_TEST_CASE(a_users_optimizer_trains_through_the_trainer) {
  double first = 0, last = 0;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<FSDP<FullShard>>> t(w, net, Lion{.lr = 1e-2f, .weight_decay = 0.1f},
                                                    grouped({no_decay_group()}));
    for (int s = 0; s < 30; ++s) {
      const auto st = t.step(micro_batches(0, w.rank(), {8}));
      if (w.rank() == 0 && s == 0) first = st.loss;
      if (w.rank() == 0 && s == 29) last = st.loss;
    }
  });
  BOOST_TEST(last < 0.5 * first, "Lion: loss " << first << " -> " << last);
}

// The index records the optimizer's name, state and groups; a load returns them.
BOOST_AUTO_TEST_CASE(checkpoints_record_the_groups) {
  const auto dir = std::filesystem::temp_directory_path() / ("dtrain_groups_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::size_t recorded = 0;
  run_ranks(2, [&](World& w) {
    UnevenNet a, b;
    Trainer<UnevenNet, Strategy<ZeRO1>> t(w, a, Lion{.lr = 1e-3f, .weight_decay = 0.2f}, grouped({no_decay_group()}));
    t.step(micro_batches(0, w.rank(), {4}));
    t.save(dir / "step-1");
    Trainer<UnevenNet> r(w, b, Lion{.lr = 1e-3f, .weight_decay = 0.2f}, grouped({no_decay_group()}));
    const CheckpointInfo info = r.load(dir / "step-1");
    if (w.rank() == 0) recorded = info.param_groups.size();
    require(info.optimizer == "lion" && info.optimizer_states == std::vector<std::string>{"exp_avg"}, "lion state");
    require(info.param_groups.size() == 2 && info.param_groups[1].name == "no_decay" &&
                info.param_groups[1].weight_decay == 0.f && info.param_groups[0].weight_decay == 0.2f &&
                info.param_groups[1].params == r.param_groups()[1].params,
            "groups recorded");
    require(t.parameters() == r.parameters(), "the resumed parameters");
  });
  std::filesystem::remove_all(dir);
  BOOST_TEST(recorded == 2u);
}
