// The C++ the pages under docs/ show (checkpoints, data, policies, model,
// reliability; guide.cpp has the guide's), compiled and run by CTest as
// doc_snippets; docs_test checks the pages against the marked regions. Declarations-only regions (the concepts'
// signatures) are checked with static_assert against the concepts they document.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "snippets.hpp"

#include <dtrain/data/preference.hpp>
#include <dtrain/diffusion/lora.hpp>
#include <dtrain/diffusion/unet.hpp>
#include <dtrain/hf/model.hpp>
#include <dtrain/lerobot/act.hpp>
#include <dtrain/train/generate.hpp>
#include <dtrain/train/grpo.hpp>
#include <dtrain/trainer.hpp>

namespace {

using doc::check;
using doc::Net;

// ---- docs/model.md ----------------------------------------------------------

// [snippet:model_unit]
struct MyUnit {
  std::vector<dtrain::ParamSpec> params() const;     // what parameters it has
  std::int64_t out_features(std::int64_t in) const;  // output width for an input width
  template <class Dev, class T>
  void forward(Dev& dev, dtrain::UnitParams<const T> p, dtrain::MatView<const T> x, dtrain::MatView<T> y);
  template <class Dev, class T>
  void backward(Dev& dev, dtrain::UnitParams<const T> p, dtrain::UnitParams<T> grad, dtrain::MatView<const T> x,
                dtrain::MatView<const T> y, dtrain::MatView<const T> dy, dtrain::MatView<T> dx);
};
static_assert(dtrain::Unit<MyUnit, dtrain::Host, float>);
// [/snippet:model_unit]

struct MyContextUnit {
  std::vector<dtrain::ParamSpec> params() const;
  std::int64_t out_features(std::int64_t in) const;
  // [snippet:model_context_unit]
  template <class Dev, class T>
  void forward(Dev&, dtrain::UnitParams<const T> p, dtrain::MatView<const T> x, dtrain::MatView<T> y,
               const dtrain::UnitContext<T>& ctx);
  template <class Dev, class T>
  void backward(Dev&, dtrain::UnitParams<const T> p, dtrain::UnitParams<T> grad, dtrain::MatView<const T> x,
                dtrain::MatView<const T> y, dtrain::MatView<const T> dy, dtrain::MatView<T> dx,
                const dtrain::UnitContext<T>& ctx);
  std::int64_t saved_size(dtrain::SeqShape shape, std::int64_t in) const;  // optional
  // [/snippet:model_context_unit]
};
static_assert(dtrain::Unit<MyContextUnit, dtrain::Host, float>);

struct MyInputUnit {
  std::vector<dtrain::ParamSpec> params() const;
  std::int64_t out_features(std::int64_t in) const;
  // [snippet:model_input_unit]
  template <class Dev, class T>
  void forward(Dev&, dtrain::UnitParams<const T> p, const dtrain::DeviceBatch& batch, dtrain::MatView<T> y,
               const dtrain::UnitContext<T>& ctx);
  template <class Dev, class T>
  void backward(Dev&, dtrain::UnitParams<const T> p, dtrain::UnitParams<T> grad, const dtrain::DeviceBatch& batch,
                dtrain::MatView<const T> y, dtrain::MatView<const T> dy, const dtrain::UnitContext<T>& ctx);
  // [/snippet:model_input_unit]
};
static_assert(dtrain::InputUnit<MyInputUnit, dtrain::Host, float>);

// [snippet:model_loss]
struct MyLoss {
  double count(const dtrain::Batch& batch) const;  // this micro-batch's share of the normaliser
  template <class Dev, class T>
  double forward(Dev& dev, dtrain::MatView<const T> logits, const dtrain::DeviceBatch& batch);
  template <class Dev, class T>
  void backward(Dev& dev, dtrain::MatView<const T> logits, const dtrain::DeviceBatch& batch, dtrain::MatView<T> dlogits,
                float scale);
};
static_assert(dtrain::Loss<MyLoss, dtrain::Host, float>);
// [/snippet:model_loss]

// [snippet:model_model]
struct MyModel {
  dtrain::nn::Linear a{4, 8};  // the units: any types satisfying dtrain::Unit
  dtrain::nn::ReLU b;
  dtrain::nn::Linear c{8, 3};
  dtrain::nn::SoftmaxCrossEntropy loss;       // any type satisfying dtrain::Loss
  auto units() { return std::tie(a, b, c); }  // references to the units, in order
};
static_assert(dtrain::Model<MyModel>);
// [/snippet:model_model]

constexpr std::int64_t vocab = 50, dim = 8;
// [snippet:model_tied]
struct TinyLm {
  dtrain::nn::Embedding tok{vocab, dim};  // unit 0: "0.weight" [vocab, dim]
  dtrain::nn::LayerNorm ln{dim};
  dtrain::nn::Linear head{dim, vocab, {.bias = false, .tie_weight = "0.weight"}};  // reads 0.weight
  dtrain::nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(tok, ln, head); }
};
// [/snippet:model_tied]

