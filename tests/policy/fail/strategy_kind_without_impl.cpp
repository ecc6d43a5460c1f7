// expect: dtrain: could not build a strategy for these parameters: include the strategy's header
#include <dtrain/trainer.hpp>

using namespace dtrain;

struct Net {
  nn::Linear fc{2, 2};
  nn::MSELoss loss;
  auto units() { return std::tie(fc); }
};

// A kind tag nobody specialised strategy_impl for.
struct MyKind {
  static constexpr std::string_view name = "mine";
};

#ifdef DTRAIN_CONTROL
using Kind = DDP;
#else
using Kind = MyKind;
#endif

[[maybe_unused]] void train(World& world) {
  Net net;
  Trainer<Net, Strategy<Kind>> trainer(world, net, SGD{.lr = 0.1f});
}
