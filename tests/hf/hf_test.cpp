// dtrain/hf without Python: config.json checks, and a Llama saved in the
// transformers layout and loaded back (sharded, across strategies and world
// sizes) bit for bit; bad configs and checkpoints fail with one clear error.
#define BOOST_TEST_MODULE hf
#include <filesystem>
#include <fstream>
#include <list>
#include <string>

#include "hf/run_logged.hpp"
#include "lm/lm.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
using namespace dtrain;
using dtrain::testing::read_text;
using dtrain::testing::require;
using dtrain::testing::run_logged;
using dtrain::testing::run_ranks;
using Json = nlohmann::ordered_json;

namespace {

Json tiny_llama() {
  return Json{
      {"model_type", "llama"},  {"vocab_size", 37},         {"hidden_size", 16},        {"intermediate_size", 24},
      {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 8},
      {"rms_norm_eps", 1e-5},   {"rope_theta", 10000.0},    {"hidden_act", "silu"},     {"tie_word_embeddings", false}};
}

Json tiny_gpt2() {
  return Json{{"model_type", "gpt2"},
              {"vocab_size", 37},
              {"n_embd", 16},
              {"n_layer", 2},
              {"n_head", 4},
              {"n_positions", 8},
              {"n_inner", nullptr},
              {"layer_norm_epsilon", 1e-5},
              {"activation_function", "gelu_new"}};
}

// The config error's text, or "" when it parses.
std::string config_error_of(const Json& j) {
  try {
    hf::parse_config(j, "config.json");
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

fs::path fresh(const std::string& name) {
  const fs::path d = fs::path(DTRAIN_TEST_BINARY_DIR) / name;
  fs::remove_all(d);
  return d;
}

using Params = std::map<std::string, std::vector<float>>;

// Trains a Llama of `config` for two steps (so nothing is at its init), saves
// it in the transformers layout with small shards, and returns its parameters.
Params train_and_save(const hf::LmConfig& config, const fs::path& dir) {
  Params out;
  run_ranks(1, [&](World& w) {
    hf::CausalLm model(config);
    Trainer<hf::CausalLm> trainer(w, model, AdamW{.lr = 1e-2f}, {.seed = 3});
    std::vector<std::int32_t> ids(2 * 6);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7 + 3) % 37);
    Batch b;
    b.set("x", HostTensor::of(ids, {2, 6}));
    std::rotate(ids.begin(), ids.begin() + 1, ids.end());
    b.set("y", HostTensor::of(ids, {2, 6}));
    for (int s = 0; s < 2; ++s) trainer.step(std::span(&b, 1));
    hf::save_pretrained(trainer, dir, config, {.max_shard_bytes = 4096});
    out = trainer.parameters();
  });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(config_is_read_and_checked) {
  const hf::LmConfig c = hf::parse_config(tiny_llama(), "config.json");
  BOOST_TEST(c.head_dim() == 4);
  BOOST_TEST(c.num_key_value_heads == 2);
  BOOST_TEST(!c.qkv_bias);
  Json qwen = tiny_llama();
  qwen["model_type"] = "qwen2";
  BOOST_TEST(hf::parse_config(qwen, "q").qkv_bias);
  BOOST_TEST(!hf::parse_config(qwen, "q").out_bias);
  Json no_kv = tiny_llama();
  no_kv.erase("num_key_value_heads");
  BOOST_TEST(hf::parse_config(no_kv, "c").num_key_value_heads == 4);

  const auto fails_with = [](Json j, const std::string& text) {
    const std::string e = config_error_of(j);
    BOOST_TEST(e.find(text) != std::string::npos, "'" << e << "' should mention '" << text << "'");
  };
  Json j = tiny_llama();
  j["model_type"] = "gpt_neox";
  fails_with(j, "supported: gpt2, llama, mistral, qwen2");
  j = tiny_llama();
  j.erase("hidden_size");
  fails_with(j, "\"hidden_size\" is missing");
  j = tiny_llama();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  fails_with(j, "rope_scaling");
  // transformers 5 writes the rotary base inside rope_parameters.
  j = tiny_llama();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_theta", 500.0}, {"rope_type", "default"}};
  BOOST_TEST(hf::parse_config(j, "v5").rope_theta == 500.f);
  j["rope_theta"] = 500.0;  // both, agreeing
  BOOST_TEST(hf::parse_config(j, "both").rope_theta == 500.f);
  j["rope_theta"] = 10000.0;
  fails_with(j, "disagree");
  j = tiny_llama();
  j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0}};
  fails_with(j, "rope_type \"llama3\" is not supported");
  j["rope_parameters"] = {{"rope_theta", 500.0}, {"partial_rotary_factor", 0.5}};
  fails_with(j, "key \"partial_rotary_factor\"");
  j["rope_parameters"] = 500.0;
  fails_with(j, "is not an object");
  j = tiny_llama();
  j["tie_word_embeddings"] = true;
  BOOST_TEST(hf::parse_config(j, "tied").tie_word_embeddings);
  j = tiny_llama();
  j["hidden_act"] = "gelu";
  fails_with(j, "hidden_act \"gelu\"");
  j = tiny_llama();
  j["num_key_value_heads"] = 3;
  fails_with(j, "do not divide");
  j = tiny_llama();
  j["model_type"] = "mistral";
  j["sliding_window"] = 4;
  fails_with(j, "sliding_window 4");
  j = tiny_llama();
  j["vocab_size"] = "many";
  fails_with(j, "must be a number");
  // A float where a size belongs, or beyond int64's range, is refused by
  // name (1.7e44 was undefined behaviour before; found by fuzzing), and so
  // is a rotary base beyond float's range.
  for (const double bad : {16.5, 1.7e44}) {
    j = tiny_llama();
    j["hidden_size"] = bad;
    fails_with(j, "\"hidden_size\" must be a number (a whole one in range)");
  }
  j = tiny_llama();
  j["num_hidden_layers"] = 18446744073709551615ull;
  fails_with(j, "\"num_hidden_layers\" must be a number (a whole one in range)");
  j = tiny_llama();
  j["vocab_size"] = 1LL << 40;
  j["hidden_size"] = 1LL << 30;
  fails_with(j, "parameters, more than the 2^53 dtrain can address");
  // GPT-2's n_inner defaults to 4 x n_embd, which overflowed for a huge n_embd.
  Json huge = tiny_gpt2();
  huge["n_embd"] = 4999999999999999999LL;
  fails_with(huge, "parameters, more than the 2^53 dtrain can address");
  j = tiny_llama();
  j["rope_theta"] = 1e300;
  fails_with(j, "\"rope_theta\" must be a number (finite, in float's range)");
  BOOST_CHECK_THROW(hf::read_config(fresh("no_such_model")), config_error);

