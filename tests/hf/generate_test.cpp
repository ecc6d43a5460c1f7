// dtrain::generate (train/generate.hpp) on tiny hf::CausalLm models (Llama
// with grouped-query heads, Gemma 3 with QK-norm, a sliding window and
// local rotary bases, GPT-2 with learned positions), their weights drawn
// N(0, 0.3) so every weight shows in the logits:
//   - the key-value cache's logits equal a full forward's at every step
//     (1e-5 of the largest), and cached and uncached decoding give the
//     same tokens, greedy and sampled, with LoRA adapters on and off;
//   - a batch of prompts of different lengths gives each prompt the tokens
//     it gets alone;
//   - sampling gives each record the same tokens at one rank and at two
//     under FSDP, whichever rank holds it;
//   - bad options are config errors naming the fix;
//   - GRPO's batches, and a reward that is not finite.
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/config.hpp>
#include <dtrain/hf/model.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/io/safetensors.hpp>
#include <dtrain/train/generate.hpp>
#include <dtrain/train/grpo.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
using namespace dtrain;
using dtrain::testing::run_ranks;

namespace {

using Prompts = std::vector<std::vector<std::int64_t>>;

hf::LmConfig tiny(const std::string& type) {
  nlohmann::json j{{"model_type", type == "gemma3" ? "gemma3_text" : type},
                   {"vocab_size", 53},
                   {"hidden_size", 32},
                   {"intermediate_size", 40},
                   {"num_hidden_layers", 3},
                   {"num_attention_heads", 4},
                   {"num_key_value_heads", 2},
                   {"max_position_embeddings", 24},
                   {"rms_norm_eps", 1e-5},
                   {"rope_theta", 500.0},
                   {"tie_word_embeddings", false}};
  if (type == "gpt2")
    j = {{"model_type", "gpt2"},
         {"vocab_size", 53},
         {"n_embd", 32},
         {"n_layer", 3},
         {"n_head", 4},
         {"n_positions", 24},
         {"layer_norm_epsilon", 1e-5},
         {"activation_function", "gelu_new"}};
  if (type == "gemma3") {
    j["head_dim"] = 12;
    j["sliding_window"] = 3;
    j["query_pre_attn_scalar"] = 12;
    j["rope_local_base_freq"] = 50.0;
    j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  }
  return hf::parse_config(j, "config.json");
}

// Every parameter drawn N(0, 0.3) (the adapters' too), loaded into the trainer.
template <class Trainer>
void randomize(Trainer& t, const fs::path& file, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 0.3f);
  std::map<std::string, std::vector<float>> values = t.parameters();
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& unit : t.layout().units())
    for (const auto& slot : unit.params) shapes[slot.name] = slot.spec.shape;
  SafetensorsWriter w;
  for (auto& [name, v] : values) {
    for (float& x : v) x = normal(gen);
    w.add(name, element_type::f32, shapes.at(name), std::as_bytes(std::span(v)));
  }
  w.write(file);
  const LoadParamsReport r = t.load_params(file, {.strict = false});
  dtrain::testing::require(r.mismatched.empty() && r.missing.empty(), "every parameter drawn");
}

const Prompts prompts{{3, 14, 15}, {9, 2, 6, 5, 35, 8, 9}, {7}, {31, 4, 1, 5}};

