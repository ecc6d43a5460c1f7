// expect: dtrain: Offload<ParamShards> needs a strategy that shards parameters (Strategy<FSDP<...>>); DDP and ZeRO1
// keep the whole model on every device: use Offload<OptimizerState> with them
#include <dtrain/trainer.hpp>

using namespace dtrain;

struct Net {
  nn::Linear fc{2, 2};
  nn::MSELoss loss;
  auto units() { return std::tie(fc); }
};

#ifdef DTRAIN_CONTROL
using Kind = FSDP<FullShard>;
#else
using Kind = DDP;
#endif

[[maybe_unused]] void train(World& world) {
  Net net;
  Trainer<Net, Strategy<Kind>, Offload<ParamShards>> trainer(world, net, SGD{.lr = 0.1f});
}