void model_tied(dtrain::World& world) {
  TinyLm lm;
  dtrain::Trainer<TinyLm> trainer{world, lm, dtrain::AdamW{}};
  const auto params = trainer.parameters();
  check(params.contains("0.weight") && !params.contains("2.weight"), "the tied head is stored once");
}

void model_batch() {
  const std::int64_t B = 2, T = 3, rows = 4, F = 2;
  std::vector<std::int32_t> ids(B * T, 1), next_ids(B * T, 2), labels(rows, 0);
  std::vector<float> features(rows * F, 0.5f);
  // [snippet:model_batch]
  dtrain::Batch b;
  b.set("x", dtrain::HostTensor::of(ids, {B, T}));  // std::vector<std::int32_t> token ids
  b.set("y", dtrain::HostTensor::of(next_ids, {B, T}));
  std::span<const std::int32_t> y = b.at("y").values<std::int32_t>();  // throws if y is not int32

  // The classic classification table: float x [rows, F], int32 labels y [rows].
  auto t = dtrain::Batch::table(features, labels, rows, F);
  // [/snippet:model_batch]
  check(y.size() == 6 && y[0] == 2, "Batch::at().values");
  check(t.at("x").numel() == rows * F, "Batch::table");
}

// ---- docs/policies.md -------------------------------------------------------

// [snippet:policies_compose]
using P = dtrain::policies<dtrain::Accumulate<4>, dtrain::Precision<dtrain::bf16>>;
static_assert(std::is_same_v<P::strategy, dtrain::DDP>);  // default
static_assert(std::is_same_v<P::param_type, dtrain::bf16>);
static_assert(std::is_same_v<P::reduce_type, dtrain::fp32>);  // default reduce dtype
static_assert(std::is_same_v<P::master_type, dtrain::fp32>);
static_assert(P::accumulate == 4);
// P::device is dtrain::Host here, dtrain::Cuda in a file nvcc compiles.
// [/snippet:policies_compose]

void policies_sharding(dtrain::World& world) {
  using Model = MyModel;
  Model model;
  const int group = 1;  // ranks per shard group; this runs as a world of one rank
  // [snippet:policies_sharding]
  dtrain::FsdpOptions fsdp;
  fsdp.shard_group = group;  // HybridShard: ranks per shard group (0, the default: LOCAL_WORLD_SIZE)
  fsdp.prefetch = 1;         // unit all-gathers issued ahead (FullShard holds prefetch + 1 units)
  dtrain::Trainer<Model, dtrain::Strategy<dtrain::FSDP<dtrain::HybridShard>>, dtrain::Precision<dtrain::bf16>> trainer{
      world, model, dtrain::AdamW{.lr = 3e-4f}, dtrain::TrainerOptions{}, fsdp};
  // [/snippet:policies_sharding]
  check(trainer.layout().units().size() == 3, "an FSDP<HybridShard> Trainer over MyModel");
}

