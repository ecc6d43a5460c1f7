// Vision towers (hf/vision.hpp) against transformers itself: tiny random
// CLIPVisionModel and SiglipVisionModel (make_tiny_vision.py: 16 px images,
// patch 4, hidden 32, 3 layers, 4 heads), made and checked by transformers
// 4.40.2 (the 4.x key layout, "vision_model.<module>": the pinned venv, or
// DTRAIN_TRANSFORMERS_PYTHON) and by the pinned torch2 set's transformers 5
// (the 5.x layout, "<module>": DTRAIN_PYTHON_TORCH2). For each:
//  - every hidden_states index (-(L+1) .. L) as the tower's features, fp32,
//    within 1e-5 of the largest |reference| (and 1e-5 absolute below 1);
//  - the gradients of mean((features - target)^2) w.r.t. every parameter the
//    tower runs (torch autograd in the script; one SGD step with lr = 1 here)
//    within 1e-5 of the largest reference gradient;
//  - save_pretrained from dtrain, loaded by transformers: the same
//    hidden_states (1e-5) and exactly the original tensors, the layers past
//    the feature layer and SigLIP's head included;
//  - DDP at 2 ranks (one image each) equals 1 rank with both, 2 SGD steps
//    (1e-6).
// And the config errors: an unknown model_type, a feature layer out of
// range, images of another size or channel count.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "hf/run_logged.hpp"
#include "support/pinned_main.hpp"
#include "support/python_venv.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/vision.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
namespace hf = dtrain::hf;
using namespace dtrain;
using namespace dtrain::testing;

