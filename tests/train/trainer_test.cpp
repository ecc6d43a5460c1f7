// The Trainer itself (train/trainer.hpp): TrainerCore with a strategy chosen
// at run time trains exactly as Trainer<M, Strategy<K>, ...> with the same
// kind (the same code behind AnyStrategy, so bit-identical), for every
// built-in strategy; and its run-time arguments are checked.
#define BOOST_TEST_MODULE train
#include <boost/test/unit_test.hpp>

#include <dtrain/trainer.hpp>

#include <string>
#include <tuple>
#include <type_traits>

#include "strategy/common.hpp"
#include "support/ranks.hpp"

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
    BOOST_TEST(chosen.strategy_name() == Kind::name);
    BOOST_TEST(chosen.micro_batches() == 2);
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

}  // namespace

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
    BOOST_CHECK_EXCEPTION(Core(w, net, SGD{.lr = 0.1f}, {}, 1, StrategyFactory<Host, float>{}), config_error,
                          [](const config_error& e) {
                            return std::string(e.what()).find("empty StrategyFactory") != std::string::npos;
                          });
    BOOST_CHECK_EXCEPTION(Core(w, net, SGD{.lr = 0.1f}, {}, 1,
                               strategy_factory<FSDP<FullShard>, Host, float, float>({.prefetch = -1})),
                          config_error, [](const config_error& e) {
                            return std::string(e.what()).find("FsdpOptions::prefetch = -1") != std::string::npos;
                          });
  });
}
