// hf::CausalLm on the GPU against transformers + PyTorch on the same GPU
// (float32, TF32 off): GPT-2 (tied head) and Llama (grouped-query, tied,
// left-padded through attention_mask), logits, the first step's loss and
// gradients, and the parameters after 20 AdamW steps at one and two ranks
// (two ranks share the GPU over the host transport); packed records
// (position_ids) against the records one by one; train_lm end to end on the
// GPU in bf16, saved and loaded back by transformers; LLaVA (hf/llava.hpp)
// on the GPU against the host; generation with the key-value cache and
// GRPO's loss against the host. Exits 77 without
// a GPU, or when the tests' Python (DTRAIN_PYTHON) has no CUDA PyTorch or no
// transformers.
#include <string>

#include "support/python_venv.hpp"

namespace {
std::string missing_python() {
  const std::string check = dtrain::testing::test_python() +
                            " -c 'import torch, transformers, safetensors; assert torch.cuda.is_available()'"
                            " > /dev/null 2>&1";
  return std::system(check.c_str()) == 0 ? ""
                                         : dtrain::testing::test_python() +
                                               " lacks PyTorch with CUDA, transformers or safetensors (DTRAIN_PYTHON "
                                               "names the Python to use)";
}
}  // namespace
#define DTRAIN_GPU_TEST_NEEDS missing_python
#include "support/gpu_main.hpp"
// gpu_main.hpp first: it sets Boost.Test up for its own main() before anything includes Boost.Test.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <vector>

#include "hf/packing.hpp"
#include "hf/parity.hpp"
#include "hf/run_logged.hpp"
#include "support/ranks.hpp"

#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/hf/llava.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/train/generate.hpp>
#include <dtrain/train/grpo.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
using namespace dtrain;
using dtrain::testing::run_ranks;
namespace hf = dtrain::hf;
using dtrain::testing::read_text;
using dtrain::testing::run_logged;

namespace {

// Both sides in float32 on one GPU, summing in their own orders: the host
// test's bounds for logits and gradients; parameters after 20 AdamW steps
// 1e-4 (Adam divides by the root of the second moment, so a gradient that
// differs by rounding where it is tiny moves its step by more than rounding).
dtrain::testing::ParityRun on_the_gpu() {
  return {.python = dtrain::testing::test_python(), .torch_device = "cuda", .parameters = 1e-4};
}

}  // namespace

BOOST_AUTO_TEST_CASE(gpt2_trains_like_transformers_on_the_gpu) {
  dtrain::testing::training_parity<Cuda>(on_the_gpu(), "gpt2_gpu", "gpt2 4 float32 0");
}
BOOST_AUTO_TEST_CASE(tied_llama_gqa_trains_like_transformers_on_the_gpu) {
  dtrain::testing::training_parity<Cuda>(on_the_gpu(), "llama_tied_gpu", "llama_tied 2 float32 0");
}
BOOST_AUTO_TEST_CASE(padded_llama_trains_like_transformers_on_the_gpu) {
  dtrain::testing::training_parity<Cuda>(on_the_gpu(), "llama_padded_gpu", "llama 2 float32 0", 3);
}
BOOST_AUTO_TEST_CASE(padded_gpt2_trains_like_transformers_on_the_gpu) {
  dtrain::testing::training_parity<Cuda>(on_the_gpu(), "gpt2_padded_gpu", "gpt2 4 float32 0", 3);
}

// Packed records (position_ids) on the GPU: the loss and gradients of the
// records one by one (the host test's check, no Python).
BOOST_AUTO_TEST_CASE(packed_records_train_as_the_records_one_by_one_on_the_gpu) {
  dtrain::testing::packing::packed_records_train_as_the_records_one_by_one<Cuda>();
}

