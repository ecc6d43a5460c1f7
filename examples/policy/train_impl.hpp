#pragma once
// train_policy's training function for one device, included by
// train_host.cpp and train_cuda.cu.

#include <cstdio>
#include <vector>

#include "common/dispatch.hpp"
#include "common/loop.hpp"
#include "policy.hpp"

namespace policy {

// The held-out action MSE against predicting the mean training chunk: each
// rank evaluates every world-size-th held-out sample.
template <class Trainer>
void evaluate(const DataSets& data, dtrain::World& world, Trainer& trainer) {
  std::vector<std::int64_t> mine;  // an equal share on every rank
  for (std::int64_t k = 0; k < data.held_out.size() / world.size(); ++k)
    mine.push_back(world.rank() + k * world.size());
  std::vector<dtrain::Batch> batches{data.held_out.gather(mine)};
  const double mse = trainer.evaluate(batches).loss;
  const auto chunk = static_cast<std::size_t>(data.train.chunk);
  std::vector<double> mean(chunk, 0.0);
  for (std::size_t i = 0; i < data.train.actions.size(); ++i) mean[i % chunk] += data.train.actions[i];
  for (auto& m : mean) m /= static_cast<double>(data.train.size());
  double baseline = 0.0;
  for (std::size_t i = 0; i < data.held_out.actions.size(); ++i)
    baseline += (data.held_out.actions[i] - mean[i % chunk]) * (data.held_out.actions[i] - mean[i % chunk]);
  baseline /= static_cast<double>(data.held_out.actions.size());
  if (world.rank() == 0)
    std::printf("eval: held-out action MSE %.5f (predicting the mean chunk: %.5f; %.1f%% of the variance explained)\n",
                mse, baseline, 100.0 * (1.0 - mse / baseline));
}

template <class Dev>
int train(const Config& c, dtrain::World& world, const DataSets& data) {
  return examples::with_precision(c, [&]<class Prec>() {
    Model model(c);
    return examples::run_training<Dev, Prec>(c, world, model, data.train,
                                             [&](auto& trainer) { evaluate(data, world, trainer); });
  });
}

}  // namespace policy
