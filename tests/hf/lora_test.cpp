// LoRA on the transformers models without Python (hf/lora.hpp): PEFT's
// target matching, frozen base weights, the adapter saved in PEFT's layout
// and loaded back across strategies bit for bit, the merged save, and the
// adapter configs dtrain refuses.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
using namespace dtrain;
using dtrain::testing::require;
using dtrain::testing::run_ranks;
using Json = nlohmann::ordered_json;

namespace {

hf::LmConfig llama() {
  return hf::parse_config(Json{{"model_type", "llama"},
                               {"vocab_size", 37},
                               {"hidden_size", 16},
                               {"intermediate_size", 24},
                               {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},
                               {"num_key_value_heads", 2},
                               {"max_position_embeddings", 8},
                               {"rms_norm_eps", 1e-5},
                               {"hidden_act", "silu"},
                               {"tie_word_embeddings", false}},
                          "config.json");
}

hf::LmConfig gpt2() {
  return hf::parse_config(Json{{"model_type", "gpt2"},
                               {"vocab_size", 37},
                               {"n_embd", 16},
                               {"n_layer", 2},
                               {"n_head", 4},
                               {"n_positions", 8},
                               {"layer_norm_epsilon", 1e-5},
                               {"activation_function", "gelu_new"}},
                          "config.json");
}

fs::path fresh(const std::string& name) {
  const fs::path d = fs::path(DTRAIN_TEST_BINARY_DIR) / name;
  fs::remove_all(d);
  return d;
}

Batch batch(int salt) {
  std::vector<std::int32_t> ids(2 * 6);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7 + 3 + salt) % 37);
  Batch b;
  b.set("x", HostTensor::of(ids, {2, 6}));
  std::rotate(ids.begin(), ids.begin() + 1, ids.end());
  b.set("y", HostTensor::of(ids, {2, 6}));
  return b;
}

using Params = std::map<std::string, std::vector<float>>;

// A base model trained two steps (nothing at its init), saved for transformers.
Params base_model(const hf::LmConfig& config, const fs::path& dir) {
  Params out;
  run_ranks(1, [&](World& w) {
    hf::CausalLm model(config);
    Trainer<hf::CausalLm> trainer(w, model, AdamW{.lr = 1e-2f}, {.seed = 3});
    for (int s = 0; s < 2; ++s) {
      const Batch b = batch(s);
      trainer.step(std::span(&b, 1));
    }
    hf::save_pretrained(trainer, dir, config);
    out = trainer.parameters();
  });
  return out;
}

std::vector<std::string> trainable_names(const hf::CausalLm& model) {
  hf::CausalLm m = model;
  std::vector<std::string> out;
  detail::for_each_unit(m.units(), [&](std::size_t u, auto& unit) {
    for (const auto& s : unit.params())
      if (s.trainable && s.tied_to.empty()) out.push_back(std::to_string(u) + "." + s.name);
  });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora)

