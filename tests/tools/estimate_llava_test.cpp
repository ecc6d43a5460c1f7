// dtrain-estimate --hf-config over a LLaVA config: a tiny one written here
// (a CLIP tower of 32 px images, patch 8, 2 layers, width 32, features at
// layer -2 without the class token: 16 per image, 1 layer run; a Llama of
// 2 layers, width 32, vocabulary 64). Per train mode (projector;
// projector,vision; all):
//  - the trainable parameters the tool reports against counts worked out
//    here from the config's shapes, not from the model;
//  - its params, grads, optimizer state and master against what a host
//    Trainer over hf::Llava measures (DDP fp32 at 1 rank, FSDP FullShard
//    bf16 at 2), byte for byte, and its activations against the measured
//    ones: never above them, and the saving of activation checkpointing
//    exact (what the allocator counts beyond the estimate is the units'
//    transient workspace, the same in both; in fp32 the estimate's saving
//    also holds the patch embedding's view of the images, which that unit
//    only keeps in a 16-bit compute dtype);
//  - the table's rows, LoRA on the language model, a train_vlm preset
//    (--config --example vlm: the same row as --hf-config), and the usage
//    errors (one line, exit 2).
#define BOOST_TEST_MODULE tools_estimate_llava
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <support/ranks.hpp>
#include <tools/estimate_cli.hpp>

#include <dtrain/hf/llava.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
namespace hf = dtrain::hf;
using namespace dtrain;
using namespace dtrain::testing;

namespace {

// The config's shapes, the one source of both the file and the expected counts.
constexpr std::int64_t channels = 3, image = 32, patch = 8, v_width = 32, v_inter = 64, v_layers = 2, v_heads = 4;
constexpr std::int64_t feature_layer = -2;
constexpr std::int64_t t_width = 32, t_inter = 64, t_layers = 2, t_heads = 4, t_kv_heads = 2, vocab = 64;
constexpr std::int64_t image_token = vocab - 1;

const fs::path config_file = fs::path(DTRAIN_TEST_BINARY_DIR) / "tiny_llava_config.json";

void write_config() {
  std::ofstream(config_file) << R"({"model_type": "llava", "image_token_index": )" << image_token
                             << R"(, "vision_feature_layer": )" << feature_layer
                             << R"(, "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": )"
                             << v_width << R"(, "intermediate_size": )" << v_inter << R"(, "num_hidden_layers": )"
                             << v_layers << R"(, "num_attention_heads": )" << v_heads << R"(, "image_size": )" << image
                             << R"(, "patch_size": )" << patch << R"(, "num_channels": )" << channels
                             << R"(, "hidden_act": "quick_gelu"},
    "text_config": {"model_type": "llama", "vocab_size": )"
                             << vocab << R"(, "hidden_size": )" << t_width << R"(, "intermediate_size": )" << t_inter
                             << R"(, "num_hidden_layers": )" << t_layers << R"(, "num_attention_heads": )" << t_heads
                             << R"(, "num_key_value_heads": )" << t_kv_heads
                             << R"(, "max_position_embeddings": 128, "rms_norm_eps": 1e-05, "hidden_act": "silu",
      "tie_word_embeddings": false}})";
}

// Per image: CLIP's patches and class token, less the dropped first token.
constexpr std::int64_t tokens = (image / patch) * (image / patch) + 1, features = tokens - 1;

// The projector: linear_1 (vision width -> text width) and linear_2, with biases.
constexpr std::int64_t projector = (v_width * t_width + t_width) + (t_width * t_width + t_width);
// The tower's parameters that run: the patch embedding (no bias), class
// token, positions, pre_layrnorm and the layers hidden_states[-2] needs (L - 1).
constexpr std::int64_t v_layer = 2 * (2 * v_width) + 4 * (v_width * v_width + v_width) + (v_width * v_inter + v_inter) +
                                 (v_inter * v_width + v_width);
constexpr std::int64_t vision = v_width * channels * patch * patch + v_width + tokens * v_width + 2 * v_width +
                                (v_layers + 1 + feature_layer) * v_layer;
