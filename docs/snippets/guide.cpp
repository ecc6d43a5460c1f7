// The C++ docs/guide.md shows (see quickstart.cpp): choosing a strategy,
// batch sizes and learning-rate scaling, mixed precision, accumulation,
// activation checkpointing, resuming and fine-tuning, data loading and
// metrics. Each region compiles here and runs once in doc_snippets.
#include <cstdio>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "snippets.hpp"

#include <dtrain/run/fit.hpp>
#include <dtrain/trainer.hpp>

namespace {

using doc::check;
using doc::Net;

// [snippet:guide_strategies]
// One type per choice; everything else about the loop stays the same.
using Ddp = dtrain::Trainer<Net>;                                                          // the default
using Zero1 = dtrain::Trainer<Net, dtrain::Strategy<dtrain::ZeRO1>>;                       // optimizer state sharded
using GradOp = dtrain::Trainer<Net, dtrain::Strategy<dtrain::FSDP<dtrain::ShardGradOp>>>;  // + gradients
using Full = dtrain::Trainer<Net, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>>;      // + parameters
using Hybrid = dtrain::Trainer<Net, dtrain::Strategy<dtrain::FSDP<dtrain::HybridShard>>>;  // FullShard within a group
// [/snippet:guide_strategies]

template <class T>
void one_step(dtrain::World& world, const dtrain::Dataset& data) {
  Net net;
  T trainer{world, net, dtrain::AdamW{.lr = 1e-3f}};
  const std::vector<std::int64_t> rows{0, 1, 2, 3};
  const dtrain::Batch b = data.gather(rows);
  check(trainer.step(std::span(&b, 1)).samples == 4, "one step of every strategy");
}

void strategies(dtrain::World& world, const dtrain::Dataset& data) {
  one_step<Ddp>(world, data);
  one_step<Zero1>(world, data);
  one_step<GradOp>(world, data);
  one_step<Full>(world, data);
  Net net;
  Hybrid hybrid{world, net, dtrain::AdamW{.lr = 1e-3f}, {}, dtrain::FsdpOptions{.shard_group = 1}};
  check(hybrid.steps_taken() == 0, "a HybridShard Trainer");
}

void batch_and_lr(dtrain::World& world) {
  // [snippet:guide_batch]
  constexpr int accumulate = 4;
  const std::int64_t per_rank = 32;                     // rows per micro-batch on one rank
  const std::int64_t global = per_rank * world.size();  // rows per micro-batch over all ranks
  const std::int64_t effective = global * accumulate;   // rows per optimizer step
  // The learning rate was tuned at 32 rows per step on one device:
  const float lr = dtrain::scale_lr(3e-4f, dtrain::lr_scaling_rule::sqrt, static_cast<int>(effective / per_rank));
  // [/snippet:guide_batch]
  check(effective == 128 * world.size() && lr > 3e-4f, "scale_lr");
}

void precision_and_accumulation(dtrain::World& world, const dtrain::Dataset& data) {
  Net net;
  dtrain::DistributedSampler sampler{data.size(), world};
  dtrain::DataLoader loader{data, sampler, {.batch_size = 16, .num_workers = 0}};
  // [snippet:guide_precision]
  // bf16 compute with fp32 master weights and an fp32 gradient reduction,
  // four micro-batches per optimizer step, activations recomputed in backward:
  dtrain::TrainerOptions options;
  options.activation_checkpointing = true;
  options.clip = {.max_norm = 1.f};
  dtrain::Trainer<Net, dtrain::Precision<dtrain::bf16>, dtrain::Accumulate<4>> trainer{
      world, net, dtrain::AdamW{.lr = 3e-4f}, options};
  std::vector<dtrain::Batch> micro(4);
  for (auto& b : micro) b = loader.next();
  const dtrain::StepStats stats = trainer.step(micro);  // one optimizer step over 4 x 16 rows per rank
  // [/snippet:guide_precision]
  check(stats.samples == 64 * world.size(), "Accumulate<4>");
  // [snippet:guide_fp16]
  // fp16 compute needs loss scaling (on by default for fp16, PyTorch GradScaler's defaults):
  dtrain::TrainerOptions fp16_options;
  fp16_options.loss_scale = {.initial = 1024.f, .window = 1000};
  dtrain::Trainer<Net, dtrain::Precision<dtrain::fp16>> fp16_trainer{world, net, dtrain::AdamW{.lr = 3e-4f},
                                                                     fp16_options};
  // [/snippet:guide_fp16]
  const dtrain::StepStats s16 = fp16_trainer.step(std::span(&micro[0], 1));
  check(s16.loss_scale == 1024.f || s16.skipped, "fp16 loss scale");
}

void resume_and_finetune(dtrain::World& world, const dtrain::Dataset& data) {
  Net net;
  dtrain::Trainer<Net> trainer{world, net, dtrain::AdamW{.lr = 1e-3f}};
  dtrain::DistributedSampler sampler{data.size(), world};
  dtrain::DataLoader loader{data, sampler, {.batch_size = 16, .num_workers = 0}};
  const std::int64_t steps = 6;
  const int save_every = 3;
  // [snippet:guide_resume]
  // Resume from the newest complete checkpoint, if any (written at any world size, by any strategy).
  if (auto last = dtrain::latest_checkpoint("ckpt")) {
    const dtrain::CheckpointInfo info = trainer.load(*last);
    if (info.sampler) sampler.load_state(info.sampler->state_for(sampler));
  }
  for (std::int64_t s = trainer.steps_taken(); s < steps; ++s) {
    const dtrain::Batch b = loader.next();
    const auto stats = trainer.step(std::span(&b, 1));
    if (stats.step % save_every == 0) {
      char name[32];
      std::snprintf(name, sizeof name, "ckpt/step-%08lld", static_cast<long long>(stats.step));
      trainer.save(name, {.sampler = &sampler});
      dtrain::prune_checkpoints("ckpt", 3);  // keep the newest 3
    }
  }
  // [/snippet:guide_resume]
  check(trainer.steps_taken() == steps, "the resume loop");
  trainer.save_params("backbone.safetensors");
  // [snippet:guide_finetune]
  // Start from pretrained weights: same names load, a new head stays as initialised.
  Net fresh;
  dtrain::Trainer<Net> finetune{world, fresh, dtrain::AdamW{.lr = 1e-4f}};
  const dtrain::LoadParamsReport report = finetune.load_params("backbone.safetensors", {.strict = false});
  for (const std::string& name : report.missing)
    std::printf("not in the file, left as initialised: %s\n", name.c_str());
  // [/snippet:guide_finetune]
  check(report.loaded.size() == 4 && report.missing.empty(), "load_params");
}

void data_loading(dtrain::World& world, const dtrain::Dataset& data) {
  // [snippet:guide_data]
  dtrain::DistributedSampler sampler{data.size(), world, {.shuffle = true, .seed = 42, .drop_last = true}};
  dtrain::DataLoader loader{data,
                            sampler,
                            {.batch_size = 64,
                             .num_workers = 2,  // threads gathering batches ahead of the training loop
                             .prefetch = 4,     // batches kept ready, at most
                             .transform = [](dtrain::Batch& b) {  // runs on a worker thread
                               for (float& v : b.at("x").values<float>()) v *= 0.5f;
                             }}};
  // [/snippet:guide_data]
  const dtrain::Batch b = loader.next();
  check(b.at("x").numel() == 64 * data.features, "DataLoader with workers and a transform");
}

// [snippet:guide_fit]
// A model of your own: units in order, and a loss.
struct Classifier {
  dtrain::nn::Linear in{32, 128};
  dtrain::nn::LayerNorm norm{128};
  dtrain::nn::GELU act;
  dtrain::nn::Linear out{128, 10};
  dtrain::nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(in, norm, act, out); }
};

