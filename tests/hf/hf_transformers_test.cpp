// Parity with Hugging Face transformers (PyPI, pinned, in the build's venv, or the
// Python DTRAIN_TRANSFORMERS_PYTHON names):
// tiny random Llama, Qwen2 and Mistral models written by save_pretrained
// (one file and sharded; F32, BF16 and F16) are loaded into hf::CausalLm at one
// and two ranks, under DDP, FSDP and ZeRO-1, and give transformers' logits;
// a model dtrain fine-tuned and saved loads in transformers with dtrain's
// logits.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hf/parity.hpp"
#include "hf/run_logged.hpp"
#include "support/python_venv.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
using namespace dtrain;
using dtrain::testing::Expected;
using dtrain::testing::expected;
using dtrain::testing::read_text;
using dtrain::testing::require;
using dtrain::testing::run_logged;
using dtrain::testing::run_ranks;
using dtrain::testing::worst;

namespace {

// transformers 4.40.2 is the newest release that runs on Debian 12's PyTorch 1.13;
// its dependencies pinned too, so every run installs the same packages.
const char* const transformers_pin =
    "transformers==4.40.2 tokenizers==0.19.1 huggingface_hub==0.36.2 safetensors==0.8.0 regex==2026.11.19 "
    "filelock==4.3.1 fsspec==2026.9.0 hf-xet==1.8.0 tqdm==4.70.1";
// peft 0.10.0 and accelerate 0.29.3, of transformers 4.40's time, run on
// PyTorch 1.13; without their dependencies, since pip takes Debian's
// "1.13.0a0" for less than their "torch>=1.13" and would fetch a new torch
// (Jinja2 for the model card PEFT's save_pretrained writes).
const char* const peft_pin = "--no-deps peft==0.10.0 accelerate==0.29.3 jinja2==3.1.4 markupsafe==2.1.5";
const fs::path venv = fs::path(DTRAIN_TEST_BINARY_DIR) / "venv";

// The Python the comparisons run: DTRAIN_TRANSFORMERS_PYTHON when set (one
// with PyTorch and transformers of any release, e.g. transformers 5, whose
// config.json differs), else the pinned venv's.
const char* chosen_python() {
  const char* chosen = std::getenv("DTRAIN_TRANSFORMERS_PYTHON");
  return chosen != nullptr && *chosen != '\0' ? chosen : nullptr;
}
std::string python() { return chosen_python() != nullptr ? chosen_python() : (venv / "bin/python").string(); }

// A fresh model from make_tiny_lm.py in a folder of its own.
fs::path make_model(const std::string& name, const std::string& args) {
  return dtrain::testing::make_model(python(), name, args);
}

// dtrain's logits for the expected ids on `ranks` ranks under Kind, rank 0's.
template <class Kind>
std::vector<float> dtrain_logits(const fs::path& dir, const Expected& e, int ranks) {
  const hf::LmConfig config = hf::read_config(dir / "model");
  std::vector<float> out;
  run_ranks(ranks, [&](World& w) {
    hf::CausalLm model(config);
    Trainer<hf::CausalLm, Strategy<Kind>> trainer(w, model, AdamW{});
    const LoadParamsReport r = hf::load_pretrained(trainer, dir / "model", config);
    require(r.missing.empty() && r.unexpected.empty() && r.mismatched.empty(), "every tensor loads");
    Batch b;
    b.set("x", HostTensor::of(e.ids, {2, static_cast<std::int64_t>(e.ids.size()) / 2}));
    std::vector<float> logits = trainer.predict(b);
    if (w.rank() == 0) out = std::move(logits);
  });
  return out;
}

// float32 logits agree to rounding (sums of 32-40 products in another order).
constexpr double tolerance = 1e-5;

// The logits of make_tiny_lm.py's model `args` at one rank (DDP) and two (FSDP).
void logits_at_one_and_two_ranks(const std::string& name, const std::string& args, const char* label) {
  const fs::path dir = make_model(name, args);
  const Expected e = expected(dir);
  const double one = worst(dtrain_logits<DDP>(dir, e, 1), e.logits);
  const double two = worst(dtrain_logits<FSDP<FullShard>>(dir, e, 2), e.logits);
  std::printf("%s: worst relative logit difference %.2e (1 rank), %.2e (FSDP, 2 ranks)\n", label, one, two);
  BOOST_TEST(one <= tolerance);
  BOOST_TEST(two <= tolerance);
}

}  // namespace

