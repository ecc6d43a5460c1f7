#pragma once
// The model of checkpoint_save_loop (and of the test that loads what it
// saved): 1.3M fp32 parameters, so a checkpoint with AdamW state is ~16 MB
// and saving dominates each loop iteration (most kills land inside a save).

#include <cmath>
#include <cstdint>

#include <dtrain/trainer.hpp>

namespace dtrain::testing {

struct SaveLoopNet {
  nn::Linear a{256, 1024};
  nn::GELU act;
  nn::Linear b{1024, 1024};
  nn::GELU act2;
  nn::Linear head{1024, 10};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(a, act, b, act2, head); }
};

inline Batch save_loop_batch(int step, int rank) {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (std::int64_t i = 0; i < 8 * 256; ++i)
    x.push_back(std::sin(0.1f * static_cast<float>(i + 977 * step + 31 * rank)) + 0.05f);
  for (std::int64_t r = 0; r < 8; ++r) y.push_back(static_cast<std::int32_t>((r + step + rank) % 10));
  return Batch::table(x, y, 8, 256);
}

}  // namespace dtrain::testing