dtrain::FitResult train_classifier(dtrain::World& world, const dtrain::Dataset& data, const dtrain::Dataset& val) {
  Classifier model;
  dtrain::Trainer<Classifier, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>> trainer{
      world,
      model,
      dtrain::AdamW{.lr = 1e-3f, .weight_decay = 0.05f},
      {.schedule = dtrain::LinearLR{.peak_lr = 1e-3f, .warmup_steps = 20, .total_steps = 200},
       .param_groups = {dtrain::no_decay_group()}}};
  dtrain::FitCallbacks callbacks;
  callbacks.on_eval = [&](std::int64_t step, const dtrain::EvalResult& r, dtrain::FitControl&) {
    if (world.rank() == 0)
      std::printf("step %lld: held-out accuracy %.3f\n", (long long)step, r.metrics.at("accuracy"));
  };
  return dtrain::fit(trainer, data, &val,
                     {.steps = 200,
                      .batch_size = 32,
                      .checkpoint_dir = "runs/classifier",
                      .save_every = 50,
                      .keep_last = 2,
                      .resume = "latest",
                      .eval_every = 50,
                      .metrics = {dtrain::metrics::accuracy()},
                      .monitor = "accuracy",
                      .maximize = true,
                      .patience = 3,
                      .metrics_file = "runs/classifier/metrics.jsonl",
                      .tensorboard_dir = "runs/classifier/tb"},
                     callbacks);
}
// [/snippet:guide_fit]

}  // namespace

int guide_examples(dtrain::World& world, const dtrain::Dataset& data) {
  std::filesystem::remove_all("runs");
  const dtrain::FitResult first = train_classifier(world, data, data);
  check(first.steps == 200 || first.stopped_early, "fit trains");
  const dtrain::FitResult again = train_classifier(world, data, data);
  check(again.first_step == first.steps, "fit run again resumes where the first run stopped");
  strategies(world, data);
  batch_and_lr(world);
  precision_and_accumulation(world, data);
  std::filesystem::remove_all("ckpt");
  resume_and_finetune(world, data);
  data_loading(world, data);
  return 0;
}