// train_lm on every local GPU (dtrain-run --nproc-per-node gpu), bf16
// compute with fp32 master weights, fsdp-full: the loss falls and
// transformers loads what it saved.
BOOST_AUTO_TEST_CASE(train_lm_bf16_on_the_gpu) {
  const std::string py = dtrain::testing::test_python();
  const fs::path dir = dtrain::testing::make_model(py, "llama_for_train_lm_gpu", "llama 2 bfloat16 0");
  const fs::path work = fs::path(DTRAIN_TEST_BINARY_DIR) / "train_lm_gpu";
  fs::remove_all(work);
  fs::create_directories(work);
  BOOST_TEST_REQUIRE(run_logged(py + " -c \"import numpy as np; np.save('" + (work / "tokens.npy").string() +
                                    "', np.tile(np.arange(0, 61, 3, dtype=np.int32), 200))\"",
                                work / "numpy.log") == 0,
                     read_text(work / "numpy.log"));
  const fs::path saved = work / "tuned";
  const std::string run = std::string(DTRAIN_RUN_PATH) + " --nproc-per-node gpu " + TRAIN_LM_PATH + " --config " +
                          DTRAIN_SOURCE_DIR +
                          "/examples/configs/lm_finetune_gpu.yaml model=" + (dir / "model").string() +
                          " data=" + (work / "tokens.npy").string() +
                          " block_size=16 batch_size=8 accumulate=1 lr=3e-3 schedule=constant warmup_steps=0 clip=0 "
                          "steps=30 log_every=10 eval_batches=2 save_hf=" +
                          saved.string();
  BOOST_TEST_REQUIRE(run_logged(run, work / "train.log") == 0, read_text(work / "train.log"));
  const std::string log = read_text(work / "train.log");
  const auto loss_at = [&](const std::string& step) {
    const auto at = log.find("step " + step + "/30 | loss ");
    BOOST_TEST_REQUIRE(at != std::string::npos, log);
    return std::stod(log.substr(at + step.size() + 15, 6));
  };
  BOOST_TEST(loss_at("   30") < loss_at("    1") - 0.5, log);
  BOOST_TEST(run_logged(py + " " + DTRAIN_SOURCE_DIR + "/tests/hf/transformers_logits.py " + saved.string() + " " +
                            (dir / "expected.safetensors").string() + " " + (work / "logits.safetensors").string(),
                        work / "reload.log") == 0,
             read_text(work / "reload.log"));
}

// Generation and GRPO's loss on the GPU, behind DTRAIN_GPU_GENERATE and
// DTRAIN_GPU_PREFERENCE (set here): a tiny random Llama saved from the host
// and loaded on the GPU generates the host's greedy tokens with the
// key-value cache (ragged prompts), and a GRPO step on the same completions
// gives the host's loss (float32, 1e-4 of max(1, the loss)).
BOOST_AUTO_TEST_CASE(generation_and_grpo_on_the_gpu_match_the_host) {
  ::setenv("DTRAIN_GPU_GENERATE", "on", 1);
  ::setenv("DTRAIN_GPU_PREFERENCE", "on", 1);
  const hf::LmConfig config = hf::parse_config(nlohmann::ordered_json::parse(R"({
    "model_type": "llama", "vocab_size": 53, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 24, "rms_norm_eps": 1e-5})"),
                                               "tiny Llama");
  const std::vector<std::vector<std::int64_t>> prompts{{3, 14, 15}, {9, 2, 6, 5, 35, 8}, {7}};
  const std::vector<double> rewards{1, 0, 2, 1, 0, 0};
  const fs::path dir = fs::path(DTRAIN_TEST_BINARY_DIR) / "generate_gpu";
  fs::remove_all(dir);
  std::vector<std::vector<std::int64_t>> tokens[2];
  double loss[2] = {0, 0};
  run_ranks(1, [&](World& w) {
    const auto both = [&](auto& trainer, int d) {
      const GenerateResult r = generate(trainer, std::span(prompts), {}, {.max_new_tokens = 8, .max_positions = 24});
      tokens[d] = r.tokens;
      std::vector<std::vector<std::int64_t>> p2, c2;
      for (int i = 0; i < 6; ++i) p2.push_back(prompts[i % 2]), c2.push_back(r.tokens[i % 3]);
      Batch b = completion_batch(p2, c2, group_advantages(rewards, 3), rewards);
      loss[d] = trainer.step(std::span(&b, 1)).loss;
    };
    hf::CausalLm model(config);
    model.loss = nn::GrpoLoss(nn::GrpoLossOptions{});
    Trainer<hf::CausalLm, Device<Host>> host(w, model, SGD{.lr = 0.1f}, {.seed = 4});
    hf::save_pretrained(host, dir, model);
    both(host, 0);
    hf::CausalLm again(config);
    again.loss = nn::GrpoLoss(nn::GrpoLossOptions{});
    Trainer<hf::CausalLm, Device<Cuda>> gpu(w, again, SGD{.lr = 0.1f});
    hf::load_pretrained(gpu, dir, config);
    both(gpu, 1);
  });
  for (std::size_t i = 0; i < prompts.size(); ++i) BOOST_TEST(tokens[0][i] == tokens[1][i], "prompt " << i);
  BOOST_TEST(std::abs(loss[0] - loss[1]) <= 1e-4 * std::max(1.0, std::abs(loss[0])), loss[0] << " vs " << loss[1]);
  ::unsetenv("DTRAIN_GPU_GENERATE");
  ::unsetenv("DTRAIN_GPU_PREFERENCE");
}