// The Llama: token embedding, per layer two RMSNorms, q, k, v, o (no
// biases; k and v over the key/value heads), gate, up, down; the final
// norm and an untied head.
constexpr std::int64_t kv_width = t_kv_heads * (t_width / t_heads);
constexpr std::int64_t t_layer = 2 * t_width + 2 * t_width * t_width + 2 * t_width * kv_width + 3 * t_width * t_inter;
constexpr std::int64_t language = vocab * t_width + t_layers * t_layer + t_width + vocab * t_width;

const std::map<std::string, std::int64_t> trainable_of = {
    {"projector", projector}, {"projector,vision", projector + vision}, {"all", projector + vision + language}};

// The tool's JSON rows for the tiny config with `args`.
nlohmann::json estimate_rows(const std::string& args) {
  write_config();
  const auto [rc, out] = run_cli("--hf-config " + config_file.string() + " --json " + args);
  BOOST_TEST_REQUIRE(rc == 0, out);
  return nlohmann::json::parse(out).at("strategies");
}

const nlohmann::json& row(const nlohmann::json& rows, const std::string& train, int world,
                          const std::string& strategy) {
  for (const auto& r : rows)
    if (r.at("train") == train && r.at("world") == world && r.at("strategy") == strategy) return r;
  BOOST_FAIL("no row for " << train << " at world " << world << " under " << strategy);
  return rows.at(0);
}

constexpr std::int64_t batch = 2, positions = features + 8;

// One rank's micro-batch: images, ids with the image's 16 tokens at 2, next ids.
Batch llava_batch(int rank, int step) {
  std::vector<float> pixels(static_cast<std::size_t>(batch * channels * image * image));
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<float>((i * 37 + static_cast<std::size_t>(rank * 11 + step * 5)) % 97) / 97.f - 0.5f;
  std::vector<std::int32_t> x, y;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < positions; ++t) {
      const bool in_image = t >= 2 && t < 2 + features;
      x.push_back(in_image ? static_cast<std::int32_t>(image_token)
                           : static_cast<std::int32_t>((t * 7 + b * 3 + rank + step) % (vocab - 1)));
      y.push_back(static_cast<std::int32_t>((t * 5 + b + rank) % (vocab - 1)));
    }
  Batch out;
  out.set("pixel_values", HostTensor::of(pixels, {batch, channels, image, image}));
  out.set("x", HostTensor::of(x, {batch, positions}));
  out.set("y", HostTensor::of(y, {batch, positions}));
  return out;
}

// Rank 0's memory after two AdamW steps of a host Trainer over hf::Llava.
template <class Prec, class Kind>
MemoryUsage measure(const std::string& train, int world, bool checkpointing) {
  const hf::LlavaConfig config = hf::read_llava_config(config_file);
  MemoryUsage measured;
  run_ranks(world, [&](World& w) {
    hf::Llava model(config, hf::parse_llava_train(train));
    TrainerOptions o{.seed = 5};
    o.activation_checkpointing = checkpointing;
    Trainer<hf::Llava, Device<Host>, Prec, Strategy<Kind>> trainer(w, model, AdamW{.lr = 1e-3f}, o);
    for (int step = 0; step < 2; ++step) trainer.step(std::vector<Batch>{llava_batch(w.rank(), step)});
    if (w.rank() == 0) measured = trainer.memory();
  });
  return measured;
}

