// The process the kill -9 test kills: two ranks (threads) train a model of a
// few MB under FSDP and save checkpoints after every step, keeping the
// newest two, until killed. Prints "saved <step>" after each commit.
//   checkpoint_save_loop <checkpoint dir>
#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "save_loop_model.hpp"
#include <support/ranks.hpp>

#include <dtrain/trainer.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_save_loop <dir>\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  dtrain::testing::run_ranks(2, [&](dtrain::World& w) {
    dtrain::testing::SaveLoopNet net;
    dtrain::Trainer<dtrain::testing::SaveLoopNet, dtrain::Device<dtrain::Host>,
                    dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>>
        t(w, net, dtrain::AdamW{.lr = 1e-3f}, {.seed = 1});
    // Four saves per step (numbered by save, not by step): saving is most of
    // the loop's time, so most random kills land inside one. With one save
    // per step, 1 kill in 20 did on 2 cores and none of 20 on a 16-core machine.
    std::int64_t saves = 0;
    for (int s = 0;; ++s) {
      t.step(std::vector<dtrain::Batch>{dtrain::testing::save_loop_batch(s, w.rank())});
      for (int k = 0; k < 4; ++k) {
        t.save(dtrain::checkpoint_path(dir, ++saves));
        if (w.rank() != 0) continue;
        dtrain::prune_checkpoints(dir, 2);
        std::printf("saved %lld\n", static_cast<long long>(saves));
        std::fflush(stdout);
      }
    }
  });
}