namespace {

const fs::path work = fs::path(DTRAIN_TEST_BINARY_DIR) / "vision";
const fs::path venv = fs::path(DTRAIN_TEST_BINARY_DIR) / "venv";
const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/tests/hf/make_tiny_vision.py";
const char* const transformers_pin =
    "transformers==4.40.2 tokenizers==0.19.1 huggingface_hub==0.36.2 safetensors==0.8.0 regex==2026.11.19 "
    "filelock==4.3.1 fsspec==2026.9.0 hf-xet==1.8.0 tqdm==4.70.1";

// The transformers 4 python ("" when none), and the transformers 5 one.
std::string python4() {
  if (const char* chosen = std::getenv("DTRAIN_TRANSFORMERS_PYTHON"); chosen != nullptr && *chosen != '\0')
    return chosen;
  return python_venv_with(venv, "transformers", transformers_pin, 600).empty() ? (venv / "bin/python").string() : "";
}
// (The torch2 set's fixture may have been skipped here: no python then.)
std::string python5() {
  try {
    return pinned_python_missing("torch2").empty() ? pinned_python("torch2") : "";
  } catch (const std::exception&) {
    return "";
  }
}

using Values = std::map<std::string, std::vector<float>>;

struct Case {
  std::string python, kind;
  std::int64_t layer;
  std::string strategy;
  fs::path dir;
};

Case make_case(const std::string& python, const std::string& kind, std::int64_t layer, const std::string& strategy,
               const std::string& tag) {
  const fs::path dir = work / (kind + "-" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 " + python + " " + script + " make " + dir.string() + " " + kind +
                          " " + std::to_string(layer) + " " + strategy;
  BOOST_TEST_REQUIRE(run_logged(cmd, dir / "make.log") == 0,
                     "make_tiny_vision.py failed: " << read_text(dir / "make.log"));
  return {python, kind, layer, strategy, dir};
}

std::vector<float> reference(const Case& c, const std::string& name) {
  return SafetensorsFile::open(c.dir / "reference.safetensors").read_f32(name);
}

// Images [first, first + n) of the reference's two, as x, and their targets as y.
Batch images(const Case& c, const hf::VisionTower& tower, std::int64_t first, std::int64_t n) {
  const std::vector<float> px = reference(c, "pixel_values"), y = reference(c, "target");
  const std::int64_t per = tower.embed.image_size(), rows = tower.tokens() * tower.config.hidden_size;
  const auto size = tower.config.image_size;
  Batch b;
  b.set("x", HostTensor::of(std::vector<float>(px.begin() + first * per, px.begin() + (first + n) * per),
                            {n, tower.config.num_channels, size, size}));
  if (static_cast<std::int64_t>(y.size()) == 2 * rows)
    b.set("y", HostTensor::of(std::vector<float>(y.begin() + first * rows, y.begin() + (first + n) * rows),
                              {n, tower.tokens(), tower.config.hidden_size}));
  return b;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (const float e : v) m = std::max(m, std::abs(double(e)));
  return m;
}

// Every hidden_states index as the tower's features, "full" and "default".
void check_features(const Case& c) {
  const hf::VisionConfig config = hf::read_vision_config(c.dir / "model");
  const std::int64_t L = config.num_hidden_layers;
  double worst = 0;
  for (const std::string strategy : {"full", "default"})
    for (std::int64_t layer = -(L + 1); layer <= L; ++layer) {
      run_ranks(1, [&](World& w) {
        hf::VisionTower tower(config, {layer, strategy}, {.input = "x"});
        Trainer<hf::VisionTower> t(w, tower, SGD{});
        hf::load_pretrained(t, c.dir / "model", tower);
        const std::vector<float> got = t.predict(images(c, tower, 0, 2));
        const std::vector<float> all =
            reference(c, "hidden_states." + std::to_string(layer < 0 ? L + 1 + layer : layer));
        const std::int64_t tokens = tower.embed.tokens(), dim = config.hidden_size, skip = tokens - tower.tokens();
        require(got.size() == static_cast<std::size_t>(2 * tower.tokens() * dim), "features' size");
        const double scale = std::max(1.0, max_abs(all));
        double diff = 0;
        for (std::int64_t n = 0; n < 2; ++n)
          for (std::int64_t t2 = skip; t2 < tokens; ++t2)
            for (std::int64_t d = 0; d < dim; ++d)
              diff = std::max(diff, std::abs(double(got[((n * (tokens - skip)) + t2 - skip) * dim + d]) -
                                             all[(n * tokens + t2) * dim + d]));
        require(diff <= 1e-5 * scale,
                c.kind + " layer " + std::to_string(layer) + " " + strategy + ": differs by " + std::to_string(diff));
        worst = std::max(worst, diff / scale);
      });
    }
  BOOST_TEST_MESSAGE(c.kind << " features: largest difference " << worst << " (relative to max(1, |reference|))");
  std::printf("%s features: max difference %.3e\n", c.kind.c_str(), worst);
}

void check_gradients(const Case& c) {
  const hf::VisionConfig config = hf::read_vision_config(c.dir / "model");
  Values before, after;
  hf::VisionTower tower(config, {c.layer, c.strategy}, {.input = "x"});
  run_ranks(1, [&](World& w) {
    hf::VisionTower mine = tower;
    Trainer<hf::VisionTower> t(w, mine, SGD{.lr = 1.f});
    hf::load_pretrained(t, c.dir / "model", mine);
    before = t.parameters();
    t.step(std::vector<Batch>{images(c, mine, 0, 2)});
    after = t.parameters();
  });
  const hf::TransformersNames names = hf::vision_transformers_names(tower, true);
  const SafetensorsFile ref = SafetensorsFile::open(c.dir / "reference.safetensors");
  Values want;
  double scale = 0;
  for (const auto& [ours, theirs] : names.tensors) {
    std::string name = "grad." + theirs[0];
    if (!ref.contains(name)) name = "grad." + theirs[0].substr(names.optional_prefix.size());
    BOOST_TEST_REQUIRE(ref.contains(name), "no reference gradient for " << theirs[0]);
    want[ours] = ref.read_f32(name);
    scale = std::max(scale, max_abs(want[ours]));
  }
  BOOST_TEST(want.size() == before.size());
  double worst = 0;
  for (const auto& [ours, g] : want)
    for (std::size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::abs(double(before.at(ours)[i]) - after.at(ours)[i] - g[i]));
  BOOST_TEST(worst <= 1e-5 * scale, c.kind << " gradients differ by " << worst << " (largest " << scale << ")");
  std::printf("%s gradients (layer %lld, %s): max difference %.3e, largest gradient %.3e\n", c.kind.c_str(),
              static_cast<long long>(c.layer), c.strategy.c_str(), worst, scale);
}

void check_save(const Case& c) {
  const hf::VisionConfig config = hf::read_vision_config(c.dir / "model");
  const fs::path saved = c.dir / "saved";
  run_ranks(2, [&](World& w) {
    // [snippet:vision_tower]
    hf::VisionTower tower(config, {.layer = c.layer, .strategy = c.strategy}, {.input = "x"});
    Trainer<hf::VisionTower, Strategy<FSDP<FullShard>>> trainer(w, tower, SGD{});
    hf::load_pretrained(trainer, c.dir / "model", tower);         // either key layout
    hf::save_pretrained(trainer, saved, tower, c.dir / "model");  // the unrun tensors copied from the source
    // [/snippet:vision_tower]
  });
  const std::string cmd =
      "OPENBLAS_NUM_THREADS=1 " + c.python + " " + script + " check " + saved.string() + " " + c.dir.string();
  const int rc = run_logged(cmd, c.dir / "check.log");
  const std::string log = read_text(c.dir / "check.log");
  BOOST_TEST_REQUIRE(rc == 0, "transformers could not load dtrain's save: " << log);
  double hidden = 1, tensors = 1;
  const auto at = log.rfind("hidden_states ");
  BOOST_TEST_REQUIRE(at != std::string::npos, log);
  BOOST_TEST_REQUIRE(std::sscanf(log.c_str() + at, "hidden_states %lf tensors %lf", &hidden, &tensors) == 2, log);
  BOOST_TEST(hidden <= 1e-5, c.kind << " saved: hidden_states differ by " << hidden);
  BOOST_TEST(tensors == 0.0, c.kind << " saved: tensors differ by " << tensors);
  std::printf("%s save -> transformers: hidden_states %.3e, tensors %.3e\n", c.kind.c_str(), hidden, tensors);
}

void check_ddp(const Case& c) {
  const hf::VisionConfig config = hf::read_vision_config(c.dir / "model");
  Values one, two;
  const hf::VisionTower tower(config, {c.layer, c.strategy}, {.input = "x"});
  for (const int ranks : {1, 2})
    run_ranks(ranks, [&](World& w) {
      hf::VisionTower mine = tower;
      Trainer<hf::VisionTower> t(w, mine, SGD{.lr = 0.1f});
      hf::load_pretrained(t, c.dir / "model", mine);
      for (int s = 0; s < 2; ++s)
        t.step(std::vector<Batch>{ranks == 1 ? images(c, mine, 0, 2) : images(c, mine, w.rank(), 1)});
      const Values p = t.parameters();
      if (w.rank() == 0) (ranks == 1 ? one : two) = p;
    });
  double worst = 0;
  for (const auto& [name, v] : one)
    for (std::size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(double(v[i]) - two.at(name)[i]));
  BOOST_TEST(worst <= 1e-6, c.kind << ": DDP at 2 ranks differs from 1 rank by " << worst);
  std::printf("%s DDP 2 ranks vs 1: max parameter difference %.3e\n", c.kind.c_str(), worst);
}

void check_all(const std::string& python, const std::string& tag) {
  if (python.empty()) {
    BOOST_TEST_MESSAGE("no transformers " << tag << " python: skipped");
    return;
  }
  for (const Case& c : {make_case(python, "clip", -2, "default", tag), make_case(python, "siglip", -1, "full", tag)}) {
    BOOST_TEST_CONTEXT(c.kind << ", transformers " << tag) {
      check_features(c);
      check_gradients(c);
      check_save(c);
      check_ddp(c);
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

}  // namespace

BOOST_AUTO_TEST_CASE(transformers_4_layout) { check_all(python4(), "4"); }

BOOST_AUTO_TEST_CASE(transformers_5_layout) { check_all(python5(), "5"); }

BOOST_AUTO_TEST_CASE(config_errors_name_the_problem) {
  const auto tower_json = nlohmann::ordered_json::parse(
      R"({"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
          "num_attention_heads": 4, "image_size": 16, "patch_size": 4})");
  auto bad = tower_json;
  bad["model_type"] = "dinov2";
  BOOST_CHECK_EXCEPTION(hf::parse_vision_config(bad, "c"), config_error, says("model_type \"dinov2\""));
  BOOST_CHECK_EXCEPTION(hf::parse_vision_config(bad, "c"), config_error, says("siglip_vision_model"));
  const hf::VisionConfig c = hf::parse_vision_config(tower_json, "c");
  BOOST_CHECK_EXCEPTION(hf::VisionTower(c, {4, "full"}), config_error, says("-4 .. 3"));
  BOOST_CHECK_EXCEPTION(hf::VisionTower(c, {-5, "full"}), config_error, says("out of range"));
  BOOST_CHECK_EXCEPTION(hf::VisionTower(c, {-1, "pooled"}), config_error, says("\"pooled\""));
  // A LLaVA config: the tower from vision_config, the features from LLaVA's keys.
  const auto llava = nlohmann::ordered_json{{"model_type", "llava"},
                                            {"vision_feature_layer", -2},
                                            {"vision_feature_select_strategy", "default"},
                                            {"vision_config", tower_json}};
  const hf::VisionConfig from_llava = hf::parse_vision_config(llava, "llava");
  BOOST_TEST(from_llava.feature_layer == -2);
  BOOST_TEST(hf::VisionTower(from_llava).tokens() == 16);  // 17 tokens less the class token
  BOOST_TEST(hf::VisionTower(from_llava).layers.size() == 2u);
  // Images of another size or channel count name both.
  run_ranks(1, [&](World& w) {
    hf::VisionTower tower(c, {-1, "full"});
    Trainer<hf::VisionTower> t(w, tower, SGD{});
    for (const auto& [channels, size, part] :
         {std::tuple{3, 20, std::string("20 x 20")}, std::tuple{1, 16, std::string("expected [batch, 3, 16, 16]")}}) {
      Batch b;
      b.set("x", HostTensor::of(std::vector<std::int32_t>(2, 0), {2, 1}));
      b.set("pixel_values",
            HostTensor::of(std::vector<float>(static_cast<std::size_t>(2 * channels * size * size), 0.5f),
                           {2, channels, size, size}));
      std::string message;
      try {
        t.predict(b);
      } catch (const config_error& e) {
        message = e.what();
      }
      require(message.find(part) != std::string::npos, "the error names the images: " + message);
    }
  });
}

int main(int argc, char* argv[]) {
  return dtrain::testing::main_over_transformers(!python4().empty(), !python5().empty(), argc, argv);
}
