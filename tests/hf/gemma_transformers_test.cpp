// Gemma, Gemma 3's text model and Qwen3 against transformers 5 (the pinned torch2
// set, scripts/python/torch2.txt; CTest names its python in
// DTRAIN_PYTHON_TORCH2): tiny random models from make_tiny_lm.py, whose
// Gemma 3 has local and global layers, a sliding window shorter than the
// sequence, QK-norm, query_pre_attn_scalar and linear rope scaling on the
// global layer. Their logits at one and two ranks, the first step's loss and
// gradients and 20 AdamW steps at one and two ranks, and a model dtrain
// fine-tuned and saved loads in transformers with dtrain's logits.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "hf/parity.hpp"
#include "hf/run_logged.hpp"
#include "support/pinned_main.hpp"
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
using dtrain::testing::run_logged;
using dtrain::testing::run_ranks;
using dtrain::testing::worst;

namespace {

std::string python() { return dtrain::testing::pinned_python("torch2"); }

// float32 logits agree to rounding, as in hf_transformers_test.
constexpr double tolerance = 1e-5;

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

// dtrain's logits for the expected ids on `ranks` ranks under Kind (rank
// 0's), after `steps` AdamW steps; the model is then saved to `save` if given.
template <class Kind>
std::vector<float> dtrain_logits(const fs::path& model, const Expected& e, int ranks, int steps = 0,
                                 const fs::path& save = {}) {
  const hf::LmConfig config = hf::read_config(model);
  std::vector<float> out;
  run_ranks(ranks, [&](World& w) {
    hf::CausalLm lm(config);
    Trainer<hf::CausalLm, Strategy<Kind>> trainer(w, lm, AdamW{.lr = 1e-2f});
    const LoadParamsReport r = hf::load_pretrained(trainer, model, config);
    dtrain::testing::require(r.missing.empty() && r.unexpected.empty() && r.mismatched.empty(), "every tensor loads");
    const Batch b = next_token_batch(e);
    for (int s = 0; s < steps; ++s) trainer.step(std::span(&b, 1));
    if (!save.empty()) hf::save_pretrained(trainer, save, config);
    std::vector<float> logits = trainer.predict(b);
    if (w.rank() == 0) out = std::move(logits);
  });
  return out;
}

// Two AdamW steps under FSDP at two ranks, hf::save_pretrained, and
// transformers' from_pretrained on the result: dtrain's logits.
void fine_tuned_model_loads_in_transformers(const std::string& name, const fs::path& dir, const Expected& e) {
  const fs::path saved = dir / "tuned", out = dir / "tuned_logits.safetensors";
  const std::vector<float> ours = dtrain_logits<FSDP<FullShard>>(dir / "model", e, 2, 2, saved);
  BOOST_TEST_REQUIRE(run_logged(python() + " " + DTRAIN_SOURCE_DIR + "/tests/hf/transformers_logits.py " +
                                    saved.string() + " " + (dir / "expected.safetensors").string() + " " + out.string(),
                                dir / "tuned_log.txt") == 0,
                     "transformers could not load the saved model: " << read_text(dir / "tuned_log.txt"));
  const double moved = worst(ours, e.logits), err = worst(ours, SafetensorsFile::open(out).read_f32("logits"));
  std::printf("fine-tuned %s: logits moved %.2e by training; transformers on dtrain's save differs by %.2e\n",
              name.c_str(), moved, err);
  BOOST_TEST(moved > 1e-3, "training changed the model");
  BOOST_TEST(err <= tolerance);
}

enum class AndFineTune : bool { no, yes };

// The logits at one rank and under FSDP at two; with AndFineTune::yes, then
// the fine-tuned model's round trip through transformers, on the same model
// (one Python run fewer than a model of its own).
void logits_at_one_and_two_ranks(const std::string& name, const std::string& args,
                                 AndFineTune fine_tune = AndFineTune::no) {
  const fs::path dir = dtrain::testing::make_model(python(), name, args);
  const Expected e = expected(dir);
  const double one = worst(dtrain_logits<DDP>(dir / "model", e, 1), e.logits);
  const double two = worst(dtrain_logits<FSDP<FullShard>>(dir / "model", e, 2), e.logits);
  std::printf("%s: worst relative logit difference %.2e (1 rank), %.2e (FSDP, 2 ranks)\n", name.c_str(), one, two);
  BOOST_TEST(one <= tolerance);
  BOOST_TEST(two <= tolerance);
  if (fine_tune == AndFineTune::yes) fine_tuned_model_loads_in_transformers(name, dir, e);
}

// `lora_targets`: PEFT's LoRA adapters on them, trained on the frozen base (parity.hpp).
void training_parity(const std::string& name, const std::string& args, const std::string& lora_targets = "") {
  dtrain::testing::training_parity<Host>({.python = python(), .torch_device = "cpu"}, name, args, 0, lora_targets);
}

}  // namespace

// Each model's logits, then (AndFineTune::yes) a model dtrain fine-tuned and
// saved, loaded by transformers.
BOOST_AUTO_TEST_CASE(gemma_f32) { logits_at_one_and_two_ranks("gemma_t5", "gemma 2 float32 0", AndFineTune::yes); }
BOOST_AUTO_TEST_CASE(gemma3_text_f32) {
  logits_at_one_and_two_ranks("gemma3_t5", "gemma3 2 float32 0", AndFineTune::yes);
}
BOOST_AUTO_TEST_CASE(gemma3_text_bf16_sharded) {
  logits_at_one_and_two_ranks("gemma3_bf16", "gemma3 1 bfloat16 20000");
}

// Qwen3, also newer than transformers 4.40: QK-norm and a head_dim apart from hidden_size / heads.
BOOST_AUTO_TEST_CASE(qwen3_f32) { logits_at_one_and_two_ranks("qwen3", "qwen3 2 float32 0", AndFineTune::yes); }
BOOST_AUTO_TEST_CASE(qwen3_trains_like_transformers) { training_parity("qwen3_train", "qwen3 2 float32 0"); }

// Gemma 3's text model trains with everything Gemma's does (the scaled
// embedding, RMSNorm's (1 + w), tanh GELU) and more, so Gemma's own training
// run is left to it.
BOOST_AUTO_TEST_CASE(gemma3_text_trains_like_transformers) { training_parity("gemma3_train", "gemma3 2 float32 0"); }

BOOST_AUTO_TEST_CASE(gemma3_text_lora_trains_like_peft) {
  training_parity("gemma3_lora_train", "gemma3 2 float32 0", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
}

// Skipped with the fixture that makes the pinned set's venv when it cannot be installed here.
int main(int argc, char* argv[]) { return dtrain::testing::main_needing_set("torch2", argc, argv); }
