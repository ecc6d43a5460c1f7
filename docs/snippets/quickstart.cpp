// The README's program, compiled and run by CTest (doc_quickstart, twice
// in one scratch folder): as one process it trains the MLP for 1000 steps
// with checkpoints and evaluations, and the second run finds it done; under
// dtrain-run it trains on every rank. The regions between the `[snippet:NAME]` markers are what the pages
// show; docs_test checks the pages against them.
#include <cstdio>
#include <random>
#include <vector>

#include <dtrain/trainer.hpp>

// Stands for your data: labels from the signs of two of 32 features.
dtrain::Dataset load_dataset(std::int64_t rows = 8192, unsigned seed = 7) {
  dtrain::Dataset d{.x = {}, .y = {}, .rows = rows, .features = 32};
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  for (std::int64_t r = 0; r < d.rows; ++r) {
    for (int f = 0; f < 32; ++f) d.x.push_back(normal(gen));
    d.y.push_back((d.x[r * 32] > 0 ? 1 : 0) + (d.x[r * 32 + 1] > 0 ? 2 : 0));
  }
  return d;
}

// [snippet:quickstart]
#include <dtrain/run/fit.hpp>
#include <dtrain/trainer.hpp>

struct Mlp {  // your model: an ordered list of units + a loss
  dtrain::nn::Linear l1{32, 256};
  dtrain::nn::GELU act;
  dtrain::nn::Linear l2{256, 10};
  dtrain::nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, act, l2); }
};

void train(dtrain::World& world, const dtrain::Dataset& data, const dtrain::Dataset& held_out) {
  Mlp model;
  dtrain::Trainer<Mlp, dtrain::Precision<dtrain::bf16>, dtrain::Accumulate<4>> trainer{
      world,
      model,
      dtrain::AdamW{.lr = 3e-4f, .weight_decay = 0.1f},
      {.param_groups = {dtrain::no_decay_group()}}};  // no weight decay on biases and norms
  dtrain::fit(trainer, data, &held_out,               // forward, backward, bucketed all-reduce, AdamW, per step
              {.steps = 1000,
               .batch_size = 64,
               .checkpoint_dir = "ckpt",
               .save_every = 250,
               .keep_last = 2,
               .resume = "latest",  // run it again: it goes on from the newest checkpoint
               .eval_every = 250,
               .metrics = {dtrain::metrics::accuracy()},
               .log_every = 100,
               .metrics_file = "metrics.jsonl",
               .save_params = "model.safetensors"});
}
// [/snippet:quickstart]

// [snippet:quickstart_main]
int main() {
  auto world = dtrain::init();                          // rank/size from dtrain-run, torchrun, Slurm or Open MPI
  train(world, load_dataset(), load_dataset(1024, 8));  // yours: x [rows, 32] floats, y [rows] class ids
}
// [/snippet:quickstart_main]
