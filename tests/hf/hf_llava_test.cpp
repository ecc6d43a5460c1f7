// LLaVA (hf/llava.hpp) against transformers itself: tiny random
// LlavaForConditionalGeneration models (make_tiny_llava.py: a CLIP tower of
// 16 px images, patch 4, hidden 32, 3 layers, features at layer -2 without
// the class token, 16 per image; a Llama of vocabulary 50, hidden 24, 2
// layers, 4 heads over 2 key/value heads; image token 49), made and checked
// by transformers 4.40.2 (the 4.x key layout: the pinned venv, or
// DTRAIN_TRANSFORMERS_PYTHON) and by the pinned torch2 set's transformers 5
// (its layout: DTRAIN_PYTHON_TORCH2). Two sequences of 23 ids, each with its
// image's 16 tokens (at 2 and at 4). For each:
//  - the logits, fp32, within 1e-5 of max(1, the largest |reference|);
//  - per train mode (projector; projector,vision; all) the first step's
//    loss (1e-5 relative) and the trainable parameters' gradients (one SGD
//    step, lr = 1) within 1e-5 of the largest reference gradient, against
//    torch autograd of the same mean cross-entropy; every frozen parameter
//    bit-identical after the step, and no optimizer state for it;
//  - AdamW (20 steps, lr 1e-3) at 1 rank and at 2 (one sequence each) under
//    DDP and FSDP FullShard: the parameters within 1e-5 of one another (the
//    tower's key biases, whose gradient is 0, within the steps' 2e-2);
//  - save_pretrained from dtrain (FSDP, 2 ranks, after training in each
//    mode, and the projector with LoRA) loaded by transformers: its logits
//    within 1e-5 of dtrain's, what the mode froze exactly the originals
//    (the tower's unrun layer and post_layernorm included, in every mode).
// And the errors: image tokens that do not match the features, a train=
// part the model lacks, an unknown model_type (LLaVA's, its tower's, its
// language model's).
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "hf/run_logged.hpp"
#include "support/pinned_main.hpp"
#include "support/python_venv.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/llava.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
namespace hf = dtrain::hf;
using namespace dtrain;
using namespace dtrain::testing;