std::string text(const std::vector<std::int64_t>& v) {
  std::string s;
  for (const auto x : v) s += std::to_string(x) + " ";
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(cached_decoding_equals_full_forwards) {
  for (const std::string type : {"llama", "gemma3", "gpt2"})
    for (const bool lora : {false, true}) {
      run_ranks(1, [&](World& w) {
        const hf::LmConfig c = tiny(type);
        const hf::LoraConfig adapters{
            .r = lora ? 4 : 0,
            .alpha = 8.f,
            .targets = {type == "gpt2" ? "c_attn" : "q_proj", type == "gpt2" ? "c_proj" : "v_proj"}};
        hf::CausalLm m(c, adapters);
        Trainer<hf::CausalLm, Strategy<DDP>> t(w, m, AdamW{});
        randomize(t, fs::path(DTRAIN_TEST_BINARY_DIR) / ("generate_" + type + ".safetensors"), 7);
        // The cache's logits at each step against a full forward over the same tokens.
        std::vector<std::int64_t> seq = prompts[1];
        const auto cap = static_cast<std::int64_t>(seq.size()) + 6;
        double worst = 0, scale = 0;
        for (int step = 0; step < 6; ++step) {
          const auto n = static_cast<std::int64_t>(seq.size());
          const std::int64_t fed = step == 0 ? n : 1;
          std::vector<std::int64_t> pos;
          for (std::int64_t t_ = n - fed; t_ < n; ++t_) pos.push_back(t_);
          Batch b;
          b.set("x", HostTensor::of(std::vector<std::int64_t>(seq.end() - fed, seq.end()), {1, fed}));
          b.set("position_ids", HostTensor::of(pos, {1, fed}));
          const std::int64_t last = fed - 1;
          const std::vector<float> cached = t.decode(b, std::span(&last, 1), {.cache_positions = cap});
          Batch full;
          full.set("x", HostTensor::of(seq, {1, n}));
          const std::vector<float> all = t.predict(full);
          for (std::size_t v = 0; v < cached.size(); ++v) {
            const double want = all[static_cast<std::size_t>(n - 1) * cached.size() + v];
            worst = std::max(worst, std::abs(cached[v] - want));
            scale = std::max(scale, std::abs(want));
          }
          seq.push_back(static_cast<std::int64_t>(step * 11 % 53));
        }
        t.release_kv_cache();
        BOOST_TEST(worst / scale <= 1e-5, type << (lora ? " lora" : "") << ": cached logits off by " << worst / scale);
        for (const float temperature : {0.f, 1.f}) {
          const GenerateOptions o{
              .max_new_tokens = 10, .temperature = temperature, .top_k = 20, .seed = 5, .max_positions = 24};
          GenerateOptions off = o;
          off.cache = false;
          const GenerateResult a = generate(t, std::span(prompts), {}, o), b = generate(t, std::span(prompts), {}, off);
          for (std::size_t i = 0; i < prompts.size(); ++i)
            BOOST_TEST(a.tokens[i] == b.tokens[i], type << " prompt " << i << " temperature " << temperature << ": "
                                                        << text(a.tokens[i]) << "vs " << text(b.tokens[i]));
          BOOST_TEST(a.new_tokens == 40);
          BOOST_TEST(a.steps == 10);
        }
        if (lora) {  // the base: the adapters off differ from the adapters on
          const GenerateResult on = generate(t, std::span(prompts), {}, {.max_new_tokens = 6});
          const GenerateResult base = generate(t, std::span(prompts), {}, {.max_new_tokens = 6, .adapters = false});
          const GenerateResult base_full =
              generate(t, std::span(prompts), {}, {.max_new_tokens = 6, .cache = false, .adapters = false});
          BOOST_TEST(on.tokens != base.tokens, type << ": the adapters change the tokens");
          BOOST_TEST(base.tokens == base_full.tokens, type);
        }
      });
    }
}

BOOST_AUTO_TEST_CASE(ragged_batches_give_each_prompt_its_own_tokens) {
  run_ranks(1, [&](World& w) {
    const hf::LmConfig c = tiny("llama");
    hf::CausalLm m(c);
    Trainer<hf::CausalLm, Strategy<DDP>> t(w, m, AdamW{});
    randomize(t, fs::path(DTRAIN_TEST_BINARY_DIR) / "generate_ragged.safetensors", 8);
    const std::vector<std::uint64_t> ids{40, 41, 42, 43};
    for (const float temperature : {0.f, 0.8f}) {
      const GenerateOptions o{
          .max_new_tokens = 8, .temperature = temperature, .top_p = 0.9f, .stop_tokens = {17}, .seed = 3};
      const GenerateResult all = generate(t, std::span(prompts), std::span(ids), o);
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        const GenerateResult one = generate(t, std::span(prompts).subspan(i, 1), std::span(ids).subspan(i, 1), o);
        BOOST_TEST(one.tokens[0] == all.tokens[i],
                   "prompt " << i << ": alone " << text(one.tokens[0]) << "in the batch " << text(all.tokens[i]));
        const auto& got = all.tokens[i];
        BOOST_TEST((got.size() == 8 || (!got.empty() && got.back() == 17)), "ends at a stop token or the limit");
      }
    }
  });
}

