// The README's program, compiled and run by CTest (doc_quickstart, in a
// scratch folder): as one process it trains the MLP for 1000 steps, then
// saves a checkpoint and the parameters; under dtrain-run it trains on every
// rank. The regions between the `[snippet:NAME]` markers are what the pages
// show; docs_test checks the pages against them.
#include <cstdio>
#include <random>
#include <vector>

#include <dtrain/trainer.hpp>

// Stands for your data: labels from the signs of two of 32 features.
dtrain::Dataset load_dataset() {
  dtrain::Dataset d{.x = {}, .y = {}, .rows = 8192, .features = 32};
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  for (std::int64_t r = 0; r < d.rows; ++r) {
    for (int f = 0; f < 32; ++f) d.x.push_back(normal(gen));
    d.y.push_back((d.x[r * 32] > 0 ? 1 : 0) + (d.x[r * 32 + 1] > 0 ? 2 : 0));
  }
  return d;
}

// [snippet:quickstart]
#include <dtrain/trainer.hpp>

struct Mlp {                                     // your model: an ordered list of units + a loss
  dtrain::nn::Linear l1{32, 256};
  dtrain::nn::GELU act;
  dtrain::nn::Linear l2{256, 10};
  dtrain::nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, act, l2); }
};

void train(dtrain::World& world, const dtrain::Dataset& dataset, int steps) {
  Mlp model;
  dtrain::Trainer<Mlp, dtrain::Precision<dtrain::bf16>, dtrain::Accumulate<4>>
      trainer{world, model, dtrain::AdamW{.lr = 3e-4f}};
  dtrain::DistributedSampler sampler{dataset.rows, world, {.shuffle = true, .seed = 0}};
  dtrain::DataLoader loader{dataset, sampler, {.batch_size = 64}};
  for (int step = 0; step < steps; ++step) {
    std::vector<dtrain::Batch> micro{loader.next(), loader.next(), loader.next(), loader.next()};
    auto stats = trainer.step(micro);            // one optimizer step: forward, backward, bucketed all-reduce, AdamW
    if (world.rank() == 0 && step % 100 == 0) std::printf("step %d loss %.4f\n", step, stats.loss);
  }
  trainer.save("ckpt/step-final", {.sampler = &sampler});   // resumable at any world size and strategy
  trainer.save_params("model.safetensors");
}
// [/snippet:quickstart]

// [snippet:quickstart_main]
int main() {
  auto world = dtrain::init();                   // rank/size from dtrain-run, torchrun, Slurm or Open MPI
  train(world, load_dataset(), 1000);            // load_dataset: yours (x [rows, 32] floats, y [rows] class ids)
}
// [/snippet:quickstart_main]
