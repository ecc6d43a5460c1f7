// expect: dtrain: the strategy class does not model dtrain::TrainingStrategy<S, T>
#include <dtrain/trainer.hpp>

using namespace dtrain;

struct Net {
  nn::Linear fc{2, 2};
  nn::MSELoss loss;
  auto units() { return std::tie(fc); }
};

struct MyKind {
  static constexpr std::string_view name = "mine";
};

// A strategy class with only its constructor: every hook is missing.
template <class Dev, class T, class R>
struct Incomplete {
  Incomplete(const StrategyContext<Dev>&, const NoStrategyOptions&) {}
};

template <class Dev, class T, class R>
struct dtrain::strategy_impl<MyKind, Dev, T, R> {
#ifdef DTRAIN_CONTROL
  using type = DdpStrategy<Dev, T, R>;
#else
  using type = Incomplete<Dev, T, R>;
#endif
};

[[maybe_unused]] void train(World& world) {
  Net net;
  Trainer<Net, Strategy<MyKind>> trainer(world, net, SGD{.lr = 0.1f});
}