BOOST_AUTO_TEST_CASE(llama_grouped_query_f32_one_file) {
  logits_at_one_and_two_ranks("llama_gqa", "llama 2 float32 0", "llama GQA F32");
}

BOOST_AUTO_TEST_CASE(qwen2_multi_query_bf16_sharded) {
  const fs::path dir = make_model("qwen2_mqa", "qwen2 1 bfloat16 20000");
  BOOST_TEST_REQUIRE(fs::exists(dir / "model/model.safetensors.index.json"), "the checkpoint is sharded");
  const Expected e = expected(dir);
  const double err = worst(dtrain_logits<ZeRO1>(dir, e, 2), e.logits);
  std::printf("qwen2 MQA BF16 sharded: worst relative logit difference %.2e (ZeRO-1, 2 ranks)\n", err);
  BOOST_TEST(err <= tolerance);
}

BOOST_AUTO_TEST_CASE(mistral_multi_head_f16) {
  const fs::path dir = make_model("mistral_mha", "mistral 4 float16 0");
  const Expected e = expected(dir);
  const double err = worst(dtrain_logits<FSDP<ShardGradOp>>(dir, e, 2), e.logits);
  std::printf("mistral MHA F16: worst relative logit difference %.2e (FSDP grad-op, 2 ranks)\n", err);
  BOOST_TEST(err <= tolerance);
}

BOOST_AUTO_TEST_CASE(gpt2_tied_f32) { logits_at_one_and_two_ranks("gpt2", "gpt2 4 float32 0", "gpt2 (tied) F32"); }
// Gemma (tied, GQA) as transformers 4.40 computes it; Gemma 3 needs transformers 5: gemma_transformers_test.
BOOST_AUTO_TEST_CASE(gemma_gqa_f32) { logits_at_one_and_two_ranks("gemma", "gemma 2 float32 0", "gemma GQA F32"); }

namespace {

void training_parity(const std::string& name, const std::string& args, std::int64_t pad = 0,
                     const std::string& lora_targets = "") {
  dtrain::testing::training_parity<Host>({.python = python(), .torch_device = "cpu"}, name, args, pad, lora_targets);
}

}  // namespace

BOOST_AUTO_TEST_CASE(gpt2_trains_like_transformers) { training_parity("gpt2_train", "gpt2 4 float32 0"); }
BOOST_AUTO_TEST_CASE(tied_llama_gqa_trains_like_transformers) {
  training_parity("llama_tied_train", "llama_tied 2 float32 0");
}
BOOST_AUTO_TEST_CASE(llama_mha_trains_like_transformers) { training_parity("llama_mha_train", "llama 4 float32 0"); }
BOOST_AUTO_TEST_CASE(gemma_trains_like_transformers) { training_parity("gemma_train", "gemma 2 float32 0"); }
// Left padding through attention_mask.
BOOST_AUTO_TEST_CASE(padded_gpt2_trains_like_transformers) { training_parity("gpt2_padded", "gpt2 4 float32 0", 3); }
BOOST_AUTO_TEST_CASE(padded_llama_trains_like_transformers) { training_parity("llama_padded", "llama 2 float32 0", 3); }