void offload_page(dtrain::World& world) {
  using Model = MyModel;
  Model model, other;
  // [snippet:offload_policy]
  // The master weights, AdamW's moments and the fp32 gradient shards live in
  // host memory; the parameter shards too with Offload<dtrain::ParamShards>.
  dtrain::Trainer<Model, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>, dtrain::Precision<dtrain::bf16>,
                  dtrain::Offload<dtrain::OptimizerState>>
      trainer{world, model, dtrain::AdamW{.lr = 3e-4f}};
  dtrain::MemoryUsage on_device = trainer.memory();     // what stays on the compute device
  dtrain::MemoryUsage in_host = trainer.host_memory();  // what was offloaded
  // [/snippet:offload_policy]
  check(on_device.master == 0 && on_device.optimizer == 0 && in_host.optimizer > 0, "the optimizer state offloaded");
  // [snippet:offload_runtime]
  dtrain::TrainerOptions options;
  options.offload = dtrain::parse_offload("params");  // none | optimizer | params, e.g. from a config file
  dtrain::Trainer<Model, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>> chosen{world, other, dtrain::AdamW{},
                                                                                   options};
  // [/snippet:offload_runtime]
  check(chosen.offload() == dtrain::offload_kind::params && chosen.memory().params == 0,
        "the parameter shards offloaded");
}

void policies_optim() {
  const std::int64_t step = 250;
  // [snippet:policies_optimizers]
  dtrain::AdamW adamw{.lr = 3e-4f, .weight_decay = 0.1f};  // beta1 0.9, beta2 0.999, eps 1e-8
  dtrain::SGD sgd{.lr = 0.1f, .momentum = 0.9f, .nesterov = true};
  dtrain::ClipOptions clip{.max_norm = 1.f};  // 0 (the default) turns clipping off
  // [/snippet:policies_optimizers]
  adamw.validate();
  sgd.validate();
  clip.validate();
  // [snippet:policies_schedules]
  dtrain::Schedule lr = dtrain::WarmupCosineLR{.peak_lr = 3e-4f, .warmup_steps = 100, .total_steps = 5000};
  dtrain::Schedule from_cli = dtrain::make_schedule("cosine", {.lr = 3e-4f, .warmup_steps = 100, .total_steps = 5000});
  float rate = lr(step);
  // [/snippet:policies_schedules]
  check(rate == from_cli(step) && rate > 2.9e-4f && rate < 3e-4f, "the cosine schedule after warmup");
}

// ---- docs/data.md -----------------------------------------------------------

void data_pages(dtrain::World& world, const dtrain::Dataset& dataset) {
  {
    const int rank = 0, world_size = 1;
    const int e = 1;
    // [snippet:data_sampler]
    dtrain::DistributedSampler sampler{
        dataset.size(), rank, world_size, {.shuffle = true, .seed = 0, .drop_last = false}};
    dtrain::DistributedSampler sampler2{dataset.size(), world};  // anything with rank() and size()
    sampler.set_epoch(e);                                        // epoch e from its start
    sampler.indices();                                           // this rank's indices for the current epoch
    auto idx = sampler.next(64);  // the next 64, moving into epoch + 1 when this one ends
    auto st = sampler.state();    // {epoch, position}: save it...
    sampler.load_state(st);       // ...and continue exactly there
    // [/snippet:data_sampler]
    check(
        idx.size() == 64 && st.position == 64 && sampler2.indices().size() == static_cast<std::size_t>(dataset.size()),
        "DistributedSampler");
  }
  dtrain::DistributedSampler sampler{dataset.size(), world};
  // [snippet:data_loader]
  dtrain::DataLoader loader{dataset, sampler, {.batch_size = 32, .num_workers = 2, .prefetch = 4}};
  dtrain::Batch b = loader.next();  // b.at("x") [B, F], b.at("y") [B], b.indices
  // [/snippet:data_loader]
  check(b.at("x").numel() == 32 * dataset.features, "DataLoader::next");

  const std::int64_t out = 3, in = 2, n = 4;
  std::vector<float> weights(out * in, 0.25f);
  std::vector<std::byte> bytes(n, std::byte{7});
  std::vector<std::int64_t> counts{1000};
  // [snippet:data_safetensors]
  dtrain::SafetensorsWriter w;
  w.add("layer.weight", {out, in}, weights);  // dtype from the element type
  w.add("raw", dtrain::element_type::u8, {n}, bytes);
  w.add("step_count", {1}, counts);
  w.set_metadata("step", "1000");
  w.write("model.safetensors");

  auto f = dtrain::SafetensorsFile::open("model.safetensors");
  auto t = f.tensor("layer.weight");                       // dtype, shape, bytes (mapped)
  std::vector<float> v = f.read_f32("layer.weight");       // from F32, F64, F16, BF16
  std::vector<std::int64_t> c = f.read_i64("step_count");  // from I8..I64, U8..U32
  // [/snippet:data_safetensors]
  check(t.shape.size() == 2 && v.size() == 6 && v[5] == 0.25f && c.at(0) == 1000, "safetensors round trip");
}

