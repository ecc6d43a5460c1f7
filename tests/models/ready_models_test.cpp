// The ready models (dtrain/models/): their units and parameter names, the
// character GPT's tokenizer and generated text, the policy's widths, and
// the run keys' TrainerOptions with the errors that name a key. The
// examples train them (tests/examples) and dtrain-estimate sizes them
// (tests/tools).
#define BOOST_TEST_MODULE ready_models
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <dtrain/models/causal_lm.hpp>
#include <dtrain/models/gpt.hpp>
#include <dtrain/models/mlp.hpp>
#include <dtrain/models/policy.hpp>
#include <dtrain/train/estimate.hpp>

using namespace dtrain;

namespace {

// "<unit>.<param>" of every parameter, in order.
template <class Model>
std::vector<std::string> parameter_names(Model& model) {
  std::vector<std::string> names;
  detail::for_each_unit(model.units(), [&](std::size_t u, auto& unit) {
    for (const ParamSpec& p : unit.params()) names.push_back(std::to_string(u) + "." + p.name);
  });
  return names;
}

std::string refusal(const models::RunConfig& c) {
  try {
    (void)models::trainer_options(c);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// The units docs/model.md describes: embeddings, the blocks from unit 2, the final norm, an untied head.
BOOST_AUTO_TEST_CASE(gpt_units_are_numbered_as_documented) {
  models::Gpt gpt(11, 8, 2, 2, 16);
  const auto names = parameter_names(gpt);
  BOOST_TEST(declared_units(gpt).size() == 6u);
  for (const char* name : {"0.weight", "1.weight", "2.attn.qkv.weight", "3.attn.qkv.weight", "4.weight", "5.weight"})
    BOOST_TEST((std::find(names.begin(), names.end(), name) != names.end()), name);
  BOOST_TEST((std::find(names.begin(), names.end(), "5.bias") == names.end()), "the head has no bias");
}

// The corpus is the same for a seed, of the size asked; its characters are the vocabulary.
BOOST_AUTO_TEST_CASE(gpt_text_and_tokenizer) {
  const std::string text = models::generate_corpus(5000, 3);
  BOOST_TEST(text.size() == 5000u);
  BOOST_TEST(text == models::generate_corpus(5000, 3));
  BOOST_TEST(text != models::generate_corpus(5000, 4));
  const models::CharTokenizer tok("abca");
  BOOST_TEST(tok.vocab() == 3);
  BOOST_TEST((tok.encode("cab") == std::vector<std::int32_t>{2, 0, 1}));
  models::GptConfig c;
  c.corpus_bytes = 5000;
  const models::Corpus corpus = models::make_corpus(c);
  BOOST_TEST(corpus.tokens.size() == 5000u);
  BOOST_TEST(corpus.split == 4500);
  c.block_size = 600;  // more than the held-out tenth
  BOOST_CHECK_EXCEPTION(models::make_corpus(c), config_error, [](const config_error& e) {
    return std::string(e.what()).find("too few for windows of block_size 600") != std::string::npos;
  });
  c.data = "/nonexistent/text.txt";
  BOOST_CHECK_THROW(models::make_corpus(c), config_error);
}

// Linear and activation per hidden width, then the head; the policy's widths come from its keys.
BOOST_AUTO_TEST_CASE(mlp_and_policy_widths) {
  models::MlpConfig m;
  m.hidden = {8, 4};
  models::MlpClassifier classifier(m, 5, 3);
  BOOST_TEST(classifier.layers.size() == 5u);
  BOOST_TEST((parameter_names(classifier) ==
              std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
  BOOST_TEST(declared_units(classifier)[4].trainable == 4u * 3u + 3u);
  models::PolicyConfig p;
  p.hidden = {16};
  p.horizon = 3;
  p.image = true;
  p.image_size = 4;
  BOOST_TEST(models::observation_dim(p) == 6 + 16);
  models::Policy policy(p);
  BOOST_TEST(declared_units(policy)[0].trainable == (6u + 16u) * 16u + 16u);
  BOOST_TEST(declared_units(policy)[2].trainable == 16u * 6u + 6u);  // action_dim x horizon outputs
}

// The run keys' TrainerOptions, and the keys out of range named.
BOOST_AUTO_TEST_CASE(run_keys_give_trainer_options) {
  models::RunConfig c;
  c.offload = "nvme:/tmp/state";
  c.activation_checkpointing = true;
  c.checkpoint_budget_mib = 1e-9;  // rounds to no bytes: kept as the smallest budget
  const TrainerOptions o = models::trainer_options(c);
  BOOST_TEST((o.offload == offload_kind::optimizer));
  BOOST_TEST(o.offload_dir == "/tmp/state");
  BOOST_TEST(o.checkpoint_budget_bytes == 1u);
  c = {};
  c.offload = "nvme:";
  BOOST_TEST(refusal(c).find("offload=nvme: names no directory") != std::string::npos);
  c = {};
  c.checkpoint_every = 2;
  BOOST_TEST(refusal(c).find("without activation_checkpointing=true") != std::string::npos);
}

// LoRA from the lora_ keys, or from an adapter directory's adapter_config.json.
BOOST_AUTO_TEST_CASE(causal_lm_adapters_from_keys_or_adapter) {
  models::CausalLmConfig c;
  c.lora_r = 4;
  c.lora_targets = {"q_proj"};
  const hf::LoraConfig keys = c.lora();
  BOOST_TEST(keys.r == 4);
  BOOST_TEST(keys.alpha == 8.f);
  BOOST_TEST(!keys.regex);
  const auto dir = std::filesystem::path(DTRAIN_TEST_BINARY_DIR) / "ready_models_adapter";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "adapter_config.json")
      << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 16, "target_modules": ".*\\.v_proj", "bias": "none"})";
  c.adapter = dir.string();
  const hf::LoraConfig adapter = c.lora();
  BOOST_TEST(adapter.r == 2);
  BOOST_TEST(adapter.regex);
  BOOST_TEST(adapter.targets == std::vector<std::string>{R"(.*\.v_proj)"}, boost::test_tools::per_element());
}
