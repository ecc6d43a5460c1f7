// dtrain::ParamEma (run/ema.hpp) against a float64 reference of diffusers'
// EMAModel rule, on UnevenNet (tests/strategy/common.hpp: units of uneven
// sizes, so FSDP's shards cut through parameters; a frozen layer) with
// random non-zero data, 6 AdamW steps, an update every 2nd step (decay 0.5, so the
// warm-up's k / (9 + k) is what acts: 2/11, then 3/12): at 1 rank under DDP
// and at 2 ranks under FSDP FullShard the average equals the reference
// within 1e-6 of each parameter's largest value; frozen parameters are not
// averaged; save then load continues the same average (values and update
// count); load_params puts the average into the model. Bad options are
// refused.
#define BOOST_TEST_MODULE ema
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "strategy/common.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/run/ema.hpp>
#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;
namespace fs = std::filesystem;

namespace {

// The reference: diffusers' rule over the parameters after each due step.
std::map<std::string, std::vector<double>> reference(const std::vector<Params>& after, double decay,
                                                     std::int64_t every) {
  std::map<std::string, std::vector<double>> ema;
  std::int64_t k = 0;
  for (std::size_t s = 0; s < after.size(); ++s) {
    if ((static_cast<std::int64_t>(s) + 1) % every != 0) continue;
    const double d = ++k == 1 ? 0.0 : std::min(decay, static_cast<double>(k) / (9.0 + static_cast<double>(k)));
    for (const auto& [name, p] : after[s]) {
      auto& e = ema[name];
      if (e.empty()) e.assign(p.begin(), p.end());
      for (std::size_t i = 0; i < p.size(); ++i) e[i] -= (1.0 - d) * (e[i] - p[i]);
    }
  }
  return ema;
}

template <class Kind>
void averages_like_diffusers(int ranks) {
  const EmaOptions o{.decay = 0.5, .every = 2};
  const fs::path file = fs::temp_directory_path() / ("dtrain_ema_" + std::to_string(::getpid()) + ".safetensors");
  std::vector<Params> after;
  Params averaged, reloaded, loaded_into_model;
  std::int64_t reloaded_updates = 0;
  run_ranks(ranks, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<Kind>> t(w, net, AdamW{.lr = 5e-2f});
    ParamEma ema(o);
    for (std::int64_t s = 1; s <= 6; ++s) {
      t.step(micro_batches(static_cast<int>(s), w.rank(), {8}));
      const Params p = t.parameters();
      if (w.rank() == 0) after.push_back(p);
      if (ema.due(s)) ema.update(t);
    }
    ema.save(t, file);
    if (w.rank() == 0) averaged = ema.values();
    ParamEma again(o);
    again.load(t, file);
    if (w.rank() == 0) reloaded = again.values();
    reloaded_updates = again.updates();
    t.load_params(file, {.strict = false});
    const Params p = t.parameters();
    if (w.rank() == 0) loaded_into_model = p;
  });
  fs::remove(file);
  const auto want = reference(after, o.decay, o.every);
  BOOST_TEST(!averaged.contains("3.weight"), "the frozen layer (unit 3) is not averaged");
  BOOST_TEST_REQUIRE(averaged.size() == want.size() - 2);  // all but the frozen layer's weight and bias
  double worst = 0;
  for (const auto& [name, got] : averaged) {
    const std::vector<double>& e = want.at(name);
    double scale = 1e-30, diff = 0;
    for (std::size_t i = 0; i < e.size(); ++i) {
      scale = std::max(scale, std::abs(e[i]));
      diff = std::max(diff, std::abs(got[i] - e[i]));
    }
    worst = std::max(worst, diff / scale);
    BOOST_TEST(diff <= 1e-6 * scale, name << ": " << diff << " of " << scale);
    BOOST_TEST(reloaded.at(name) == got, name << " reloaded");
    BOOST_TEST(loaded_into_model.at(name) == got, name << " in the model");
  }
  BOOST_TEST(reloaded_updates == 3);
  BOOST_TEST_MESSAGE(ranks << " rank(s): the average within " << worst << " of the float64 reference");
}

}  // namespace

BOOST_AUTO_TEST_CASE(one_rank_ddp) { averages_like_diffusers<DDP>(1); }
BOOST_AUTO_TEST_CASE(two_ranks_fsdp) { averages_like_diffusers<FSDP<FullShard>>(2); }

BOOST_AUTO_TEST_CASE(decay_warm_up_and_refusals) {
  BOOST_TEST(ParamEma::decay_at(1, 0.9999) == 0.0);
  BOOST_TEST(ParamEma::decay_at(2, 0.9999) == 2.0 / 11.0);
  BOOST_TEST(ParamEma::decay_at(1000000, 0.9999) == 0.9999);
  BOOST_CHECK_THROW(ParamEma({.decay = 1.0}), config_error);
  BOOST_CHECK_THROW(ParamEma({.decay = 0.9, .every = 0}), config_error);
}