namespace {

const fs::path work = fs::path(DTRAIN_TEST_BINARY_DIR) / "llava";
const fs::path venv = fs::path(DTRAIN_TEST_BINARY_DIR) / "venv";
const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/tests/hf/make_tiny_llava.py";
const char* const transformers_pin =
    "transformers==4.40.2 tokenizers==0.19.1 huggingface_hub==0.36.2 safetensors==0.8.0 regex==2026.11.19 "
    "filelock==4.3.1 fsspec==2026.9.0 hf-xet==1.8.0 tqdm==4.70.1";

// The transformers 4 python ("" when none), and the transformers 5 one.
std::string python4() {
  if (const char* chosen = std::getenv("DTRAIN_TRANSFORMERS_PYTHON"); chosen != nullptr && *chosen != '\0')
    return chosen;
  return python_venv_with(venv, "transformers", transformers_pin, 600).empty() ? (venv / "bin/python").string() : "";
}
std::string python5() {
  try {
    return pinned_python_missing("torch2").empty() ? pinned_python("torch2") : "";
  } catch (const std::exception&) {
    return "";
  }
}

using Values = std::map<std::string, std::vector<float>>;

struct Case {
  std::string python, tower, text;
  int major;
  fs::path dir;
};

Case make_case(const std::string& python, const std::string& tower, const std::string& text, int major) {
  const fs::path dir = work / (tower + "-" + text + "-" + std::to_string(major));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Gemma ties its head to the token embedding (its default), the Llama does not.
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 " + python + " " + script + " make " + dir.string() + " " + tower +
                          " " + text + (text == "gemma" ? " 1" : " 0");
  BOOST_TEST_REQUIRE(run_logged(cmd, dir / "make.log") == 0,
                     "make_tiny_llava.py failed: " << read_text(dir / "make.log"));
  return {python, tower, text, major, dir};
}

SafetensorsFile reference(const Case& c) { return SafetensorsFile::open(c.dir / "reference.safetensors"); }

// Sequences [first, first + n) of the reference's two: images, ids, next ids.
Batch batch(const Case& c, std::int64_t first, std::int64_t n) {
  const SafetensorsFile ref = reference(c);
  const auto slice = [&]<class E>(const std::string& name, std::vector<E> all) {
    std::vector<std::int64_t> shape = ref.tensor(name).shape;
    const std::size_t per = all.size() / static_cast<std::size_t>(shape[0]);
    shape[0] = n;
    return HostTensor::of(std::vector<E>(all.begin() + static_cast<std::ptrdiff_t>(first * per),
                                         all.begin() + static_cast<std::ptrdiff_t>((first + n) * per)),
                          shape);
  };
  Batch b;
  b.set("pixel_values", slice("pixel_values", ref.read_f32("pixel_values")));
  b.set("x", slice("ids", ref.read_i64("ids")));
  b.set("y", slice("y", ref.read_i64("y")));
  return b;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (const float e : v) m = std::max(m, std::abs(double(e)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  BOOST_TEST_REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

// The checkpoint renamed to transformers 5's in-memory names (model.vision_tower.,
// model.multi_modal_projector., model.language_model., lm_head.), which load too.
fs::path nested_copy(const Case& c) {
  const fs::path dir = c.dir / "nested";
  fs::create_directories(dir);
  fs::copy_file(c.dir / "model/config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  const SafetensorsFile f = SafetensorsFile::open(c.dir / "model/model.safetensors");
  const std::pair<std::string, std::string> renames[] = {{"vision_tower.", "model.vision_tower."},
                                                         {"multi_modal_projector.", "model.multi_modal_projector."},
                                                         {"language_model.model.", "model.language_model."},
                                                         {"language_model.lm_head.", "lm_head."}};
  std::list<std::vector<float>> values;  // the writer refers to them until write()
  SafetensorsWriter w;
  for (const std::string& name : f.names())
    for (const auto& [from, to] : renames)
      if (name.starts_with(from))
        w.add(to + name.substr(from.size()), f.tensor(name).shape, values.emplace_back(f.read_f32(name)));
  w.write(dir / "model.safetensors");
  return dir;
}

void check_logits(const Case& c) {
  const hf::LlavaConfig config = hf::read_llava_config(c.dir / "model");
  std::vector<float> got, from_nested;
  const fs::path nested = nested_copy(c);
  run_ranks(1, [&](World& w) {
    hf::Llava model(config, hf::parse_llava_train("all"));
    Trainer<hf::Llava> t(w, model, SGD{});
    hf::load_pretrained(t, c.dir / "model", model);
    got = t.predict(batch(c, 0, 2));
    hf::Llava again(config, hf::parse_llava_train("all"));
    Trainer<hf::Llava> t2(w, again, SGD{});
    hf::load_pretrained(t2, nested, again);
    from_nested = t2.predict(batch(c, 0, 2));
  });
  BOOST_TEST((got == from_nested), "the in-memory layout loads the same model");
  const std::vector<float> want = reference(c).read_f32("logits");
  const double diff = max_diff(got, want), scale = std::max(1.0, max_abs(want));
  BOOST_TEST(diff <= 1e-5 * scale, c.tower << "+" << c.text << " logits differ by " << diff);
  std::printf("%s+%s (transformers %d) logits: max difference %.3e (largest %.3e)\n", c.tower.c_str(), c.text.c_str(),
              c.major, diff, scale);
}

// Whether each parameter ("<unit>.<param>") trains.
std::map<std::string, bool> trainable_of(hf::Llava& model) {
  std::map<std::string, bool> out;
  dtrain::detail::for_each_unit(model.units(), [&](std::size_t i, auto& unit) {
    for (const ParamSpec& s : unit.params()) out[std::to_string(i) + "." + s.name] = s.trainable && s.tied_to.empty();
  });
  return out;
}

// transformers' in-memory parameter names (what the reference's grad.<name> use).
hf::LlavaLayout in_memory(int major) { return {.tower_prefixed = major < 5, .nested = major >= 5}; }

void check_mode(const Case& c, const std::string& mode) {
  const hf::LlavaConfig config = hf::read_llava_config(c.dir / "model");
  hf::Llava model(config, hf::parse_llava_train(mode));
  Values before, after;
  StepStats stats;
  run_ranks(1, [&](World& w) {
    hf::Llava mine = model;
    Trainer<hf::Llava> t(w, mine, SGD{.lr = 1.f});
    hf::load_pretrained(t, c.dir / "model", mine);
    before = t.parameters();
    stats = t.step(std::vector<Batch>{batch(c, 0, 2)});
    after = t.parameters();
  });
  const SafetensorsFile ref = reference(c);
  const double loss = ref.read_f32("loss").at(0);
  BOOST_TEST(std::abs(stats.loss - loss) <= 1e-5 * loss, mode << ": loss " << stats.loss << ", transformers " << loss);
  // Trainable: before - after is the gradient; frozen: untouched, and without optimizer state.
  const std::map<std::string, bool> trainable = trainable_of(model);
  const hf::TransformersNames names = hf::llava_transformers_names(model, in_memory(c.major));
  Values want;
  double scale = 0;
  for (const auto& [ours, theirs] : names.tensors) {
    if (!trainable.at(ours)) continue;
    std::vector<float> g;
    for (const std::string& t : theirs) {  // a fused tensor's parts in order
      BOOST_TEST_REQUIRE(ref.contains("grad." + t), "no reference gradient for " << t);
      const std::vector<float> part = ref.read_f32("grad." + t);
      g.insert(g.end(), part.begin(), part.end());
    }
    scale = std::max(scale, max_abs(g));
    want[ours] = std::move(g);
  }
  double worst = 0;
  std::size_t frozen = 0;
  for (const auto& [ours, values] : before) {
    if (!trainable.at(ours)) {
      BOOST_TEST((values == after.at(ours)), mode << ": frozen " << ours << " changed");
      ++frozen;
      continue;
    }
    const std::vector<float>& g = want.at(ours);
    for (std::size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::abs(double(values[i]) - after.at(ours)[i] - g[i]));
  }
  BOOST_TEST(worst <= 1e-5 * scale, mode << ": gradients differ by " << worst << " (largest " << scale << ")");
  BOOST_TEST(stats.memory.optimizer == 0u, mode << ": SGD without momentum keeps no state");
  std::printf(
      "%s+%s (transformers %d) train=%s: loss %.6f vs %.6f, %zu trained tensors, %zu frozen, gradients max "
      "difference %.3e (largest %.3e)\n",
      c.tower.c_str(), c.text.c_str(), c.major, mode.c_str(), stats.loss, loss, want.size(), frozen, worst, scale);
}

// AdamW keeps state for exactly the trainable elements: frozen parts have none.
void check_state(const Case& c) {
  const hf::LlavaConfig config = hf::read_llava_config(c.dir / "model");
  std::map<std::string, std::size_t> state;
  for (const std::string mode : {"projector", "all"})
    run_ranks(1, [&](World& w) {
      hf::Llava model(config, hf::parse_llava_train(mode));
      Trainer<hf::Llava> t(w, model, AdamW{});
      state[mode] = t.memory().optimizer;
      std::int64_t elements = 0;
      dtrain::detail::for_each_unit(model.units(), [&](std::size_t, auto& unit) {
        for (const ParamSpec& s : unit.params())
          if (s.trainable && s.tied_to.empty()) elements += s.numel();
      });
      // two moments per trainable element (padded per unit to a few bytes)
      BOOST_TEST(state[mode] >= 8u * static_cast<std::size_t>(elements));
      BOOST_TEST(state[mode] <= 8u * static_cast<std::size_t>(elements) + 4096u, mode << ": " << state[mode]);
    });
  std::printf("AdamW state: train=projector %zu bytes, train=all %zu bytes\n", state["projector"], state["all"]);
}

constexpr int adamw_count = 20;

template <class Kind>
Values adamw_steps(const Case& c, const std::string& mode, int ranks) {
  const hf::LlavaConfig config = hf::read_llava_config(c.dir / "model");
  Values out;
  run_ranks(ranks, [&](World& w) {
    hf::Llava model(config, hf::parse_llava_train(mode));
    Trainer<hf::Llava, Strategy<Kind>> t(w, model, AdamW{});
    hf::load_pretrained(t, c.dir / "model", model);
    for (int s = 0; s < adamw_count; ++s)
      t.step(std::vector<Batch>{ranks == 1 ? batch(c, 0, 2) : batch(c, w.rank(), 1)});
    const Values p = t.parameters();
    if (w.rank() == 0) out = p;
  });
  return out;
}

// The tower's key biases have no gradient (softmax ignores a shift shared by
// every key): only rounding noise, which AdamW scales up to steps of up to
// lr each, so they are bounded apart, by the steps' lr (20 x 1e-3). The
// rest: the sum over 1 or 2 ranks rounds differently, which 20 steps of
// AdamW carry into the parameters: within 1e-5.
void check_distributed(const Case& c) {
  for (const std::string mode : {"projector,vision", "all"}) {
    const Values one = adamw_steps<DDP>(c, mode, 1);
    double worst = 0, key_bias = 0;
    for (const Values& other : {adamw_steps<DDP>(c, mode, 2), adamw_steps<FSDP<FullShard>>(c, mode, 2),
                                adamw_steps<FSDP<FullShard>>(c, mode, 1)})
      for (const auto& [name, v] : one) {
        double& d = name.ends_with("attn.k.bias") ? key_bias : worst;
        d = std::max(d, max_diff(v, other.at(name)));
      }
    BOOST_TEST(worst <= 1e-5, mode << ": DDP/FSDP at 1 and 2 ranks differ by " << worst);
    BOOST_TEST(key_bias <= adamw_count * 1e-3, mode << ": the key biases differ by " << key_bias);
    std::printf(
        "%s+%s (transformers %d) train=%s: AdamW x%d, DDP 1|2 ranks, FSDP 1|2 ranks: max parameter "
        "difference %.3e (the tower's key biases, gradient 0: %.3e)\n",
        c.tower.c_str(), c.text.c_str(), c.major, mode.c_str(), adamw_count, worst, key_bias);
  }
}

// Trains `mode` (with `lora`) for 2 AdamW steps under FSDP at 2 ranks, saves
// and has transformers load the save: its logits are dtrain's, and the
// parts named in `same` are the originals, exactly; every frozen parameter
// is bit-identical after the steps.
void check_save(const Case& c, const std::string& mode, const hf::LoraConfig& lora, const std::string& same,
                const std::string& tag) {
  const fs::path saved = c.dir / ("saved-" + tag);
  std::vector<float> logits;
  std::size_t frozen = 0, changed = 0;
  Values before;  // as loaded
  run_ranks(1, [&](World& w) {
    hf::Llava model(hf::read_llava_config(c.dir / "model"), hf::parse_llava_train(mode), lora);
    Trainer<hf::Llava> trainer(w, model, SGD{});
    hf::load_pretrained(trainer, c.dir / "model", model);
    before = trainer.parameters();
  });
  run_ranks(2, [&](World& w) {
    // [snippet:llava]
    hf::Llava model(hf::read_llava_config(c.dir / "model"), hf::parse_llava_train(mode), lora);
    Trainer<hf::Llava, Strategy<FSDP<FullShard>>> trainer(w, model, AdamW{.lr = 1e-2f});
    hf::load_pretrained(trainer, c.dir / "model", model);                                 // transformers 4 or 5
    for (int s = 0; s < 2; ++s) trainer.step(std::vector<Batch>{batch(c, w.rank(), 1)});  // pixel_values, x, y
    hf::save_pretrained(trainer, saved, model, c.dir / "model");  // adapters merged, unrun tensors copied
    // [/snippet:llava]
    const Values after = trainer.parameters();
    const std::vector<float> mine = trainer.predict(batch(c, 0, 2));
    if (w.rank() != 0) return;
    logits = mine;
    for (const auto& [name, train] : trainable_of(model)) {
      if (!before.contains(name)) continue;  // tied: the embedding's
      if (train) {
        changed += before.at(name) != after.at(name) ? 1 : 0;
        continue;
      }
      require(before.at(name) == after.at(name), mode + ": frozen " + name + " changed");
      ++frozen;
    }
  });
  BOOST_TEST(changed > 0u);
  SafetensorsWriter out;
  out.set_metadata("same", same);
  const std::int64_t vocab = hf::read_llava_config(c.dir / "model").text.vocab_size;
  out.add("logits", {static_cast<std::int64_t>(logits.size()) / vocab, vocab}, logits);
  out.write(c.dir / "dtrain.safetensors");
  const std::string cmd =
      "OPENBLAS_NUM_THREADS=1 " + c.python + " " + script + " check " + saved.string() + " " + c.dir.string();
  const int rc = run_logged(cmd, c.dir / ("check-" + tag + ".log"));
  const std::string log = read_text(c.dir / ("check-" + tag + ".log"));
  BOOST_TEST_REQUIRE(rc == 0, "transformers could not load dtrain's save: " << log);
  double diff = 1, kept = 1;
  int count = 0;
  const auto at = log.rfind("logits ");
  BOOST_TEST_REQUIRE(at != std::string::npos, log);
  BOOST_TEST_REQUIRE(std::sscanf(log.c_str() + at, "logits %lf same %lf of %d", &diff, &kept, &count) == 3, log);
  BOOST_TEST(diff <= 1e-5 * std::max(1.0, max_abs(logits)), tag << " saved: logits differ by " << diff);
  BOOST_TEST(kept == 0.0, tag << " saved: the frozen tensors differ by " << kept);
  BOOST_TEST(count > 0);
  std::printf(
      "%s+%s (transformers %d) train=%s%s, FSDP 2 ranks, AdamW x2: %zu frozen tensors bit-identical, %zu "
      "trained changed; save -> transformers: logits %.3e, %d tensors of %s differ by %.3e\n",
      c.tower.c_str(), c.text.c_str(), c.major, mode.c_str(), lora.on() ? " + LoRA q,v" : "", frozen, changed, diff,
      count, same.c_str(), kept);
}

void check_all(const std::string& python, int major) {
  if (python.empty()) {
    BOOST_TEST_MESSAGE("no transformers " << major << " python: skipped");
    return;
  }
  for (const Case& c : {make_case(python, "clip", "llama", major), make_case(python, "siglip", "gemma", major)}) {
    BOOST_TEST_CONTEXT(c.tower << "+" << c.text << ", transformers " << major) {
      check_logits(c);
      for (const std::string mode : {"projector", "projector,vision", "all"}) check_mode(c, mode);
      check_state(c);
      check_save(c, "projector", {}, "vision_tower,language_model,lm_head", "projector");
      check_save(c, "projector,vision", {}, "language_model,lm_head", "vision");
      check_save(c, "all", {}, "post_layernorm", "all");  // the tower's unrun tensors, copied from the source
      // LoRA on the language model beside the projector: its base frozen, the adapters merged on save.
      check_save(c, "projector", {.r = 4, .alpha = 8.f, .targets = {"q_proj", "v_proj"}}, "vision_tower", "lora");
      check_distributed(c);
    }
  }
}

auto says(const std::string& part) {
  return [part](const config_error& e) {
    const bool found = std::string(e.what()).find(part) != std::string::npos;
    if (!found) BOOST_TEST_MESSAGE("message: " << e.what());
    return found;
  };
}

nlohmann::ordered_json tiny_llava() {
  return nlohmann::ordered_json::parse(R"({
    "model_type": "llava", "image_token_index": 49, "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 3, "num_attention_heads": 4, "image_size": 16, "patch_size": 4},
    "text_config": {"model_type": "llama", "vocab_size": 50, "hidden_size": 24, "intermediate_size": 40,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "max_position_embeddings": 64}})");
}

}  // namespace

BOOST_AUTO_TEST_CASE(transformers_4_layout) { check_all(python4(), 4); }

BOOST_AUTO_TEST_CASE(transformers_5_layout) { check_all(python5(), 5); }

BOOST_AUTO_TEST_CASE(config_errors_name_the_problem) {
  const auto good = tiny_llava();
  const hf::LlavaConfig c = hf::parse_llava_config(good, "c");
  BOOST_TEST(c.image_token == 49);
  BOOST_TEST(c.features_per_image() == 16);
  auto bad = good;
  bad["model_type"] = "llava_next";
  BOOST_CHECK_EXCEPTION(hf::parse_llava_config(bad, "c"), config_error, says("model_type \"llava_next\""));
  bad = good;
  bad["vision_config"]["model_type"] = "dinov2";
  BOOST_CHECK_EXCEPTION(hf::parse_llava_config(bad, "c"), config_error, says("\"dinov2\""));
  BOOST_CHECK_EXCEPTION(hf::parse_llava_config(bad, "c"), config_error, says("siglip_vision_model"));
  bad = good;
  bad["text_config"]["model_type"] = "falcon";
  BOOST_CHECK_EXCEPTION(hf::parse_llava_config(bad, "c"), config_error, says("\"falcon\""));
  BOOST_CHECK_EXCEPTION(hf::parse_llava_config(bad, "c"), config_error, says("llama"));
  bad = good;
  bad["projector_hidden_act"] = "silu";
  BOOST_CHECK_EXCEPTION(hf::parse_llava_config(bad, "c"), config_error, says("projector_hidden_act \"silu\""));
  bad = good;
  bad["vision_feature_layer"] = nlohmann::ordered_json::array({-2, -1});
  BOOST_CHECK_EXCEPTION(hf::parse_llava_config(bad, "c"), config_error, says("vision_feature_layer [-2,-1]"));
  bad = good;
  bad.erase("image_token_index");
  bad["image_token_id"] = 50;  // transformers 5's name, outside the vocabulary
  BOOST_CHECK_EXCEPTION(hf::parse_llava_config(bad, "c"), config_error, says("image token 50"));
  // train=: a part the model lacks is named.
  BOOST_CHECK_EXCEPTION(hf::parse_llava_train("projector,audio"), config_error, says("\"audio\""));
  const hf::LlavaTrain t = hf::parse_llava_train("projector, vision");
  BOOST_TEST((t.projector && t.vision && !t.language));
  // Image tokens that do not match the features name both counts.
  run_ranks(1, [&](World& w) {
    hf::Llava model(c, hf::parse_llava_train("all"));
    Trainer<hf::Llava> trainer(w, model, SGD{});
    for (const std::int64_t tokens : {15, 17}) {
      std::vector<std::int64_t> ids(20, 3);
      std::fill(ids.begin() + 1, ids.begin() + 1 + tokens, 49);
      Batch b;
      b.set("pixel_values", HostTensor::of(std::vector<float>(3 * 16 * 16, 0.5f), {1, 3, 16, 16}));
      b.set("x", HostTensor::of(ids, {1, 20}));
      b.set("y", HostTensor::of(std::vector<std::int64_t>(20, 1), {1, 20}));
      std::string message;
      try {
        trainer.predict(b);
      } catch (const config_error& e) {
        message = e.what();
      }
      require(message.find(std::to_string(tokens) + " image tokens") != std::string::npos &&
                  message.find("16 features") != std::string::npos,
              "the error names both counts: " + message);
    }
  });
}

// Every unit has its transformers module, in order: checkpoint_modules can
// aim activation checkpointing at either tower.
BOOST_AUTO_TEST_CASE(unit_modules_name_every_unit) {
  hf::Llava model(hf::parse_llava_config(tiny_llava(), "c"), hf::parse_llava_train("all"));
  std::size_t units = 0;
  dtrain::detail::for_each_unit(model.units(), [&](auto&&...) { ++units; });
  const std::vector<std::string> modules = hf::unit_modules(model);
  BOOST_TEST(modules.size() == units);
  // CLIP: embeddings, pre_layrnorm, 2 of 3 layers (feature layer -2), the class token's drop.
  BOOST_TEST(modules[2] == "vision_tower.encoder.layers.0");
  BOOST_TEST(modules[model.projector_unit()] == "multi_modal_projector.linear_1");
  BOOST_TEST(modules[model.merge_unit()] == "language_model.embed_tokens");
  BOOST_TEST(modules.back() == "lm_head");
  BOOST_TEST((hf::units_named(model, {"encoder.layers.*"}) == std::vector<std::size_t>{2, 3}));
  const std::size_t first_block = model.merge_unit() + 1;
  BOOST_TEST(
      (hf::units_named(model, {"language_model.layers.*"}) == std::vector<std::size_t>{first_block, first_block + 1}));
  BOOST_CHECK_EXCEPTION(hf::units_named(model, {"vision_model.*"}), config_error, says("\"vision_model.*\""));
}

int main(int argc, char* argv[]) {
  return dtrain::testing::main_over_transformers(!python4().empty(), !python5().empty(), argc, argv);
}