  // GPT-2: its own key names, 4 x n_embd when n_inner is null, tied by default.
  const hf::LmConfig g = hf::parse_config(tiny_gpt2(), "gpt2.json");
  BOOST_TEST(g.gpt2());
  BOOST_TEST(g.intermediate_size == 64);
  BOOST_TEST(g.tie_word_embeddings);
  BOOST_TEST(g.max_position_embeddings == 8);
  j = tiny_gpt2();
  j.erase("n_embd");
  fails_with(j, "\"n_embd\" is missing");
  j = tiny_gpt2();
  j["activation_function"] = "relu";
  fails_with(j, "activation_function \"relu\"");
  j = tiny_gpt2();
  j["scale_attn_by_inverse_layer_idx"] = true;
  fails_with(j, "scale_attn_by_inverse_layer_idx");
  j = tiny_gpt2();
  j["n_head"] = 3;
  fails_with(j, "n_embd 16, n_head 3");
}

// Gemma and Gemma 3's text model: transformers' defaults (tied, head_dim
// 256, every sixth layer global), both rope layouts (transformers 4's
// rope_theta, rope_local_base_freq and rope_scaling; 5's rope_parameters per
// layer type), and what dtrain refuses, by name.
BOOST_AUTO_TEST_CASE(gemma_configs_are_read_and_checked) {
  Json gemma = tiny_llama();
  gemma.erase("tie_word_embeddings");
  gemma["model_type"] = "gemma";
  gemma["hidden_act"] = "gelu";  // transformers 4's Gemma ignores it, 5 reads it as the tanh GELU
  gemma["head_dim"] = 4;
  const hf::LmConfig g = hf::parse_config(gemma, "gemma");
  BOOST_TEST((g.gemma() && !g.gemma3() && g.tie_word_embeddings));
  BOOST_TEST(g.local_layers.empty());
  const auto fails_with = [](Json j, const std::string& text) {
    const std::string e = config_error_of(j);
    BOOST_TEST(e.find(text) != std::string::npos, "'" << e << "' should mention '" << text << "'");
  };
  Json j = gemma;
  j["hidden_activation"] = "gelu";
  fails_with(j, "hidden_activation \"gelu\" is not supported");
  j = gemma;
  j.erase("head_dim");  // transformers' default, 256, apart from hidden_size / num_attention_heads
  BOOST_TEST(hf::parse_config(j, "256").head_dim() == 256);
  j["head_dim"] = 7;
  fails_with(j, "head_dim 7 is not supported");
  j = gemma;
  j["use_bidirectional_attention"] = true;
  fails_with(j, "use_bidirectional_attention true");

  Json g3 = gemma;
  g3["model_type"] = "gemma3_text";
  g3["num_hidden_layers"] = 7;
  g3["hidden_activation"] = "gelu_pytorch_tanh";
  g3["query_pre_attn_scalar"] = 16;
  g3["sliding_window"] = 3;
  g3["rope_theta"] = 1000.0;
  g3["rope_local_base_freq"] = 10.0;
  g3["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  g3["final_logit_softcapping"] = nullptr;
  const hf::LmConfig c = hf::parse_config(g3, "gemma3 v4");
  BOOST_TEST(c.gemma3());
  BOOST_TEST(c.attention_scale == 0.25f);
  BOOST_TEST(c.sliding_window == 3);
  BOOST_TEST((c.local_layers == std::vector<char>{1, 1, 1, 1, 1, 0, 1}));  // sliding_window_pattern 6
  BOOST_TEST((c.rope_theta == 1000.f && c.rope_local_theta == 10.f && c.rope_factor == 8.f));
  j = g3;
  j["sliding_window_pattern"] = 2;
  BOOST_TEST((hf::parse_config(j, "pattern 2").local_layers == std::vector<char>{1, 0, 1, 0, 1, 0, 1}));
  j = g3;
  for (const char* key : {"rope_theta", "rope_local_base_freq", "rope_scaling"}) j.erase(key);
  j["layer_types"] = {"full_attention",    "sliding_attention", "full_attention", "sliding_attention",
                      "sliding_attention", "full_attention",    "full_attention"};
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 2000.0}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 20.0}}}};
  const hf::LmConfig v5 = hf::parse_config(j, "gemma3 v5");
  BOOST_TEST((v5.local_layers == std::vector<char>{0, 1, 0, 1, 1, 0, 0}));
  BOOST_TEST((v5.rope_theta == 2000.f && v5.rope_local_theta == 20.f && v5.rope_factor == 1.f));
  j["rope_parameters"]["full_attention"] = {{"rope_type", "yarn"}, {"rope_theta", 2000.0}, {"factor", 4.0}};
  fails_with(j, "rope_type \"yarn\" is not supported");
  j["rope_parameters"]["full_attention"] = {{"rope_type", "default"}};
  j["rope_parameters"]["sliding_attention"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  fails_with(j, "rope scaling on the sliding_attention layers");
  j = g3;
  j["layer_types"] = {"sliding_attention"};
  fails_with(j, "layer_types");
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    j = g3;
    j[key] = 30.0;
    fails_with(j, std::string(key) + " 30.0 is not supported");
  }
  j = g3;
  j["sliding_window"] = 0;
  fails_with(j, "sliding_window 0");

  // Qwen3: the Llama family with QK-norm and head_dim (transformers' default 128).
  Json qwen3 = tiny_llama();
  qwen3["model_type"] = "qwen3";
  BOOST_TEST((hf::parse_config(qwen3, "qwen3").qk_norm() && hf::parse_config(qwen3, "qwen3").head_dim() == 128));
  BOOST_TEST(hf::transformers_names(hf::parse_config(qwen3, "qwen3")).tensors.at("1.attn.k_norm.weight").front() ==
             "model.layers.0.self_attn.k_norm.weight");
  qwen3["use_sliding_window"] = true;
  fails_with(qwen3, "use_sliding_window true");

  // Its blocks and their transformers names: the four norms and QK-norm.
  const hf::TransformersNames n = hf::transformers_names(c);
  BOOST_TEST(n.tensors.at("1.post_attn.weight").front() == "model.layers.0.post_attention_layernorm.weight");
  BOOST_TEST(n.tensors.at("1.ln2.weight").front() == "model.layers.0.pre_feedforward_layernorm.weight");
  BOOST_TEST(n.tensors.at("1.post_mlp.weight").front() == "model.layers.0.post_feedforward_layernorm.weight");
  BOOST_TEST(n.tensors.at("1.attn.q_norm.weight").front() == "model.layers.0.self_attn.q_norm.weight");
  BOOST_TEST(!n.tensors.contains(std::to_string(c.num_hidden_layers + 2) + ".weight"));  // tied head
  const hf::CausalLm lm(c);
  for (const auto& spec : lm.blocks.front().params())
    BOOST_TEST(n.tensors.contains("1." + spec.name), spec.name << " has a transformers name");
}