// ---- docs/checkpoints.md ----------------------------------------------------

void checkpoint_page(dtrain::World& world, const dtrain::Dataset& dataset) {
  Net model;
  dtrain::Trainer<Net> trainer{world, model, dtrain::AdamW{.lr = 1e-3f}};
  dtrain::DistributedSampler sampler{dataset.size(), world};
  dtrain::DataLoader loader{dataset, sampler, {.batch_size = 32, .num_workers = 0}};
  for (int s = 0; s < 3; ++s) {
    const dtrain::Batch b = loader.next();
    trainer.step(std::span(&b, 1));
  }
  trainer.save_params("pretrained.safetensors");
  // [snippet:checkpoints_api]
  trainer.save("ckpt/step-00001000", {.sampler = &sampler});  // every rank; collective
  auto info = trainer.load("ckpt/step-00001000");             // any world size, any strategy
  if (info.sampler) sampler.load_state(info.sampler->state_for(sampler));
  auto report = trainer.load_params("pretrained.safetensors", {.strict = false});
  // [/snippet:checkpoints_api]
  check(info.step == 3 && report.missing.empty() && !report.loaded.empty(), "save, load and load_params");
}

// ---- docs/reliability.md ----------------------------------------------------

void uneven_data(dtrain::World& world, const dtrain::Dataset& dataset) {
  Net model;
  dtrain::Trainer<Net> trainer{world, model, dtrain::AdamW{.lr = 1e-3f}};
  const std::int64_t features = dataset.features, my_batches = 3;
  std::int64_t batches_used = 0;
  auto batch = [&](std::int64_t s) {
    ++batches_used;
    const std::vector<std::int64_t> rows{2 * s, 2 * s + 1};
    return dataset.gather(rows);
  };
  // [snippet:reliability_uneven]
  const dtrain::Batch empty = dtrain::Batch::table({}, {}, 0, features);  // x [0, features], y [0]
  for (std::int64_t s = 0;; ++s) {
    const dtrain::Batch b = s < my_batches ? batch(s) : empty;
    const auto stats = trainer.step(std::span(&b, 1));
    if (stats.samples == 0) break;  // every rank has run out: the step changed nothing
  }
  // [/snippet:reliability_uneven]
  check(batches_used == my_batches, "the uneven-data loop stops after the last batch");
}

// A learnable task: labels from the signs of two of 32 features.
dtrain::Dataset make_dataset(std::int64_t rows) {
  dtrain::Dataset d{.x = {}, .y = {}, .rows = rows, .features = 32};
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int f = 0; f < 32; ++f) d.x.push_back(normal(gen));
    d.y.push_back((d.x[r * 32] > 0 ? 1 : 0) + (d.x[r * 32 + 1] > 0 ? 2 : 0));
  }
  d.validate(10);
  return d;
}

// ---- docs/models_policies.md -----------------------------------------------

void act_page(dtrain::World& world) {
  namespace fs = std::filesystem;
  // A small policy to start from, saved as LeRobot saves one.
  dtrain::models::ActConfig small;
  small.cameras = {"observation.images.top"};
  small.image_height = small.image_width = 32;
  small.state_dim = 4;
  small.action_dim = 2;
  small.chunk_size = small.n_action_steps = 4;
  small.dim_model = 16;
  small.n_heads = 2;
  small.dim_feedforward = 32;
  small.n_encoder_layers = small.n_vae_encoder_layers = 1;
  small.latent_dim = 4;
  fs::remove_all("act_policy");
  fs::remove_all("act_tuned");
  {
    dtrain::models::Act start(small);
    dtrain::Trainer<dtrain::models::Act> t(world, start, dtrain::AdamW{});
    dtrain::lerobot::save_lerobot(t, "act_policy", start);
  }
  // [snippet:act_lerobot]
  const dtrain::models::ActConfig config = dtrain::lerobot::read_act_config("act_policy");
  dtrain::models::Act model(config);
  dtrain::Trainer<dtrain::models::Act, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>> trainer(
      world, model, dtrain::AdamW{.lr = config.optimizer_lr, .weight_decay = config.optimizer_weight_decay});
  dtrain::lerobot::load_lerobot(trainer, "act_policy", model);
  // ... trainer.step(batches) ...
  dtrain::lerobot::save_lerobot(trainer, "act_tuned", model);
  // [/snippet:act_lerobot]
  check(fs::exists("act_tuned/model.safetensors"), "save_lerobot wrote the policy");
}