// Fine-tuned by dtrain (two AdamW steps under FSDP at two ranks), saved with
// hf::save_pretrained, loaded by transformers: the same logits.
namespace {

// The expected ids [2, T] as x, the next ids as y (-100 after the last).
Batch next_token_batch(const Expected& e) {
  const auto t = static_cast<std::int64_t>(e.ids.size()) / 2;
  std::vector<std::int64_t> next(e.ids.begin() + 1, e.ids.end());
  next.push_back(-100);
  Batch b;
  b.set("x", HostTensor::of(e.ids, {2, t}));
  b.set("y", HostTensor::of(next, {2, t}));
  return b;
}

void fine_tuned_model_loads_in_transformers(const std::string& name, const std::string& args) {
  const fs::path dir = make_model(name + "_to_tune", args);
  const Expected e = expected(dir);
  const fs::path pretrained = dir / "model", saved = fs::path(DTRAIN_TEST_BINARY_DIR) / "models" / (name + "_tuned");
  fs::remove_all(saved);
  std::vector<float> ours;
  run_ranks(2, [&](World& w) {
    const Batch b = next_token_batch(e);
    // [snippet:hf_fine_tune]
    const hf::LmConfig config = hf::read_config(pretrained);  // its config.json, checked
    hf::CausalLm model(config);
    Trainer<hf::CausalLm, Strategy<FSDP<FullShard>>> trainer(w, model, AdamW{.lr = 1e-2f});
    hf::load_pretrained(trainer, pretrained, config);  // each rank reads only what it owns
    for (int s = 0; s < 2; ++s) trainer.step(std::span(&b, 1));
    hf::save_pretrained(trainer, saved, config);  // what from_pretrained reads
    // [/snippet:hf_fine_tune]
    std::vector<float> logits = trainer.predict(b);
    if (w.rank() == 0) ours = std::move(logits);
  });
  const fs::path out = saved.parent_path() / (name + "_tuned_logits.safetensors");
  const fs::path log = saved.parent_path() / (name + "_tuned_log.txt");
  BOOST_TEST_REQUIRE(run_logged(python() + " " + DTRAIN_SOURCE_DIR + "/tests/hf/transformers_logits.py " +
                                    saved.string() + " " + (dir / "expected.safetensors").string() + " " + out.string(),
                                log) == 0,
                     "transformers could not load the saved model: " << read_text(log));
  const std::vector<float> theirs = SafetensorsFile::open(out).read_f32("logits");
  const double moved = worst(ours, e.logits), err = worst(ours, theirs);
  std::printf("fine-tuned %s: logits moved %.2e by training; transformers on dtrain's save differs by %.2e\n",
              name.c_str(), moved, err);
  BOOST_TEST(moved > 1e-3, "training changed the model");
  BOOST_TEST(err <= tolerance);
}

}  // namespace

BOOST_AUTO_TEST_CASE(fine_tuned_llama_loads_in_transformers) {
  fine_tuned_model_loads_in_transformers("llama", "llama 2 float32 0");
}
BOOST_AUTO_TEST_CASE(fine_tuned_gpt2_loads_in_transformers) {
  fine_tuned_model_loads_in_transformers("gpt2", "gpt2 4 float32 0");
}

