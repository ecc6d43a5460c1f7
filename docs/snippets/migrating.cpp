// docs/migrating.md's dtrain side, compiled into doc_snippets and run once
// (a few steps) by it.
#include <cstdio>
#include <filesystem>

#include "snippets.hpp"

#include <dtrain/run/fit.hpp>
#include <dtrain/trainer.hpp>

namespace {

// [snippet:migrating_model]
struct Classifier {                                       // class Classifier(nn.Module)
  dtrain::nn::Linear fc1{32, 256};                        //   self.fc1 = nn.Linear(32, 256)
  dtrain::nn::LayerNorm norm{256};                        //   self.norm = nn.LayerNorm(256)
  dtrain::nn::GELU act;                                   //   F.gelu in forward()
  dtrain::nn::Linear fc2{256, 10};                        //   self.fc2 = nn.Linear(256, 10)
  dtrain::nn::SoftmaxCrossEntropy loss;                   //   F.cross_entropy(logits, y)
  auto units() { return std::tie(fc1, norm, act, fc2); }  // forward(): the units in order
};
// [/snippet:migrating_model]

}  // namespace

int migrating_example(int steps, const dtrain::Dataset& train_set, const dtrain::Dataset& val_set) {
  std::filesystem::remove_all("out");
  // [snippet:migrating_main]
  auto world = dtrain::init();  // dist.init_process_group(); env from dtrain-run or torchrun
  Classifier model;             // FSDP(model, mixed_precision=bf16), accumulate 4 micro-batches:
  dtrain::Trainer<Classifier, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>, dtrain::Precision<dtrain::bf16>,
                  dtrain::Accumulate<4>>
      trainer{world,
              model,
              dtrain::AdamW{.lr = 3e-4f, .weight_decay = 0.1f},
              {.clip = {.max_norm = 1.f},  // clip_grad_norm_(..., 1.0)
               .schedule = dtrain::WarmupCosineLR{.peak_lr = 3e-4f, .warmup_steps = steps / 20, .total_steps = steps},
               .param_groups = {dtrain::no_decay_group()}}};  // {"params": no_decay, "weight_decay": 0}
  const dtrain::FitResult result =
      dtrain::fit(trainer, train_set, &val_set,  // DistributedSampler + DataLoader inside, set_epoch included
                  {.steps = steps,
                   .batch_size = 64,
                   .checkpoint_dir = "out",
                   .save_every = 500,
                   .resume = "latest",  // accelerator.save_state / load_state
                   .eval_every = 500,
                   .metrics = {dtrain::metrics::accuracy()},  // the eval loop, reduced over ranks
                   .tensorboard_dir = "out/tb"});             // SummaryWriter on rank 0
  if (world.rank() == 0) std::printf("final accuracy %.3f\n", result.last_eval->metrics.at("accuracy"));
  // [/snippet:migrating_main]
  doc::check(result.steps == steps && result.last_eval, "the migrating example trains");
  return 0;
}