namespace {

// Loads `dir` at two ranks under Kind and checks it holds `saved`.
template <class Kind>
void load_at_two(const fs::path& dir, const hf::LmConfig& config, const Params& saved) {
  Params loaded;
  run_ranks(2, [&](World& w) {
    hf::CausalLm model(config);
    Trainer<hf::CausalLm, Strategy<Kind>> trainer(w, model, AdamW{}, {.seed = 99});
    const LoadParamsReport r = hf::load_pretrained(trainer, dir, config);
    require(r.loaded.size() == saved.size(), "every tensor loaded");
    Params p = trainer.parameters();
    if (w.rank() == 0) loaded = std::move(p);
  });
  BOOST_TEST((loaded == saved), Kind::name << ": loaded parameters differ from the saved ones");
}

}  // namespace

// Units named by transformers module: whole names, parts after a '.', shell
// patterns; in unit order, each once; a pattern naming nothing is refused
// with the model's modules.
BOOST_AUTO_TEST_CASE(units_are_named_by_transformers_module) {
  Json big = tiny_llama();
  big["num_hidden_layers"] = 12;
  const hf::LmConfig llama = hf::parse_config(big, "llama.json");
  const hf::LmConfig gpt2 = hf::parse_config(tiny_gpt2(), "gpt2.json");
  using Units = std::vector<std::size_t>;
  BOOST_TEST(
      (hf::unit_modules(gpt2) == std::vector<std::string>{"transformer.wte", "transformer.wpe", "transformer.h.0",
                                                          "transformer.h.1", "transformer.ln_f", "lm_head"}));
  BOOST_TEST(hf::unit_modules(llama).size() == 15u);
  BOOST_TEST(hf::unit_modules(llama)[1] == "model.layers.0");
  BOOST_TEST((hf::units_named(llama, {"layers.*"}) == Units{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  BOOST_TEST((hf::units_named(llama, {"model.layers.1?"}) == Units{11, 12}));
  BOOST_TEST((hf::units_named(llama, {"layers.1", "layers.[2-3]", "layers.1"}) == Units{2, 3, 4}));
  BOOST_TEST((hf::units_named(llama, {"lm_head", "norm", "embed_tokens"}) == Units{0, 13, 14}));
  BOOST_TEST((hf::units_named(llama, {}) == Units{}));
  BOOST_TEST((hf::units_named(gpt2, {"h.*"}) == Units{2, 3}));
  BOOST_TEST((hf::units_named(gpt2, {"wpe", "transformer.h.1"}) == Units{1, 3}));
  for (const auto& [c, pattern] : std::vector<std::pair<hf::LmConfig, std::string>>{
           {llama, "layers.12"}, {llama, "layers"}, {gpt2, "layers.*"}, {llama, "ayers.1"}}) {
    std::string message;
    try {
      (void)hf::units_named(c, {pattern});
    } catch (const config_error& e) {
      message = e.what();
    }
    BOOST_TEST(
        message.find("\"" + pattern + "\" names no module of this " + c.model_type + " model") != std::string::npos,
        message);
  }
}

// GPT-2 (tied head, Conv1D weights stored [in, out]) and a tied Llama: saved
// by dtrain, loaded back at two ranks under FSDP and ZeRO-1, bit for bit; the
// files hold transformers' names and shapes and no lm_head.weight.
BOOST_AUTO_TEST_CASE(tied_models_round_trip) {
  Json tied_llama = tiny_llama();
  tied_llama["tie_word_embeddings"] = true;
  for (const Json& j : {tiny_gpt2(), tied_llama}) {
    const hf::LmConfig config = hf::parse_config(j, "config.json");
    BOOST_TEST_CONTEXT(config.model_type) {
      const fs::path dir = fresh(config.model_type + "_tied_saved");
      const Params saved = train_and_save(config, dir);
      BOOST_TEST(saved.size() == (config.gpt2() ? 2u + 2u * 12u + 2u : 1u + 2u * 8u + 1u));  // no head tensor
      std::ifstream index(dir / "model.safetensors.index.json");
      const Json wm = Json::parse(index).at("weight_map");
      BOOST_TEST(!wm.contains("lm_head.weight"));
      BOOST_TEST(wm.size() == saved.size() + (config.gpt2() ? 0u : 2u));  // Llama: gate|up are two
      if (config.gpt2()) {
        BOOST_TEST(wm.contains("transformer.h.1.attn.c_attn.weight"));
        const auto file = SafetensorsFile::open(dir / wm.at("transformer.h.1.mlp.c_fc.weight").get<std::string>());
        BOOST_TEST((file.tensor("transformer.h.1.mlp.c_fc.weight").shape == std::vector<std::int64_t>{16, 64}));
      }
      load_at_two<FSDP<FullShard>>(dir, hf::read_config(dir), saved);
      load_at_two<ZeRO1>(dir, hf::read_config(dir), saved);
      if (!config.gpt2()) continue;
      // The layout of the original GPT-2 checkpoints: one file, names without
      // "transformer.", the causal-mask buffers, and a copy of the tied head.
      const fs::path legacy = fresh("gpt2_legacy_layout");
      fs::create_directories(legacy);
      fs::copy_file(dir / "config.json", legacy / "config.json");
      SafetensorsWriter out;
      std::list<std::vector<float>> values;  // the writer refers to them until write()
      for (const auto& [name, file] : wm.items()) {
        const auto f = SafetensorsFile::open(dir / file.get<std::string>());
        const auto shape = f.tensor(name).shape;
        out.add(name.substr(std::string("transformer.").size()), shape, values.emplace_back(f.read_f32(name)));
        if (name == "transformer.wte.weight") out.add("lm_head.weight", shape, values.back());
      }
      out.add("h.0.attn.bias", {1, 1, 8, 8}, values.emplace_back(64, 1.f));
      out.write(legacy / "model.safetensors");
      load_at_two<FSDP<FullShard>>(legacy, hf::read_config(legacy), saved);
    }
  }
}

// Saved by dtrain in the transformers layout (sharded), loaded back at two
// ranks under FSDP and ZeRO-1: the same parameters, bit for bit.
BOOST_AUTO_TEST_CASE(save_pretrained_and_load_pretrained_round_trip) {
  const hf::LmConfig config = hf::parse_config(tiny_llama(), "config.json");
  const fs::path dir = fresh("llama_saved");
  const Params saved = train_and_save(config, dir);
  BOOST_TEST(fs::exists(dir / "model.safetensors.index.json"));
  BOOST_TEST(!fs::exists(fs::path(dir.string() + ".partial")));
  const hf::LmConfig reread = hf::read_config(dir);
  BOOST_TEST(Json::parse(reread.json_text).at("torch_dtype") == "float32");
  std::ifstream index(dir / "model.safetensors.index.json");
  const Json wm = Json::parse(index).at("weight_map");
  BOOST_TEST(wm.contains("model.layers.1.mlp.gate_proj.weight"));
  BOOST_TEST(wm.contains("model.layers.1.mlp.up_proj.weight"));
  BOOST_TEST(wm.contains("lm_head.weight"));
  BOOST_TEST(wm.size() == 2u + 2u * 9u + 1u);

  load_at_two<FSDP<FullShard>>(dir, reread, saved);
  load_at_two<ZeRO1>(dir, reread, saved);

  // A second save never overwrites the first.
  run_ranks(1, [&](World& w) {
    hf::CausalLm model(reread);
    Trainer<hf::CausalLm> trainer(w, model, AdamW{});
    dtrain::testing::require_throws<checkpoint_error>([&] { hf::save_pretrained(trainer, dir, reread); });
  });
  BOOST_TEST(Json::parse(hf::read_config(dir).json_text).at("torch_dtype") == "float32");
}

// A config that does not fit the checkpoint names what is missing or
// mis-shaped, and changes nothing; a too-long sequence is refused.
BOOST_AUTO_TEST_CASE(mismatched_checkpoints_and_sequences_are_errors) {
  const fs::path dir = fresh("llama_for_errors");
  train_and_save(hf::parse_config(tiny_llama(), "config.json"), dir);
  Json deeper = tiny_llama();
  deeper["num_hidden_layers"] = 3;
  Json wider = tiny_llama();
  wider["intermediate_size"] = 32;
  run_ranks(1, [&](World& w) {
    const hf::LmConfig c3 = hf::parse_config(deeper, "deeper");
    hf::CausalLm m3(c3);
    Trainer<hf::CausalLm> t3(w, m3, AdamW{});
    try {
      hf::load_pretrained(t3, dir, c3);
      require(false, "a missing layer must be an error");
    } catch (const checkpoint_error& e) {
      require(std::string(e.what()).find("model.layers.2.self_attn.q_proj.weight") != std::string::npos,
              std::string("names the missing tensor: ") + e.what());
    }
    const hf::LmConfig cw = hf::parse_config(wider, "wider");
    hf::CausalLm mw(cw);
    Trainer<hf::CausalLm> tw(w, mw, AdamW{});
    const Params before = tw.parameters();
    try {
      hf::load_pretrained(tw, dir, cw);
      require(false, "a mis-shaped tensor must be an error");
    } catch (const config_error& e) {
      require(std::string(e.what()).find("1.mlp.fc1.weight") != std::string::npos,
              std::string("names the mis-shaped tensor: ") + e.what());
    }
    require(tw.parameters() == before, "a failed load changes nothing");

    std::vector<std::int32_t> ids(9, 1);
    Batch b;
    b.set("x", HostTensor::of(ids, {1, 9}));
    dtrain::testing::require_throws<config_error>([&] { tw.predict(b); });
  });
  BOOST_CHECK_THROW(hf::open_checkpoint(fresh("empty_model"), {}), checkpoint_error);
}

// Instruction records: x the ids but the last, y the next ids with -100 on
// the prompt and the padding (labels or prompt_length), cut to block + 1.
BOOST_AUTO_TEST_CASE(instruction_records_mask_the_prompt) {
  const fs::path file = fresh("records.jsonl");
  std::ofstream(file) << R"({"input_ids": [3, 4, 5, 6], "prompt_length": 2})"
                      << "\n\n"
                      << R"({"input_ids": [1, 2, 3, 4, 5, 6, 7], "labels": [-100, 2, -100, 4, 5, 6, 7]})"
                      << "\n";
  const auto r = lm::detail::read_records(file.string(), 5, 37);
  BOOST_TEST_REQUIRE(r.size() == 2u);
  BOOST_TEST((r[0].x == std::vector<std::int32_t>{3, 4, 5, 0, 0}));
  BOOST_TEST((r[0].y == std::vector<std::int32_t>{-100, 5, 6, -100, -100}));
  BOOST_TEST((r[1].x == std::vector<std::int32_t>{1, 2, 3, 4, 5}));  // cut to 6 tokens
  BOOST_TEST((r[1].y == std::vector<std::int32_t>{2, -100, 4, 5, 6}));
  const auto fails_with = [&](const std::string& line, const std::string& text) {
    std::ofstream(file) << R"({"input_ids": [1, 2], "prompt_length": 1})"
                        << "\n"
                        << line << "\n";
    try {
      lm::detail::read_records(file.string(), 5, 37);
      BOOST_ERROR("no error for " << line);
    } catch (const config_error& e) {
      BOOST_TEST(std::string(e.what()).find(text) != std::string::npos, e.what());
    }
  };
  fails_with(R"({"input_ids": [1, 40], "prompt_length": 1})", "line 2: token 1 is id 40");
  fails_with(R"({"input_ids": [1, 2], "labels": [1]})", "line 2: labels is not a list as long as input_ids");
  fails_with(R"({"input_ids": [1, 2, 3], "prompt_length": 3})", "line 2: no token to learn");
  fails_with(R"({"input_ids": [1, 2)", "line 2: not valid JSON");
  fails_with(R"({"input_ids": [1, 2]})", "neither labels nor an integer prompt_length");
}

// train_lm from a config (no checkpoint) on instruction records, 2 ranks:
// the completion loss falls; a bad record is exit status 2 naming its line.
BOOST_AUTO_TEST_CASE(train_lm_learns_completions_from_records) {
  const fs::path work = fresh("train_lm_sft");
  fs::create_directories(work);
  Json cfg = tiny_llama();
  cfg["max_position_embeddings"] = 16;
  std::ofstream(work / "config.json") << cfg.dump();
  {
    std::ofstream out(work / "records.jsonl");
    for (int i = 0; i < 200; ++i) {  // a fixed prompt, then k, k+1, k+2: learnable after k
      const int k = 10 + (i * 7) % 20;
      out << "{\"input_ids\": [5, 6, 7, " << k << ", " << k + 1 << ", " << k + 2 << "], \"prompt_length\": 3}\n";
    }
  }
  const std::string run = std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 2 " + TRAIN_LM_PATH +
                          " config=" + (work / "config.json").string() +
                          " block_size=8 batch_size=8 lr=1e-2 steps=60 log_every=59 ";
  BOOST_TEST_REQUIRE(run_logged(run + "data=" + (work / "records.jsonl").string(), work / "train.log") == 0,
                     read_text(work / "train.log"));
  const std::string log = read_text(work / "train.log");
  const auto loss_at = [&](const std::string& step) {
    const auto at = log.find("step " + step + "/60 | loss ");
    BOOST_TEST_REQUIRE(at != std::string::npos, log);
    return std::stod(log.substr(at + step.size() + 15, 6));
  };
  // Three targets per record: k (one of 20, ~3.0 nats at best) and two that follow from it (0 at best).
  BOOST_TEST(loss_at("   60") < 0.6 * loss_at("    1"), log);
  BOOST_TEST(log.find("200 records") != std::string::npos, log);
  std::ofstream(work / "bad.jsonl") << R"({"input_ids": [5, 6], "prompt_length": 1})"
                                    << "\n"
                                    << R"({"input_ids": [5, 99], "prompt_length": 1})"
                                    << "\n";
  BOOST_TEST(run_logged(run + "data=" + (work / "bad.jsonl").string(), work / "bad.log") == 2);
  BOOST_TEST(read_text(work / "bad.log").find("line 2: token 1 is id 99") != std::string::npos,
             read_text(work / "bad.log"));
}

// train_lm objective=dpo from a config, 2 ranks under fsdp-full with bf16,
// 2 micro-batches per step and LoRA, the reference the LoRA-off base: on
// pairs where the chosen completion continues the prompt's count and the
// rejected one breaks it, the DPO loss falls below log 2 and the rewards'
// accuracy rises; with precomputed reference log-probabilities
// (reference=data) too. Each bad input is exit status 2 with the fix.
BOOST_AUTO_TEST_CASE(train_lm_prefers_chosen_completions) {
  const fs::path work = fresh("train_lm_dpo");
  fs::create_directories(work);
  Json cfg = tiny_llama();
  cfg["max_position_embeddings"] = 16;
  std::ofstream(work / "config.json") << cfg.dump();
  {
    std::ofstream out(work / "pairs.jsonl"), refs(work / "refs.jsonl");
    for (int i = 0; i < 120; ++i) {  // prompt k, k+1; chosen k+2, k+3; rejected k+2, k+5
      const int k = 3 + (i * 7) % 25;
      const std::string pair = "{\"prompt_ids\": [" + std::to_string(k) + ", " + std::to_string(k + 1) +
                               "], \"chosen_ids\": [" + std::to_string(k + 2) + ", " + std::to_string(k + 3) +
                               "], \"rejected_ids\": [" + std::to_string(k + 2) + ", " + std::to_string(k + 5) + "]";
      out << pair << "}\n";
      refs << pair << ", \"ref_chosen_logps\": -7.2, \"ref_rejected_logps\": -7.2}\n";
    }
  }
  const std::string run = std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 2 " + TRAIN_LM_PATH +
                          " config=" + (work / "config.json").string() +
                          " objective=dpo beta=0.5 block_size=15 batch_size=4 steps=40 log_every=39 eval_batches=2 ";
  const std::string lora = "lr=3e-2 lora_r=4 lora_alpha=8 lora_targets=all-linear ";
  BOOST_TEST_REQUIRE(
      run_logged(run + lora + "strategy=fsdp-full precision=bf16 accumulate=2 data=" + (work / "pairs.jsonl").string(),
                 work / "train.log") == 0,
      read_text(work / "train.log"));
  const std::string log = read_text(work / "train.log");
  BOOST_TEST(log.find("dpo: loss_type=sigmoid beta=0.5, reference base") != std::string::npos, log);
  const auto figure = [&](const std::string& step, const std::string& what) {
    const auto line = log.find("step " + step + "/40 | loss ");
    BOOST_TEST_REQUIRE(line != std::string::npos, log);
    const auto at = what == "loss" ? line + step.size() + 15 : log.find(what + " ", line) + what.size() + 1;
    return std::stod(log.substr(at, 6));
  };
  BOOST_TEST(std::abs(figure("    1", "loss") - std::log(2.0)) < 1e-3, log);  // the policy starts as its base
  BOOST_TEST(figure("   40", "loss") < 0.5, log);
  BOOST_TEST(figure("   40", "rewards/accuracies") >= 0.75, log);
  BOOST_TEST(log.find("eval: held-out loss ") != std::string::npos, log);
  BOOST_TEST(log.find("(DPO, loss_type=sigmoid) over 16 pairs | logps/chosen") != std::string::npos, log);
  // Precomputed reference log-probabilities, every weight training, DDP.
  BOOST_TEST_REQUIRE(run_logged(run + "lr=1e-2 steps=5 data=" + (work / "refs.jsonl").string(), work / "refs.log") == 0,
                     read_text(work / "refs.log"));
  BOOST_TEST(read_text(work / "refs.log").find("reference data (precomputed in the pairs file)") != std::string::npos,
             read_text(work / "refs.log"));
  // Bad input: one line each, exit status 2.
  const auto fails = [&](const std::string& args, const std::string& text) {
    const fs::path out = work / "bad.log";
    BOOST_TEST(run_logged(run + args, out) == 2, args << ": " << read_text(out));
    BOOST_TEST(read_text(out).find(text) != std::string::npos, args << ": " << read_text(out));
  };
  const std::string pairs = "data=" + (work / "pairs.jsonl").string() + " ";
  fails(pairs + "reference=base", "reference=base is the policy with its LoRA adapters off, and this run has none");
  fails(pairs + "reference=data", "reference=data, but 120 of 120 pairs");
  fails(pairs, "reference=copy loads the reference from a model directory, and there is none");
  fails(pairs + "loss_type=dpo", "loss_type 'dpo' is not a preference loss dtrain has");
  fails(pairs + "loss_type=sigmoid label_smoothing=0.1", "use loss_type robust for label smoothing");
  Json wider = cfg;
  wider["hidden_size"] = 32;
  fs::create_directories(work / "wider");
  std::ofstream(work / "wider" / "config.json") << wider.dump();
  fails(pairs + "reference=copy ref_model=" + (work / "wider").string(),
        "differs from the policy in hidden_size: a reference has the policy's architecture");
  std::ofstream(work / "empty.jsonl") << R"({"prompt_ids": [3, 4], "chosen_ids": [5], "rejected_ids": [6]})"
                                      << "\n"
                                      << R"({"prompt_ids": [3, 4], "chosen_ids": [], "rejected_ids": [6]})"
                                      << "\n";
  fails(lora + "data=" + (work / "empty.jsonl").string(), "line 2: chosen_ids is empty");
  std::ofstream(work / "long.jsonl") << R"({"prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], )"
                                     << R"("chosen_ids": [5, 6, 7], "rejected_ids": [6]})"
                                     << "\n";
  fails(lora + "data=" + (work / "long.jsonl").string(), "line 1: the prompt (14 tokens) and its chosen completion");
}

// train_lm objective=grpo from a config at 2 ranks: each prompt's 4
// sampled completions of 6 tokens scored by how often they hold token 7
// (reward=token:7); the mean reward of the last steps is well above the
// first steps'. A regex reward over a vocabulary file runs too; each bad
// input is exit status 2 with the fix.
BOOST_AUTO_TEST_CASE(train_lm_grpo_raises_the_reward) {
  const fs::path work = fresh("train_lm_grpo");
  fs::create_directories(work);
  Json cfg = tiny_llama();
  cfg["max_position_embeddings"] = 16;
  std::ofstream(work / "config.json") << cfg.dump();
  {
    std::ofstream out(work / "prompts.jsonl");
    for (int i = 0; i < 40; ++i) out << "{\"prompt_ids\": [" << 10 + i % 20 << ", " << 11 + (i * 3) % 20 << "]}\n";
    std::ofstream vocab(work / "vocab.txt");
    for (int i = 0; i < 37; ++i) vocab << (i == 7 ? "seven" : "t" + std::to_string(i)) << "\n";
  }
  const std::string run =
      std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 2 " + TRAIN_LM_PATH +
      " config=" + (work / "config.json").string() + " data=" + (work / "prompts.jsonl").string() +
      " objective=grpo num_generations=4 batch_size=8 max_new_tokens=6 block_size=15 eval_batches=1 ";
  BOOST_TEST_REQUIRE(
      run_logged(run + "reward=token:7 lr=3e-2 steps=30 log_every=10 metrics=" + (work / "metrics.jsonl").string(),
                 work / "train.log") == 0,
      read_text(work / "train.log"));
  const std::string log = read_text(work / "train.log");
  BOOST_TEST(log.find("grpo: 4 completions per prompt, up to 6 new tokens, reward token:7, loss_type dapo") !=
                 std::string::npos,
             log);
  BOOST_TEST(log.find(" | reward mean ") != std::string::npos, log);
  BOOST_TEST(log.find("eval: held-out reward mean ") != std::string::npos, log);
  std::vector<double> reward;
  {
    std::ifstream in(work / "metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      if (const Json j = Json::parse(line); j.contains("reward")) reward.push_back(j["reward"].get<double>());
  }
  BOOST_TEST_REQUIRE(reward.size() == 30u);
  const double first = (reward[0] + reward[1] + reward[2] + reward[3] + reward[4]) / 5,
               last = (reward[25] + reward[26] + reward[27] + reward[28] + reward[29]) / 5;
  BOOST_TEST(last > first + 1.0, "mean reward " << first << " -> " << last << "\n" << log);
  BOOST_TEST_REQUIRE(run_logged(run + "reward=regex:seven lr=1e-2 steps=3 vocab_file=" + (work / "vocab.txt").string(),
                                work / "regex.log") == 0,
                     read_text(work / "regex.log"));
  const auto fails = [&](const std::string& args, const std::string& text) {
    const fs::path out = work / "bad.log";
    BOOST_TEST(run_logged(run + args, out) == 2, args << ": " << read_text(out));
    BOOST_TEST(read_text(out).find(text) != std::string::npos, args << ": " << read_text(out));
  };
  fails("reward=token:7 num_generations=3", "num_generations 3 does not divide batch_size 8");
  fails("", "objective=grpo needs a reward");
  fails("reward=regex:seven", "there is no vocab_file");
  fails("reward=token:7 max_new_tokens=15", "line 1: a prompt of 2 tokens and max_new_tokens 15 are longer");
}

// train_lm with packed records and LoRA adapters, 2 ranks under fsdp-full:
// the records pack several to a block, the completion loss falls with only
// the adapters training, and the adapter and the merged model are written;
// then the adapter continues training from its directory. Each bad
// combination is exit status 2 with one line naming the fix.
BOOST_AUTO_TEST_CASE(train_lm_packs_records_and_trains_adapters) {
  const fs::path work = fresh("train_lm_lora");
  fs::create_directories(work);
  Json cfg = tiny_llama();
  cfg["max_position_embeddings"] = 16;
  std::ofstream(work / "config.json") << cfg.dump();
  {
    std::ofstream out(work / "records.jsonl");
    for (int i = 0; i < 300; ++i) {  // 4-6 tokens: two or three records to a block of 16
      const int k = 10 + (i * 7) % 20;
      out << "{\"input_ids\": [5, 6, " << k << ", " << k + 1 << (i % 2 ? ", " + std::to_string(k + 2) : "")
          << "], \"prompt_length\": 2}\n";
    }
  }
  const std::string run = std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 2 " + TRAIN_LM_PATH +
                          " config=" + (work / "config.json").string() + " data=" + (work / "records.jsonl").string() +
                          " block_size=16 batch_size=4 steps=40 log_every=39 strategy=fsdp-full ";
  const std::string lora = "lr=3e-2 lora_r=4 lora_alpha=8 lora_targets=all-linear packing=true ";
  BOOST_TEST_REQUIRE(
      run_logged(run + lora + "save_adapter=" + (work / "adapter").string() + " save_hf=" + (work / "merged").string(),
                 work / "train.log") == 0,
      read_text(work / "train.log"));
  const std::string log = read_text(work / "train.log");
  BOOST_TEST(log.find("packing: 270 training records in ") != std::string::npos, log);
  const auto loss_at = [&](const std::string& step) {
    const auto at = log.find("step " + step + "/40 | loss ");
    BOOST_TEST_REQUIRE(at != std::string::npos, log);
    return std::stod(log.substr(at + step.size() + 15, 6));
  };
  BOOST_TEST(loss_at("   40") < 0.8 * loss_at("    1"), log);
  BOOST_TEST(fs::exists(work / "adapter" / "adapter_model.safetensors"));
  BOOST_TEST(fs::exists(work / "merged" / "model.safetensors"));
  BOOST_TEST(hf::read_adapter_config(work / "adapter").r == 4);
  // Continue from the adapter (on the same base: the merged model's config, its weights as the base).
  BOOST_TEST(run_logged(std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 2 " + TRAIN_LM_PATH +
                            " model=" + (work / "merged").string() + " data=" + (work / "records.jsonl").string() +
                            " block_size=16 batch_size=4 steps=2 adapter=" + (work / "adapter").string(),
                        work / "continue.log") == 0,
             read_text(work / "continue.log"));
  BOOST_TEST(read_text(work / "continue.log").find("loaded 24 tensor(s)") != std::string::npos,
             read_text(work / "continue.log"));
  // The GPU preset, on CPU ranks: packed records, adapters (rank 4: the tiny
  // model's key projection is 8 wide) with dropout on their input, every
  // second block recomputed (the recomputed forward drops the same inputs).
  BOOST_TEST(run_logged(std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 2 " + TRAIN_LM_PATH + " --config " +
                            DTRAIN_SOURCE_DIR +
                            "/examples/configs/lm_lora_gpu.yaml device=host precision=fp32 "
                            "reduce_dtype=fp32 block_size=16 batch_size=4 accumulate=1 steps=3 num_workers=0 "
                            "eval_batches=1 warmup_steps=0 lora_r=4 lora_alpha=8 lora_dropout=0.1 config=" +
                            (work / "config.json").string() + " data=" + (work / "records.jsonl").string(),
                        work / "preset.log") == 0,
             read_text(work / "preset.log"));
  const auto refused = [&](const std::string& args, const std::string& says) {
    const int status = run_logged(run + args, work / "bad.log");
    BOOST_TEST(status == 2, args);
    BOOST_TEST(read_text(work / "bad.log").find(says) != std::string::npos, read_text(work / "bad.log"));
  };
  refused("lora_targets=q_proj", "lora_targets without adapters");
  refused("lora_r=4 lora_targets=q_projx", "LoRA target \"q_projx\" matches no linear layer");
  refused("lora_r=40 lora_targets=k_proj", "exceeds the layer's dimensions");
  refused("adapter=" + (work / "adapter").string(), "adapter= needs the base model");
  refused("lora_r=4 lora_targets=q_proj lora_dropout=1", "is outside [0, 1)");
  refused("activation_checkpointing=true checkpoint_modules=layers.9", "\"layers.9\" names no module of this llama");
  refused("checkpoint_modules=layers.*", "checkpoint_modules without activation_checkpointing=true");
  refused("activation_checkpointing=true checkpoint_modules=layers.* checkpoint_every=2",
          "checkpoint_modules and checkpoint_units/checkpoint_every/checkpoint_budget_mib both");
  // Recomputing the blocks named by pattern is recomputing them by number:
  // the same losses to the last digit.
  const auto losses = [&](const std::string& args, const std::string& name) {
    BOOST_TEST_REQUIRE(
        run_logged(run + "lr=1e-2 steps=3 log_every=1 activation_checkpointing=true " + args, work / name) == 0,
        read_text(work / name));
    std::string out;
    std::istringstream lines(read_text(work / name));
    for (std::string line; std::getline(lines, line);)
      if (line.find("| loss ") != std::string::npos) out += line.substr(0, line.find("| loss ") + 14) + "\n";
    return out;
  };
  const std::string by_name = losses("checkpoint_modules=layers.*", "by_name.log");
  BOOST_TEST(!by_name.empty());
  BOOST_TEST(by_name == losses("checkpoint_units=1,2", "by_number.log"));
  BOOST_TEST(run_logged(std::string(DTRAIN_RUN_PATH) + " --nproc-per-node 1 " + TRAIN_LM_PATH +
                            " config=" + (work / "config.json").string() + " data=" + (work / "tokens.npy").string() +
                            " packing=true",
                        work / "bad.log") == 2);
  BOOST_TEST(read_text(work / "bad.log").find("packing=true needs instruction records") != std::string::npos,
             read_text(work / "bad.log"));
}