// PEFT's matching: whole names or dotted suffixes, all-linear, one regular
// expression; GPT-2's "c_proj" is both the attention's and the MLP's.
BOOST_AUTO_TEST_CASE(targets_resolve_as_peft) {
  const hf::LmConfig l = llama(), g = gpt2();
  auto layers = [](const hf::LmConfig& c, hf::LoraConfig lora) {
    lora.r = 2;
    return hf::plan_lora(c, lora).layers;
  };
  using V = std::vector<std::vector<std::string>>;
  BOOST_TEST((layers(l, {.targets = {"q_proj", "v_proj"}}) == V{{"attn.q", "attn.v"}, {"attn.q", "attn.v"}}));
  BOOST_TEST(
      (layers(l, {.targets = {"all-linear"}}) == V(2, {"attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc2", "mlp.fc1"})));
  BOOST_TEST((layers(l, {.targets = {"layers.1.self_attn.q_proj", "gate_proj", "up_proj"}}) ==
              V{{"mlp.fc1"}, {"attn.q", "mlp.fc1"}}));
  BOOST_TEST(
      (layers(l, {.targets = {R"(.*\.0\.self_attn\.(q|k)_proj)"}, .regex = true}) == V{{"attn.q", "attn.k"}, {}}));
  BOOST_TEST((layers(g, {.targets = {"c_proj"}}) == V(2, {"attn.proj", "mlp.fc2"})));
  BOOST_TEST((layers(g, {.targets = {"attn.c_attn", "mlp.c_proj"}}) == V(2, {"attn.qkv", "mlp.fc2"})));
  auto refused = [](const hf::LmConfig& c, hf::LoraConfig lora, const std::string& says) {
    lora.r = lora.r == 0 ? 2 : lora.r;
    try {
      hf::CausalLm model(c, lora);
    } catch (const config_error& e) {
      BOOST_TEST(std::string(e.what()).find(says) != std::string::npos, e.what());
      return;
    }
    BOOST_ERROR("no error for " << says);
  };
  refused(l, {.targets = {"gate_proj"}}, "without up_proj");
  refused(l, {.targets = {"q_proj", "c_attn"}}, "\"c_attn\" matches no linear layer");
  // The output head: adapted when a target names it and it is untied; never by all-linear, as in PEFT.
  BOOST_TEST(hf::plan_lora(l, {.r = 2, .targets = {"q_proj", "lm_head"}}).head);
  // PEFT saves the adapted head's own weight beside its adapter; load_adapter reads it when present.
  BOOST_TEST((hf::peft_base_layers(l, hf::plan_lora(l, {.r = 2, .targets = {"lm_head"}})) ==
              std::map<std::string, std::string>{{"4.weight", "base_model.model.lm_head.base_layer.weight"}}));
  BOOST_TEST(hf::peft_base_layers(l, hf::plan_lora(l, {.r = 2, .targets = {"q_proj"}})).empty());
  BOOST_TEST(!hf::plan_lora(l, {.r = 2, .targets = {"all-linear"}}).head);
  BOOST_TEST(hf::plan_lora(l, {.r = 2, .targets = {".*(q_proj|lm_head)"}, .regex = true}).head);
  BOOST_TEST(!hf::plan_lora(l, {.r = 2, .targets = {".*_proj"}, .regex = true}).head);
  refused(g, {.targets = {"c_attn", "lm_head"}}, "ties to its token embedding");
  refused(l, {.targets = {"lm_head"}, .modules_to_save = {"lm_head"}}, "both a LoRA target");
  refused(l, {.targets = {}}, "needs target modules");
  refused(l, {.targets = {"("}, .regex = true}, "is not a regular expression");
  // The pattern's syntax is io/pattern.hpp's (tests/io/pattern_test.cpp); LoRA adds the other way to name targets.
  refused(l, {.targets = {"(?i)q_proj"}, .regex = true}, "inline flags such as (?i) are not supported");
  refused(l, {.targets = {"("}, .regex = true}, "one quantifier per item, or give module names");
  refused(l, {.r = 9, .targets = {"k_proj"}}, "exceeds the layer's dimensions");
  refused(g, {.dropout = 1.5f, .targets = {"c_attn"}}, "is outside [0, 1)");
}

// With adapters, only they train: no other parameter has a gradient or state.
BOOST_AUTO_TEST_CASE(only_adapters_train) {
  const hf::CausalLm model(llama(), {.r = 2, .targets = {"q_proj", "down_proj"}});
  BOOST_TEST(
      trainable_names(model) ==
          (std::vector<std::string>{"1.attn.q.lora_A", "1.attn.q.lora_B", "1.mlp.fc2.lora_A", "1.mlp.fc2.lora_B",
                                    "2.attn.q.lora_A", "2.attn.q.lora_B", "2.mlp.fc2.lora_A", "2.mlp.fc2.lora_B"}),
      boost::test_tools::per_element());
  BOOST_TEST(trainable_names(hf::CausalLm(gpt2(), {.r = 2, .targets = {"c_fc"}})).size() == 4u);
}