// ---- docs/models_diffusion.md ----------------------------------------------

void unet_page(dtrain::World& world) {
  namespace fs = std::filesystem;
  // A small UNet to start from, saved as diffusers saves one.
  dtrain::models::UNetConfig small;
  small.block_out_channels = {8, 16};
  small.down_block_types = {"CrossAttnDownBlock2D", "DownBlock2D"};
  small.up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D"};
  small.layers_per_block = {1};
  small.norm_num_groups = 4;
  small.attention_heads = {2};
  small.cross_attention_dim = 8;
  small.sample_height = small.sample_width = 8;
  fs::remove_all("unet");
  fs::remove_all("unet_tuned");
  {
    dtrain::models::UNet2DCondition start(small);
    dtrain::Trainer<dtrain::models::UNet2DCondition> t(world, start, dtrain::AdamW{});
    dtrain::diffusion::save_diffusers(t, "unet", start);
  }
  // [snippet:unet_diffusers]
  dtrain::models::UNetConfig config = dtrain::diffusion::read_unet_config("unet");
  config.context_length = 77;  // the text tokens per record of your cached embeddings
  dtrain::models::UNet2DCondition model(config);
  dtrain::Trainer<dtrain::models::UNet2DCondition, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>> trainer(
      world, model, dtrain::AdamW{.lr = 1e-5f});
  dtrain::diffusion::load_diffusers(trainer, "unet", model);
  // ... trainer.step(batches) ...
  dtrain::diffusion::save_diffusers(trainer, "unet_tuned", model);
  // [/snippet:unet_diffusers]
  check(fs::exists("unet_tuned/diffusion_pytorch_model.safetensors"), "save_diffusers wrote the UNet");
  fs::remove_all("lora");
  // [snippet:unet_lora]
  dtrain::hf::LoraConfig lora{.r = 4, .alpha = 4.f, .targets = {"to_q", "to_k", "to_v", "to_out.0"}};
  dtrain::models::UNet2DCondition adapted(config, lora);  // the UNet frozen, adapters on both attentions
  dtrain::Trainer<dtrain::models::UNet2DCondition> lora_trainer(world, adapted, dtrain::AdamW{.lr = 1e-4f});
  dtrain::diffusion::load_diffusers(lora_trainer, "unet", adapted);
  // ... lora_trainer.step(batches) ...
  dtrain::diffusion::save_lora(lora_trainer, "lora", adapted);  // diffusers: pipe.load_lora_weights("lora")
  // [/snippet:unet_lora]
  check(fs::exists("lora/pytorch_lora_weights.safetensors"), "save_lora wrote the adapters");
}

}  // namespace

// ---- docs/rl.md -------------------------------------------------------------

// A tiny Llama from a config, with LoRA adapters (so the base is the reference).
dtrain::hf::LmConfig rl_config() {
  return dtrain::hf::parse_config(nlohmann::ordered_json{{"model_type", "llama"},
                                                         {"vocab_size", 40},
                                                         {"hidden_size", 16},
                                                         {"intermediate_size", 24},
                                                         {"num_hidden_layers", 1},
                                                         {"num_attention_heads", 2},
                                                         {"num_key_value_heads", 1},
                                                         {"max_position_embeddings", 32}},
                                  "config.json");
}