// LoRA both ways with the peft library: an adapter PEFT made (A and B random)
// loads into dtrain and gives PEFT's logits, at one rank (DDP) and two
// (FSDP); trained on by dtrain (two AdamW steps under FSDP at two ranks) and
// saved with hf::save_adapter, PEFT loads it and gives dtrain's logits.
namespace {

bool peft_importable() {
  return run_logged(python() + " -c 'import peft'", fs::path(DTRAIN_TEST_BINARY_DIR) / "peft_import.log") == 0;
}

// dtrain's logits for e's ids with the adapter in `adapter` on the model in
// `model`, after `steps` AdamW steps on them; saves the adapter to `save` if given.
template <class Kind>
std::vector<float> adapted_logits(const fs::path& model, const fs::path& adapter, const Expected& e, int ranks,
                                  int steps = 0, const fs::path& save = {}) {
  std::vector<float> out;
  run_ranks(ranks, [&](World& w) {
    const Batch b = next_token_batch(e);
    const hf::LmConfig config = hf::read_config(model);
    hf::CausalLm lm(config, hf::read_adapter_config(adapter));
    Trainer<hf::CausalLm, Strategy<Kind>> trainer(w, lm, AdamW{.lr = 1e-2f});
    hf::load_pretrained(trainer, model, config);
    const LoadParamsReport r = hf::load_adapter(trainer, adapter, lm);
    require(!r.loaded.empty(), "the adapter loads");
    for (int s = 0; s < steps; ++s) trainer.step(std::span(&b, 1));
    if (!save.empty()) hf::save_adapter(trainer, save, lm, model.string());
    std::vector<float> logits = trainer.predict(b);
    if (w.rank() == 0) out = std::move(logits);
  });
  return out;
}

// `modules`: PEFT's modules_to_save (comma-separated), trained whole beside the adapters.
void lora_both_ways_with_peft(const std::string& name, const std::string& args, const std::string& targets,
                              const std::string& modules = "") {
  const fs::path dir = make_model(name + "_lora", args);
  const Expected e = expected(dir);
  const fs::path model = dir / "model", theirs = dir / "peft_adapter", ours = dir / "dtrain_adapter";
  const std::string script = python() + " " + DTRAIN_SOURCE_DIR + "/tests/hf/peft_adapter.py ";
  const std::string ids = (dir / "expected.safetensors").string();
  BOOST_TEST_REQUIRE(run_logged(script + "make " + model.string() + " " + theirs.string() + " " + ids + " " +
                                    (dir / "peft_logits.safetensors").string() + " " + targets + " 4 8 " + modules,
                                dir / "peft_make.log") == 0,
                     read_text(dir / "peft_make.log"));
  const std::vector<float> want = SafetensorsFile::open(dir / "peft_logits.safetensors").read_f32("logits");
  const double moved = worst(want, e.logits);
  const double one = worst(adapted_logits<DDP>(model, theirs, e, 1), want);
  const double two = worst(adapted_logits<FSDP<FullShard>>(model, theirs, e, 2), want);
  const std::vector<float> trained = adapted_logits<FSDP<FullShard>>(model, theirs, e, 2, 2, ours);
  BOOST_TEST_REQUIRE(run_logged(script + "load " + model.string() + " " + ours.string() + " " + ids + " " +
                                    (dir / "peft_reload.safetensors").string(),
                                dir / "peft_load.log") == 0,
                     "peft could not load dtrain's adapter: " << read_text(dir / "peft_load.log"));
  const double back = worst(trained, SafetensorsFile::open(dir / "peft_reload.safetensors").read_f32("logits"));
  std::printf(
      "%s LoRA (%s%s%s): PEFT's adapter moves the logits %.2e; dtrain with it differs by %.2e (1 rank), "
      "%.2e (FSDP, 2 ranks); PEFT with dtrain's trained adapter differs by %.2e\n",
      name.c_str(), targets.c_str(), modules.empty() ? "" : "; modules_to_save ", modules.c_str(), moved, one, two,
      back);
  BOOST_TEST(moved > 1e-3, "the adapter changes the model");
  BOOST_TEST(worst(trained, want) > 1e-4, "training changed the adapter");
  BOOST_TEST(one <= tolerance);
  BOOST_TEST(two <= tolerance);
  BOOST_TEST(back <= tolerance);
}

}  // namespace