// Llama (fused gate|up: two PEFT tensors each) and GPT-2 (Conv1D layers):
// trained from a base model at one rank, the base stays bit for bit, the
// adapter is saved in PEFT's layout and loads back into a fresh model at two
// ranks under FSDP and ZeRO-1 bit for bit; the merged save, loaded into a
// plain model, gives the adapted model's logits.
BOOST_AUTO_TEST_CASE(adapter_round_trip_and_merge) {
  // The model, its targets, and the adapter's tensors: in PEFT's file, and loaded (Llama's gate|up is one).
  struct Case {
    hf::LmConfig config;
    std::vector<std::string> targets;
    std::string name;
    std::size_t in_file, loaded;
  };
  const std::vector<Case> cases{{llama(), {"all-linear"}, "llama", 2 * 7 * 2, 2 * 6 * 2},
                                {gpt2(), {"all-linear"}, "gpt2", 2 * 4 * 2, 2 * 4 * 2},
                                {llama(), {"q_proj", "lm_head"}, "llama_head", 2 * 1 * 2 + 2, 2 * 1 * 2 + 2}};
  for (const Case& c : cases) {
    const hf::LmConfig& config = c.config;
    BOOST_TEST_CONTEXT(c.name) {
      const fs::path base = fresh("lora_base_" + c.name), adapter = fresh("lora_adapter_" + c.name),
                     merged = fresh("lora_merged_" + c.name);
      const Params base_params = base_model(config, base);
      const hf::LoraConfig lora{.r = 2, .alpha = 4.f, .targets = c.targets};
      Params trained;
      std::vector<float> logits;
      run_ranks(1, [&](World& w) {
        hf::CausalLm model(config, lora);
        Trainer<hf::CausalLm> trainer(w, model, AdamW{.lr = 1e-2f}, {.seed = 5});
        const LoadParamsReport r = hf::load_pretrained(trainer, base, config);
        require(r.missing.empty() && r.loaded.size() == base_params.size(), "the base loads, adapters aside");
        for (int s = 0; s < 3; ++s) {
          const Batch b = batch(s);
          trainer.step(std::span(&b, 1));
        }
        hf::save_adapter(trainer, adapter, model, base.string());
        hf::save_pretrained(trainer, merged, model);
        trained = trainer.parameters();
        logits = trainer.predict(batch(7));
      });
      for (const auto& [name, v] : base_params) BOOST_TEST((trained.at(name) == v), name << " is frozen");
      std::size_t b_count = 0;
      for (const auto& [name, v] : trained)
        if (name.ends_with("lora_B")) {
          ++b_count;
          double b_norm = 0.0;
          for (float x : v) b_norm += std::abs(x);
          BOOST_TEST(b_norm > 0.0, name << " trained away from zero");
        }
      BOOST_TEST(2 * b_count == c.loaded);

      // PEFT's files
      const Json cfg = Json::parse(std::ifstream(adapter / "adapter_config.json"));
      BOOST_TEST(cfg.at("peft_type") == "LORA");
      BOOST_TEST(cfg.at("r") == 2);
      BOOST_TEST(cfg.at("lora_alpha") == 4.0);
      if (c.targets.size() == 1) BOOST_TEST(cfg.at("target_modules") == c.targets[0]);
      BOOST_TEST(cfg.at("fan_in_fan_out") == config.gpt2());
      const auto file = SafetensorsFile::open(adapter / "adapter_model.safetensors");
      BOOST_TEST(file.names().size() == c.in_file);
      if (config.gpt2()) {
        BOOST_TEST((file.tensor("base_model.model.transformer.h.1.attn.c_attn.lora_B.weight").shape ==
                    std::vector<std::int64_t>{48, 2}));
      } else if (c.name == "llama_head") {
        BOOST_TEST((file.tensor("base_model.model.lm_head.lora_A.weight").shape == std::vector<std::int64_t>{2, 16}));
        BOOST_TEST((file.tensor("base_model.model.lm_head.lora_B.weight").shape == std::vector<std::int64_t>{37, 2}));
      } else {
        BOOST_TEST((file.tensor("base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight").shape ==
                    std::vector<std::int64_t>{2, 16}));
        BOOST_TEST((file.tensor("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight").shape ==
                    std::vector<std::int64_t>{24, 2}));
      }

      // back at two ranks, sharded
      auto reload = [&]<class Kind>() {
        Params loaded;
        run_ranks(2, [&](World& w) {
          hf::CausalLm model(config, hf::read_adapter_config(adapter));
          Trainer<hf::CausalLm, Strategy<Kind>> trainer(w, model, AdamW{}, {.seed = 99});
          hf::load_pretrained(trainer, base, config);
          const LoadParamsReport r = hf::load_adapter(trainer, adapter, model);
          require(r.loaded.size() == c.loaded, "every adapter loads");
          Params p = trainer.parameters();
          if (w.rank() == 0) loaded = std::move(p);
        });
        BOOST_TEST((loaded == trained), Kind::name << ": the reloaded adapters differ");
      };
      reload.template operator()<FSDP<FullShard>>();
      reload.template operator()<ZeRO1>();

      // the merged model, without adapters
      std::vector<float> merged_logits;
      run_ranks(1, [&](World& w) {
        const hf::LmConfig mc = hf::read_config(merged);
        hf::CausalLm model(mc);
        Trainer<hf::CausalLm> trainer(w, model, AdamW{});
        hf::load_pretrained(trainer, merged, mc);
        merged_logits = trainer.predict(batch(7));
      });
      BOOST_REQUIRE_EQUAL(merged_logits.size(), logits.size());
      double worst = 0.0, scale = 0.0;
      for (std::size_t i = 0; i < logits.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(merged_logits[i]) - logits[i]));
        scale = std::max(scale, std::abs(static_cast<double>(logits[i])));
      }
      BOOST_TEST(worst <= 1e-5 * scale, "merged logits differ by " << worst << " (largest " << scale << ")");
    }
  }
}