template <class Prec, class Kind>
void check_against_trainer(const std::string& precision, int world) {
  const std::string strategy(Kind::name);
  const std::string args = "--precision " + precision + " --world " + std::to_string(world) + " --strategy " +
                           strategy + " --batch-size " + std::to_string(batch) + " --seq-len " +
                           std::to_string(positions);
  const nlohmann::json plain = estimate_rows(args), recomputed = estimate_rows(args + " --activation-checkpointing");
  for (const auto& [train, trainable] : trainable_of) {
    const std::string label = train + " " + precision + " " + strategy + " world " + std::to_string(world);
    const nlohmann::json& e = row(plain, train, world, strategy);
    const MemoryUsage m = measure<Prec, Kind>(train, world, false);
    BOOST_TEST(e.at("params").get<std::size_t>() == m.params, label << " params");
    BOOST_TEST(e.at("grads").get<std::size_t>() == m.grads, label << " grads");
    BOOST_TEST(e.at("optimizer").get<std::size_t>() == m.optimizer, label << " optimizer");
    BOOST_TEST(e.at("master").get<std::size_t>() == m.master, label << " master");
    // AdamW: two fp32 states per trainable parameter, none for the frozen ones
    BOOST_TEST(m.optimizer * static_cast<std::size_t>(world) >= 8 * static_cast<std::size_t>(trainable), label);
    BOOST_TEST(m.optimizer * static_cast<std::size_t>(world) < 8 * static_cast<std::size_t>(trainable + 64), label);
    const auto activations = e.at("activations").get<std::size_t>();
    BOOST_TEST(activations <= m.activations,
               label << ": activations estimated " << activations << " B, measured " << m.activations << " B");
    const MemoryUsage r = measure<Prec, Kind>(train, world, true);
    const nlohmann::json& er = row(recomputed, train, world, strategy);
    // The patch embedding's saved view of the images: counted by the
    // estimate (saved_size, its largest need), which the unit does not keep
    // in fp32 (it reads the batch's float32 images): one recompute less.
    const std::size_t images_view =
        std::is_same_v<typename Prec::param_type, float> ? sizeof(float) * batch * channels * image * image : 0;
    const auto saved = activations - er.at("activations").get<std::size_t>() - images_view;
    BOOST_TEST(saved > 0u, label);
    BOOST_TEST(m.activations - r.activations == saved, label << ": checkpointing saves " << saved
                                                             << " B estimated, measured "
                                                             << m.activations - r.activations << " B");
    BOOST_TEST_MESSAGE(label << ": activations estimated " << activations << " B, measured " << m.activations << " B ("
                             << r.activations << " B checkpointed)");
  }
}

}  // namespace

// The trainable parameters per mode: LLaVA's stages, from the shapes alone.
BOOST_AUTO_TEST_CASE(trainable_parameters_per_mode) {
  const nlohmann::json rows = estimate_rows("");
  for (const auto& [train, trainable] : trainable_of) {
    const nlohmann::json& r = row(rows, train, 1, "ddp");
    BOOST_TEST(r.at("trainable").get<std::int64_t>() == trainable, train);
  }
  write_config();
  const auto [rc, out] = run_cli("--hf-config " + config_file.string() + " --json");
  const nlohmann::json inputs = nlohmann::json::parse(out).at("inputs");
  BOOST_TEST(inputs.at("parameters").get<std::int64_t>() == projector + vision + language);
  BOOST_TEST(inputs.at("micro_batch").get<std::int64_t>() == features + 64, "default: 1 x (features + 64)");
}

BOOST_AUTO_TEST_CASE(ddp_fp32_matches_the_trainer) { check_against_trainer<Precision<fp32>, DDP>("fp32", 1); }

BOOST_AUTO_TEST_CASE(fsdp_full_bf16_matches_the_trainer) {
  check_against_trainer<Precision<bf16>, FSDP<FullShard>>("bf16", 2);
}

// The table: one row per mode, world and strategy asked for; --train picks modes.
BOOST_AUTO_TEST_CASE(cli_table_has_every_mode) {
  write_config();
  const std::string base = "--hf-config " + config_file.string();
  const auto [rc, out] = run_cli(base + " --precision bf16 --world 1,2,4 --strategy ddp,fsdp-full");
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE_EQUAL(rc, 0);
  for (const auto& [train, trainable] : trainable_of) {
    BOOST_TEST(out.find("\ntrain " + train + ": ") != std::string::npos, train << ": " << out);
    std::size_t lines = 0;
    std::istringstream text(out);
    for (std::string line; std::getline(text, line);) lines += line.starts_with("| " + train + " ") ? 1 : 0;
    BOOST_TEST(lines == 6u, train << ": 3 worlds x 2 strategies");
  }
  const auto [one_rc, one] = run_cli(base + " --train projector,vision --train language --json");
  BOOST_REQUIRE_EQUAL(one_rc, 0);
  BOOST_TEST(one.find("\"train\": \"projector,vision\"") != std::string::npos, one);
  BOOST_TEST(one.find("\"train\": \"language\"") != std::string::npos, one);
  BOOST_TEST(one.find("\"train\": \"all\"") == std::string::npos, one);
}