// LLaVA on the GPU, its tower's units behind DTRAIN_GPU_VISION and
// DTRAIN_GPU_ATTENTION (set here): a tiny random model (CLIP tower, Llama),
// saved from the host and loaded on the GPU, gives the host's logits and
// parameters after one SGD step (float32, each device summing in its own
// order: 1e-4 of max(1, the largest value)).
BOOST_AUTO_TEST_CASE(llava_on_the_gpu_matches_the_host) {
  ::setenv("DTRAIN_GPU_VISION", "on", 1);
  ::setenv("DTRAIN_GPU_ATTENTION", "on", 1);
  const hf::LlavaConfig config = hf::parse_llava_config(nlohmann::ordered_json::parse(R"({
    "model_type": "llava", "image_token_index": 49, "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 3, "num_attention_heads": 4, "image_size": 16, "patch_size": 4},
    "text_config": {"model_type": "llama", "vocab_size": 50, "hidden_size": 24, "intermediate_size": 40,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "max_position_embeddings": 64}})"),
                                                        "tiny LLaVA");
  const std::int64_t time = 20, features = config.features_per_image();
  std::vector<float> pixels(2 * 3 * 16 * 16);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>((i * 37) % 101) / 50.f - 1.f;
  std::vector<std::int64_t> ids(2 * time), next(2 * time, -100);
  for (std::int64_t r = 0; r < 2 * time; ++r) {
    const std::int64_t t = r % time, first = r < time ? 1 : 3;
    ids[r] = t >= first && t < first + features ? 49 : (r * 7) % 49;
  }
  for (std::int64_t r = 0; r < 2 * time; ++r)
    if (r % time < time - 1 && ids[r + 1] != 49) next[r] = ids[r + 1];
  Batch b;
  b.set("pixel_values", HostTensor::of(pixels, {2, 3, 16, 16}));
  b.set("x", HostTensor::of(ids, {2, time}));
  b.set("y", HostTensor::of(next, {2, time}));
  const fs::path dir = fs::path(DTRAIN_TEST_BINARY_DIR) / "llava_gpu";
  fs::remove_all(dir);
  std::vector<float> logits[2];
  std::map<std::string, std::vector<float>> after[2];
  run_ranks(1, [&](World& w) {
    hf::Llava model(config, hf::parse_llava_train("all"));
    Trainer<hf::Llava, Device<Host>> host(w, model, SGD{.lr = 0.1f}, {.seed = 3});
    hf::save_pretrained(host, dir, model, "");
    logits[0] = host.predict(b);
    host.step(std::vector<Batch>{b});
    after[0] = host.parameters();
    hf::Llava again(config, hf::parse_llava_train("all"));
    Trainer<hf::Llava, Device<Cuda>> gpu(w, again, SGD{.lr = 0.1f});
    hf::load_pretrained(gpu, dir, again);
    logits[1] = gpu.predict(b);
    gpu.step(std::vector<Batch>{b});
    after[1] = gpu.parameters();
  });
  const auto worst = [](const std::vector<float>& a, const std::vector<float>& c) {
    double d = 0, m = 1;
    for (std::size_t i = 0; i < a.size(); ++i) {
      d = std::max(d, std::abs(double(a[i]) - c[i]));
      m = std::max(m, std::abs(double(a[i])));
    }
    return d / m;
  };
  BOOST_TEST(worst(logits[0], logits[1]) <= 1e-4);
  double params = 0;
  for (const auto& [name, v] : after[0]) params = std::max(params, worst(v, after[1].at(name)));
  BOOST_TEST(params <= 1e-4);
  std::printf("LLaVA on the GPU vs the host: logits %.3e, parameters after a step %.3e (relative)\n",
              worst(logits[0], logits[1]), params);
}