// The documented LoRA fine-tune (docs/models_hf.md) on the tiny Llama at 2
// ranks: only the adapters change, and both directories are written.
BOOST_AUTO_TEST_CASE(documented_lora_fine_tune) {
  const fs::path pretrained = fresh("lora_doc_base"), adapter = fresh("lora_doc_adapter"),
                 merged = fresh("lora_doc_merged");
  const Params base = base_model(llama(), pretrained);
  Params tuned;
  run_ranks(2, [&](World& w) {
    const Batch b = batch(w.rank());
    // [snippet:hf_lora]
    const hf::LmConfig config = hf::read_config(pretrained);
    hf::CausalLm model(config, {.r = 4, .alpha = 8.f, .targets = {"q_proj", "k_proj", "v_proj", "o_proj"}});
    Trainer<hf::CausalLm, Strategy<FSDP<FullShard>>> trainer(w, model, AdamW{.lr = 2e-4f});
    hf::load_pretrained(trainer, pretrained, config);  // the base; the adapters keep their start
    for (int s = 0; s < 2; ++s) trainer.step(std::span(&b, 1));
    hf::save_adapter(trainer, adapter, model, pretrained.string());  // for peft.PeftModel.from_pretrained
    hf::save_pretrained(trainer, merged, model);                     // W + (alpha / r) B A: transformers alone loads it
    // [/snippet:hf_lora]
    Params p = trainer.parameters();
    if (w.rank() == 0) tuned = std::move(p);
  });
  for (const auto& [name, v] : base) BOOST_TEST((tuned.at(name) == v), name << " is frozen");
  BOOST_TEST(tuned.size() == base.size() + 2u * 4u * 2u);  // A and B of 4 projections in 2 layers
  BOOST_TEST(fs::exists(adapter / "adapter_model.safetensors"));
  BOOST_TEST(fs::exists(merged / "model.safetensors"));
}