// LoRA adapters of rank 4 on q_proj and v_proj (A [r, in], B [out, r]) beside the projector.
BOOST_AUTO_TEST_CASE(cli_lora_adapts_the_language_model) {
  const nlohmann::json rows = estimate_rows("--train projector --lora-r 4 --lora-targets q_proj,v_proj");
  const std::int64_t adapters = t_layers * 4 * ((t_width + t_width) + (t_width + kv_width));
  BOOST_TEST(row(rows, "projector", 1, "ddp").at("trainable").get<std::int64_t>() == projector + adapters);
}

// train_vlm's preset (--example vlm): its train= mode, batch_size and
// precision, the model from model=; the same row as --hf-config gives.
BOOST_AUTO_TEST_CASE(cli_reads_a_train_vlm_preset) {
  write_config();
  const fs::path preset = fs::path(DTRAIN_TEST_BINARY_DIR) / "vlm_preset.yaml";
  std::ofstream(preset) << "strategy: fsdp-full\nprecision: bf16\ntrain: projector,vision\nbatch_size: " << batch
                        << "\noptimizer: adamw\n";
  const std::string seq = " --seq-len " + std::to_string(positions);
  const auto [rc, out] =
      run_cli("--config " + preset.string() + " --example vlm --world 2 --json model=" + config_file.string() + seq);
  BOOST_REQUIRE_MESSAGE(rc == 0, out);
  const nlohmann::json rows = nlohmann::json::parse(out).at("strategies");
  const nlohmann::json expected = estimate_rows(
      "--precision bf16 --world 2 --strategy fsdp-full --train "
      "projector,vision --batch-size " +
      std::to_string(batch) + seq);
  const nlohmann::json& e = row(expected, "projector,vision", 2, "fsdp-full");
  const nlohmann::json& r = row(rows, "projector,vision", 2, "fsdp-full");
  for (const char* field : {"trainable", "params", "grads", "optimizer", "master", "activations"})
    BOOST_TEST(r.at(field) == e.at(field), field);
  const fs::path gpt2 = fs::path(DTRAIN_TEST_BINARY_DIR) / "vlm_preset_gpt2.json";
  std::ofstream(gpt2) << R"({"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4})";
  const auto [bad_rc, bad] = run_cli("--config " + preset.string() + " --example vlm --world 2 model=" + gpt2.string());
  BOOST_TEST(bad_rc == 2, bad);
  BOOST_TEST(bad.find("is not a LLaVA config") != std::string::npos, bad);
}

BOOST_AUTO_TEST_CASE(cli_usage_errors_exit_2) {
  write_config();
  const fs::path llama = fs::path(DTRAIN_TEST_BINARY_DIR) / "tiny_llama_config.json";
  std::ofstream(llama) << R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})";
  const std::string base = "--hf-config " + config_file.string();
  const std::pair<std::string, std::string> cases[] = {
      {base + " --train projector,decoder", "\"decoder\" is not a part of a LLaVA model"},
      {base + " --seq-len 8", "--seq-len 8 is shorter than the image's 16 feature tokens"},
      {"--hf-config " + llama.string() + " --train projector", "--train needs a LLaVA config"},
      {"--params 7B --train projector", "--train needs a LLaVA --hf-config"},
      {"--params 7B --activation-checkpointing", "--activation-checkpointing needs a LLaVA --hf-config"},
      {base + " --world 2,x", "--world 'x' is not valid"},
      {base + " --strategy ddp,fsdp", "--strategy 'fsdp' is unknown"}};
  for (const auto& [args, problem] : cases) {
    const auto [rc, out] = run_cli(args);
    BOOST_TEST(rc == 2, args << ": " << out);
    BOOST_TEST(out.find(problem) != std::string::npos, args << ": " << out);
    BOOST_TEST(out.find("fix:") != std::string::npos, args << ": " << out);
    BOOST_TEST(std::count(out.begin(), out.end(), '\n') == 1, "one line: " << out);
  }
}