BOOST_AUTO_TEST_CASE(llama_lora_both_ways_with_peft,
                     *boost::unit_test::precondition([](auto) { return peft_importable(); })) {
  lora_both_ways_with_peft("llama", "llama 2 float32 0", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
}
BOOST_AUTO_TEST_CASE(gpt2_lora_both_ways_with_peft,
                     *boost::unit_test::precondition([](auto) { return peft_importable(); })) {
  lora_both_ways_with_peft("gpt2", "gpt2 4 float32 0", "c_attn,c_proj,c_fc");
}
// An adapter on the (untied) output head as well, which all-linear leaves out.
BOOST_AUTO_TEST_CASE(llama_lora_on_lm_head_both_ways_with_peft,
                     *boost::unit_test::precondition([](auto) { return peft_importable(); })) {
  lora_both_ways_with_peft("llama_head", "llama 2 float32 0", "q_proj,v_proj,lm_head");
}
BOOST_AUTO_TEST_CASE(llama_lora_with_modules_to_save_both_ways_with_peft,
                     *boost::unit_test::precondition([](auto) { return peft_importable(); })) {
  lora_both_ways_with_peft("llama_saved", "llama 2 float32 0", "q_proj,v_proj", "embed_tokens,lm_head");
}

// LoRA training against PEFT + torch's AdamW: the first step's loss and the
// adapters' gradients, and the adapters after 20 steps, at 1 and 2 ranks
// under DDP and fsdp-full (the bounds of the full fine-tuning parity).
BOOST_AUTO_TEST_CASE(llama_lora_trains_like_peft,
                     *boost::unit_test::precondition([](auto) { return peft_importable(); })) {
  training_parity("llama_lora_train", "llama 2 float32 0", 0,
                  "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
}
// A Llama whose head is tied to its embedding (both frozen under the adapters), GQA.
BOOST_AUTO_TEST_CASE(tied_llama_lora_trains_like_peft,
                     *boost::unit_test::precondition([](auto) { return peft_importable(); })) {
  training_parity("llama_tied_lora_train", "llama_tied 2 float32 0", 0,
                  "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
}
BOOST_AUTO_TEST_CASE(llama_lora_on_lm_head_trains_like_peft,
                     *boost::unit_test::precondition([](auto) { return peft_importable(); })) {
  training_parity("llama_lora_head_train", "llama 2 float32 0", 0, "q_proj,v_proj,lm_head");
}
BOOST_AUTO_TEST_CASE(gpt2_lora_trains_like_peft,
                     *boost::unit_test::precondition([](auto) { return peft_importable(); })) {
  training_parity("gpt2_lora_train", "gpt2 4 float32 0", 0, "c_attn,c_proj,c_fc");
}

// The train_lm example on two ranks: fine-tunes the tiny Llama on a token
// stream, its loss falls, and transformers loads what it saved; an id
// outside the vocabulary is exit status 2 naming the token.
BOOST_AUTO_TEST_CASE(train_lm_fine_tunes_and_saves) {
  const fs::path dir = make_model("llama_for_train_lm", "llama 2 bfloat16 20000");
  const fs::path work = fs::path(DTRAIN_TEST_BINARY_DIR) / "train_lm";
  fs::remove_all(work);
  fs::create_directories(work);
  const std::string py = python();
  BOOST_TEST_REQUIRE(run_logged(py + " -c \"import numpy as np; np.save('" + (work / "tokens.npy").string() +
                                    "', np.tile(np.arange(0, 61, 3, dtype=np.int32), 200)); np.save('" +
                                    (work / "bad.npy").string() + "', np.array([1, 2, 61] * 400, dtype=np.int64))\"",
                                work / "numpy.log") == 0);
  // The host preset, shortened: a constant rate, no warm-up, 30 steps.
  const std::string run = std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 2 " + TRAIN_LM_PATH + " --config " +
                          DTRAIN_SOURCE_DIR +
                          "/examples/configs/lm_finetune_host.yaml model=" + (dir / "model").string() +
                          " block_size=16 batch_size=8 lr=3e-3 schedule=constant warmup_steps=0 clip=0 steps=30 "
                          "log_every=10 peak_tflops=0.5 ";
  const fs::path saved = work / "tuned";
  BOOST_TEST_REQUIRE(run_logged(run + "strategy=fsdp-full generate=4 data=" + (work / "tokens.npy").string() +
                                    " save_hf=" + saved.string(),
                                work / "train.log") == 0,
                     read_text(work / "train.log"));
  const std::string log = read_text(work / "train.log");
  BOOST_TEST(log.find("loaded 19 tensor(s)") != std::string::npos, log);
  BOOST_TEST(log.find("peak resident set per rank after loading (before): rank 0 ") != std::string::npos, log);
  BOOST_TEST(log.find(" TFLOP/s/rank | MFU ") != std::string::npos, log);
  const auto gen = log.find("generate (greedy):");
  BOOST_TEST_REQUIRE(gen != std::string::npos, log);
  const std::string line = log.substr(gen, log.find('\n', gen) - gen);
  BOOST_TEST(std::count(line.begin(), line.end(), ' ') == 1 + 8 + 1 + 4, line);  // the label, 8 prompt ids, " |", 4 new
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

  BOOST_TEST(run_logged(run + "data=" + (work / "bad.npy").string(), work / "bad.log") == 2);
  const std::string bad = read_text(work / "bad.log");
  BOOST_TEST(bad.find("token 2 is id 61, outside the model's vocabulary of 61") != std::string::npos, bad);
}

// scripts/tokenize_data.py writes a token stream with a tokenizer.json, and
// train_lm trains on it; a missing tokenizer is one line and status 2.
BOOST_AUTO_TEST_CASE(tokenize_data_feeds_train_lm) {
  const fs::path dir = make_model("llama_for_tokens", "llama 4 float32 0");
  const fs::path work = fs::path(DTRAIN_TEST_BINARY_DIR) / "tokenize";
  fs::remove_all(work);
  fs::create_directories(work);
  const std::string py = python(), src = DTRAIN_SOURCE_DIR;
  BOOST_TEST_REQUIRE(
      run_logged(py + " " + src + "/tests/hf/make_tokenizer.py " + work.string(), work / "make.log") == 0,
      read_text(work / "make.log"));
  const std::string script = py + " " + src + "/scripts/tokenize_data.py ";
  BOOST_TEST_REQUIRE(run_logged(script + "--tokenizer " + (work / "tokenizer.json").string() + " --out " +
                                    (work / "text.bin").string() + " " + (work / "text.txt").string(),
                                work / "tokenize.log") == 0,
                     read_text(work / "tokenize.log"));
  BOOST_TEST(read_text(work / "tokenize.log").find("6000 tokens, ids of 2 bytes") != std::string::npos,
             read_text(work / "tokenize.log"));
  const std::string header = read_text(work / "text.bin").substr(0, 8);
  BOOST_TEST(header == "DTRNTOK1");
  BOOST_TEST(fs::file_size(work / "text.bin") == 16u + 2u * 6000u);
  BOOST_TEST(run_logged(std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 2 " + TRAIN_LM_PATH +
                            " model=" + (dir / "model").string() + " data=" + (work / "text.bin").string() +
                            " block_size=16 batch_size=4 steps=5",
                        work / "train.log") == 0,
             read_text(work / "train.log"));
  BOOST_TEST(run_logged(script + "--tokenizer " + (work / "none.json").string() + " --out " +
                            (work / "x.bin").string() + " " + (work / "text.txt").string(),
                        work / "bad.log") == 2);
  const std::string bad = read_text(work / "bad.log");
  BOOST_TEST(bad.starts_with("tokenize_data.py: error: no tokenizer at"), bad);
  BOOST_TEST(!fs::exists(work / "x.bin"));
}

static bool init_unit_test() { return true; }

int main(int argc, char* argv[]) {
  if (const char* chosen = chosen_python()) {
    std::printf("transformers from DTRAIN_TRANSFORMERS_PYTHON=%s\n", chosen);
  } else if (const std::string why = dtrain::testing::python_venv_with(venv, "transformers", transformers_pin, 600);
             !why.empty()) {
    std::printf("%s: test skipped (exit 77)\n", why.c_str());
    return 77;
  } else if (const std::string no_peft = dtrain::testing::python_venv_with(venv, "peft", peft_pin, 600);
             !no_peft.empty()) {
    std::printf("%s: the LoRA cases are skipped\n", no_peft.c_str());
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