// PEFT's modules_to_save: the untied embedding and head (GPT-2: the learned
// positions) train whole beside the adapters, are saved with them under
// their modules' names and load back bit for bit at two ranks; tied ones,
// other modules and modules without adapters are refused by name.
BOOST_AUTO_TEST_CASE(modules_to_save_train_and_round_trip) {
  const hf::LmConfig config = llama();
  const hf::CausalLm model(config, {.r = 2, .targets = {"q_proj"}, .modules_to_save = {"embed_tokens", "lm_head"}});
  BOOST_TEST(trainable_names(model) == (std::vector<std::string>{"0.weight", "1.attn.q.lora_A", "1.attn.q.lora_B",
                                                                 "2.attn.q.lora_A", "2.attn.q.lora_B", "4.weight"}),
             boost::test_tools::per_element());
  BOOST_TEST(trainable_names(hf::CausalLm(gpt2(), {.r = 2, .targets = {"c_fc"}, .modules_to_save = {"wpe"}})).front() ==
             "1.weight");

  const fs::path base = fresh("lora_saved_base"), adapter = fresh("lora_saved_adapter");
  const Params base_params = base_model(config, base);
  const hf::LoraConfig lora{
      .r = 2, .alpha = 4.f, .targets = {"q_proj", "v_proj"}, .modules_to_save = {"model.embed_tokens", "lm_head"}};
  Params trained;
  run_ranks(1, [&](World& w) {
    hf::CausalLm m(config, lora);
    Trainer<hf::CausalLm> trainer(w, m, AdamW{.lr = 1e-2f}, {.seed = 5});
    hf::load_pretrained(trainer, base, config);
    for (int s = 0; s < 3; ++s) {
      const Batch b = batch(s);
      trainer.step(std::span(&b, 1));
    }
    hf::save_adapter(trainer, adapter, m, base.string());
    trained = trainer.parameters();
  });
  for (const auto& [name, v] : base_params) {
    const bool saved = name == "0.weight" || name == "4.weight";
    BOOST_TEST((trained.at(name) == v) != saved, name << (saved ? " trained" : " is frozen"));
  }
  const Json cfg = Json::parse(std::ifstream(adapter / "adapter_config.json"));
  BOOST_TEST(cfg.at("modules_to_save") == (Json{"model.embed_tokens", "lm_head"}));
  const auto file = SafetensorsFile::open(adapter / "adapter_model.safetensors");
  BOOST_TEST(file.names().size() == 2u * 2u * 2u + 2u);
  BOOST_TEST((file.read_f32("base_model.model.model.embed_tokens.weight") == trained.at("0.weight")));
  BOOST_TEST((file.read_f32("base_model.model.lm_head.weight") == trained.at("4.weight")));
  Params loaded;
  run_ranks(2, [&](World& w) {
    hf::CausalLm m(config, hf::read_adapter_config(adapter));
    Trainer<hf::CausalLm, Strategy<FSDP<FullShard>>> trainer(w, m, AdamW{}, {.seed = 99});
    hf::load_pretrained(trainer, base, config);
    const LoadParamsReport r = hf::load_adapter(trainer, adapter, m);
    require(r.loaded.size() == 2u * 2u * 2u + 2u, "the adapters and both saved modules load");
    Params p = trainer.parameters();
    if (w.rank() == 0) loaded = std::move(p);
  });
  BOOST_TEST((loaded == trained), "the reloaded adapters and modules differ");

  const auto refused = [](const hf::LmConfig& c, const hf::LoraConfig& l, const std::string& says) {
    try {
      hf::CausalLm m(c, l);
      BOOST_ERROR("not refused: " << says);
    } catch (const config_error& e) {
      BOOST_TEST(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
  };
  refused(gpt2(), {.r = 2, .targets = {"c_fc"}, .modules_to_save = {"lm_head"}}, "ties its output head");
  refused(gpt2(), {.r = 2, .targets = {"c_fc"}, .modules_to_save = {"wte"}}, "ties its output head");
  refused(config, {.r = 2, .targets = {"q_proj"}, .modules_to_save = {"norm"}}, "\"norm\" is not supported");
  refused(config, {.r = 2, .targets = {"q_proj"}, .modules_to_save = {"all-linear"}}, "is not supported");
  refused(config, {.modules_to_save = {"lm_head"}}, "modules_to_save without LoRA adapters");
}

// Loading an adapter whose files do not match the model fails naming it, and changes nothing.
BOOST_AUTO_TEST_CASE(mismatched_adapter_is_refused) {
  const hf::LmConfig config = llama();
  const fs::path adapter = fs::path(DTRAIN_TEST_BINARY_DIR) / "lora_adapter_llama";
  BOOST_REQUIRE(fs::exists(adapter / "adapter_model.safetensors"));  // from adapter_round_trip_and_merge
  run_ranks(1, [&](World& w) {
    hf::CausalLm model(config, {.r = 2, .alpha = 4.f, .targets = {"q_proj"}});  // fewer targets than the file
    Trainer<hf::CausalLm> trainer(w, model, AdamW{});
    const Params before = trainer.parameters();
    BOOST_CHECK_THROW(hf::load_adapter(trainer, adapter, model), config_error);
    BOOST_TEST((trainer.parameters() == before));
  });
}

BOOST_AUTO_TEST_CASE(unsupported_adapter_configs_are_refused) {
  const Json good{{"peft_type", "LORA"},          {"r", 4},         {"lora_alpha", 8},
                  {"target_modules", {"q_proj"}}, {"bias", "none"}, {"use_dora", false},
                  {"modules_to_save", nullptr}};
  auto read = [&](const Json& j) {
    const fs::path d = fresh("lora_config_case");
    fs::create_directories(d);
    std::ofstream(d / "adapter_config.json") << j.dump();
    return hf::read_adapter_config(d);
  };
  const hf::LoraConfig c = read(good);
  BOOST_TEST(c.r == 4);
  BOOST_TEST(c.alpha == 8.f);
  BOOST_TEST((c.targets == std::vector<std::string>{"q_proj"}));
  BOOST_TEST(!c.regex);
  BOOST_TEST(c.modules_to_save.empty());
  Json regex = good;
  regex["target_modules"] = ".*q_proj";
  BOOST_TEST(read(regex).regex);
  Json saved = good;
  saved["modules_to_save"] = {"embed_tokens", "lm_head"};
  BOOST_TEST((read(saved).modules_to_save == std::vector<std::string>{"embed_tokens", "lm_head"}));
  saved["modules_to_save"] = "lm_head";
  BOOST_CHECK_THROW(read(saved), checkpoint_error);  // a list, as PEFT writes it
  for (const auto& [key, value] : std::vector<std::pair<std::string, Json>>{{"use_dora", true},
                                                                            {"bias", "all"},
                                                                            {"rank_pattern", {{"q_proj", 8}}},
                                                                            {"layers_to_transform", {0}},
                                                                            {"peft_type", "IA3"}}) {
    Json j = good;
    j[key] = value;
    BOOST_CHECK_THROW(read(j), config_error);
  }
  BOOST_CHECK_THROW(hf::read_adapter_config(fresh("lora_no_such_adapter")), checkpoint_error);
  // Numbers no field can hold are named, never converted (a float rank
  // beyond int64 was undefined behaviour before; found by fuzzing).
  for (const auto& [key, value] : std::vector<std::pair<std::string, Json>>{
           {"r", 1.7e44}, {"r", 2.5}, {"r", "4"}, {"lora_alpha", 1e300}, {"lora_dropout", "0.1"}}) {
    Json j = good;
    j[key] = value;
    std::string message;
    try {
      (void)read(j);
    } catch (const checkpoint_error& e) {
      message = e.what();
    }
    BOOST_TEST_INFO(key << " = " << value.dump() << " -> " << message);
    BOOST_TEST(message.find(key + " is " + value.dump().substr(0, 3)) != std::string::npos);
  }
}

BOOST_AUTO_TEST_SUITE_END()