BOOST_AUTO_TEST_CASE(sampling_is_the_same_at_any_world_size) {
  const GenerateOptions o{.max_new_tokens = 9, .temperature = 1.f, .top_k = 12, .top_p = 0.95f, .seed = 21};
  const std::vector<std::uint64_t> ids{100, 101, 102, 103};
  std::vector<std::vector<std::int64_t>> one_rank, two_ranks(prompts.size());
  for (const int ranks : {1, 2})
    run_ranks(ranks, [&](World& w) {
      const hf::LmConfig c = tiny("gemma3");
      hf::CausalLm m(c);
      Trainer<hf::CausalLm, Strategy<FSDP<FullShard>>> t(w, m, AdamW{});
      randomize(t,
                fs::path(DTRAIN_TEST_BINARY_DIR) /
                    ("generate_fsdp" + std::to_string(ranks) + "_" + std::to_string(w.rank()) + ".safetensors"),
                9);  // the same values on every rank, each rank its own file
      // rank r holds the prompts r, r + ranks, ... (two ranks: rank 1 has fewer tokens to write)
      Prompts mine;
      std::vector<std::uint64_t> my_ids;
      for (std::size_t i = static_cast<std::size_t>(w.rank()); i < prompts.size(); i += static_cast<std::size_t>(ranks))
        mine.push_back(prompts[i]), my_ids.push_back(ids[i]);
      const GenerateResult r = generate(t, std::span(mine), std::span(my_ids), o);
      for (std::size_t k = 0; k < mine.size(); ++k) {
        const std::size_t i = static_cast<std::size_t>(w.rank()) + k * static_cast<std::size_t>(ranks);
        (ranks == 1 ? one_rank.emplace_back() : two_ranks[i]) = r.tokens[k];
      }
    });
  for (std::size_t i = 0; i < prompts.size(); ++i)
    BOOST_TEST(one_rank[i] == two_ranks[i], "record " << i << ": " << text(one_rank[i]) << "vs " << text(two_ranks[i]));
}

BOOST_AUTO_TEST_CASE(generate_refuses_bad_options) {
  run_ranks(1, [&](World& w) {
    hf::CausalLm m(tiny("llama"));
    Trainer<hf::CausalLm, Strategy<DDP>> t(w, m, AdamW{});
    const auto fails = [&](const Prompts& p, const GenerateOptions& o, const std::string& text) {
      try {
        generate(t, std::span(p), {}, o);
        BOOST_ERROR("no error: " << text);
      } catch (const config_error& e) {
        BOOST_TEST(std::string(e.what()).find(text) != std::string::npos, e.what());
      }
    };
    fails({{1, 2}, {}}, {}, "prompt 1 is empty");
    fails(prompts, {.max_new_tokens = 20, .max_positions = 24}, "prompt 1 (7 tokens) and 20 new tokens are longer");
    fails(prompts, {.top_p = 0.f}, "top_p in (0, 1]");
    fails(prompts, {.max_new_tokens = 0}, "max_new_tokens >= 1");
  });
}

// GRPO's batch (train/grpo.hpp): num_generations completions per prompt,
// the same for the same step at any batch; a reward that is not finite is
// named and makes the step's loss non-finite, which on_nonfinite = stop
// turns into a nonfinite_error (nothing applied).
BOOST_AUTO_TEST_CASE(grpo_batches_and_a_nonfinite_reward) {
  run_ranks(1, [&](World& w) {
    hf::CausalLm m(tiny("llama"));
    m.loss = nn::GrpoLoss(nn::GrpoLossOptions{});
    Trainer<hf::CausalLm, Strategy<DDP>> t(w, m, AdamW{});
    randomize(t, fs::path(DTRAIN_TEST_BINARY_DIR) / "generate_grpo.safetensors", 10);
    const std::vector<std::uint64_t> ids{7, 8};
    const GrpoOptions o{.num_generations = 3, .generation = {.max_new_tokens = 4, .temperature = 1.f}};
    const GrpoBatch b = grpo_batch(t, std::span(prompts).first(2), std::span(ids), rewards::token_count(5), o, 12);
    BOOST_TEST(b.rewards.size() == 6u);
    BOOST_TEST(b.batch.at("y").shape[0] == 6);
    BOOST_TEST(b.nonfinite.empty());
    const GrpoBatch again =
        grpo_batch(t, std::span(prompts).subspan(1, 1), std::span(ids).subspan(1, 1), rewards::token_count(5), o, 12);
    for (std::size_t k = 0; k < 3; ++k) BOOST_TEST(again.generation.tokens[k] == b.generation.tokens[3 + k]);
    const std::vector<double> adv = group_advantages(b.rewards, 3);
    double group = 0;
    for (std::size_t k = 0; k < 3; ++k) group += adv[k];
    BOOST_TEST(std::abs(group) < 1e-9, "advantages sum to 0 within a group");
    const RewardFunction nan_for_one = [](std::span<const std::int64_t> p, std::span<const std::int64_t>) {
      return p[0] == 9 ? std::nan("") : 1.0;
    };
    GrpoBatch bad = grpo_batch(t, std::span(prompts).first(2), std::span(ids), nan_for_one, o, 13);
    BOOST_TEST_REQUIRE(bad.nonfinite.size() == 3u);
    BOOST_TEST(bad.nonfinite[0].find("prompt 8, completion 0: reward nan") != std::string::npos, bad.nonfinite[0]);
    BOOST_CHECK_THROW(t.step(std::span(&bad.batch, 1)), nonfinite_error);
  });
}