void rl_page(dtrain::World& world) {
  namespace fs = std::filesystem;
  const dtrain::hf::LmConfig config = rl_config();
  const dtrain::hf::LoraConfig lora{.r = 2, .targets = {"q_proj", "v_proj"}};
  const std::int64_t block_size = 16;
  {
    std::ofstream out("pairs.jsonl");
    for (int i = 0; i < 4; ++i)
      out << R"({"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6]})"
          << "\n";
  }
  {
    // [snippet:rl_dpo]
    dtrain::hf::CausalLm model(config, lora);
    model.loss = dtrain::nn::PreferenceLoss({.type = dtrain::nn::PreferenceLossType::sigmoid, .beta = 0.1f});
    dtrain::Trainer<dtrain::hf::CausalLm, dtrain::Strategy<dtrain::FSDP<dtrain::FullShard>>> trainer(world, model,
                                                                                                     dtrain::AdamW{});
    const auto pairs = dtrain::read_preference_pairs("pairs.jsonl", block_size, config.vocab_size);
    dtrain::Batch b = dtrain::preference_batch(std::span(pairs).first(4));  // 4 pairs: chosen rows, then rejected
    const auto ref = trainer.sequence_logps(b, {.adapters = false});        // the base's log-probabilities
    b.set("ref_logps", dtrain::HostTensor::of(ref.logp, {8}));
    const dtrain::StepStats st = trainer.step(std::span(&b, 1));  // st.metrics: TRL's figures
    // [/snippet:rl_dpo]
    check(std::abs(st.loss - std::log(2.0)) < 1e-6 && st.metrics.size() == 6, "a DPO step from the base");
  }
  dtrain::hf::CausalLm model(config);
  model.loss = dtrain::nn::GrpoLoss(dtrain::nn::GrpoLossOptions{});
  dtrain::Trainer<dtrain::hf::CausalLm, dtrain::Strategy<dtrain::DDP>> trainer(world, model, dtrain::AdamW{});
  {
    // [snippet:rl_generate]
    const std::vector<std::vector<std::int64_t>> prompts{{15, 11}, {4, 28, 25}};
    const std::vector<std::uint64_t> ids{0, 1};  // the records' ids: their sampling streams
    const dtrain::GenerateResult r = dtrain::generate(
        trainer, std::span(prompts), std::span(ids),
        {.max_new_tokens = 8, .temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .stop_tokens = {39}, .seed = 1});
    // r.tokens[i]: prompt i's new tokens (a stop token kept); r.new_tokens / r.seconds: tokens/s
    // [/snippet:rl_generate]
    check(r.tokens.size() == 2 && !r.tokens[0].empty() && r.tokens[0].size() <= 8, "generate");
  }
  const std::vector<std::vector<std::int64_t>> prompts{{1, 2}, {3, 4}};
  const std::vector<std::uint64_t> prompt_ids{0, 1};
  const std::int64_t step = 1;
  const auto my_score = [](std::span<const std::int64_t>, std::span<const std::int64_t> completion) {
    return static_cast<double>(completion.size());
  };
  // [snippet:rl_grpo]
  const dtrain::RewardFunction reward = [&](std::span<const std::int64_t> prompt,
                                            std::span<const std::int64_t> completion) {
    return my_score(prompt, completion);  // any C++ callable
  };
  const dtrain::GrpoBatch b = dtrain::grpo_batch(trainer, prompts, prompt_ids, reward, {.num_generations = 4}, step);
  trainer.step(std::span(&b.batch, 1));
  // [/snippet:rl_grpo]
  check(b.rewards.size() == 8 && std::isfinite(trainer.parameters().begin()->second[0]), "a GRPO step");
  fs::remove("pairs.jsonl");
}

int guide_examples(dtrain::World& world, const dtrain::Dataset& dataset);                            // guide.cpp
int migrating_example(int steps, const dtrain::Dataset& train_set, const dtrain::Dataset& val_set);  // migrating.cpp

// Runs every page's code once, as one process, in the folder argv[1].
int main(int argc, char** argv) try {
  if (argc > 1) std::filesystem::current_path(argv[1]);
  auto world = dtrain::init();
  const dtrain::Dataset dataset = make_dataset(2048);
  model_batch();
  model_tied(world);
  policies_sharding(world);
  policies_optim();
  offload_page(world);
  data_pages(world, dataset);
  checkpoint_page(world, dataset);
  uneven_data(world, dataset);
  act_page(world);
  unet_page(world);
  rl_page(world);
  guide_examples(world, dataset);
  migrating_example(12, dataset, make_dataset(256));
  std::puts("every documented snippet ran");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "doc_snippets: %s\n", e.what());
  return 1;
}
