// The train_vlm example end to end, as real processes launched by dtrain-run
// at 2 CPU ranks, on a tiny LLaVA written here without Python
// (examples/tiny_llava.hpp):
//  - train=all (fsdp-full), train=projector and train=projector,vision
//    (ddp, the tower's layers recomputed: checkpoint_modules), each from
//    the same saved model: each exits 0, its loss falls over 20 steps, it
//    prints the held-out loss, and its save_hf directory loads again
//    (steps=1);
//  - what each mode leaves frozen is saved bit-identical to that source:
//    projector, the tower and the language model; projector,vision, the
//    language model;
//  - every refused input (the data's tensors, shapes, image size, image
//    tokens, ids, labels all -100, too few records, records longer than
//    the positions; the config's parts, feature layer, model_type; a
//    checkpoint_modules pattern naming no module) exits 2 with one error
//    line naming it, before anything is written.
#define BOOST_TEST_MODULE example_train_vlm
#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "examples/run_example.hpp"
#include "examples/tiny_llava.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/io/safetensors.hpp>

namespace fs = std::filesystem;
using dtrain::test::fresh;
using dtrain::test::last_log;
using dtrain::test::losses;
using dtrain::test::scratch;
using dtrain::test::TinyLlavaData;

namespace {

struct Fixture {
  fs::path config = scratch("config.json"), data = scratch("records.safetensors");
  Fixture() {
    dtrain::test::write_json(config, dtrain::test::tiny_llava_config());
    TinyLlavaData::make(40).write(data);
  }
};

// train_vlm at 2 ranks; its exit status (the log in last_log()).
int train_vlm(const std::string& args) {
  return dtrain::test::run_example(TRAIN_VLM_PATH, 2, "num_workers=0 batch_size=4 eval_batches=2 " + args);
}

double mean(const std::vector<double>& v, std::size_t from, std::size_t to) {
  double s = 0;
  for (std::size_t i = from; i < to; ++i) s += v[i] / static_cast<double>(to - from);
  return s;
}

// A 20-step run: exit 0, the loss falls (the mean of the last 5 steps 5%
// below the first step's: the projector alone, under a frozen random
// language model, takes 3.9 to 3.4), the held-out loss is printed, and the saved model loads.
void trains(const std::string& args, const fs::path& saved, const std::string& says) {
  const fs::path metrics = fresh(saved.filename().string() + ".jsonl");
  fs::remove_all(saved);
  BOOST_TEST_REQUIRE(
      train_vlm(args + " steps=20 log_every=1 metrics=" + metrics.string() + " save_hf=" + saved.string()) == 0,
      last_log());
  const std::string log = last_log();
  BOOST_TEST(log.find(says) != std::string::npos, log);
  BOOST_TEST(log.find("eval: held-out loss ") != std::string::npos, log);
  const std::vector<double> l = losses(metrics);
  BOOST_TEST_REQUIRE(l.size() == 20u);
  BOOST_TEST(mean(l, 15, 20) < 0.95 * l.front(), args << ": losses " << l.front() << " -> " << l.back());
  BOOST_TEST_MESSAGE(args << ": loss " << l.front() << " -> " << mean(l, 15, 20) << " (last 5)");
  BOOST_TEST_REQUIRE(fs::exists(saved / "model.safetensors"));
  BOOST_TEST_REQUIRE(fs::exists(saved / "config.json"));
  BOOST_TEST(
      train_vlm("model=" + saved.string() + " data=" + scratch("records.safetensors").string() + " steps=1") == 0,
      last_log());
  BOOST_TEST(last_log().find("model " + saved.string() + ": loaded ") != std::string::npos, last_log());
}

// Every tensor of `a` whose name starts with one of `prefixes` is in `b`,
// bit-identical, and the other way round; returns how many were compared.
std::size_t same_tensors(const fs::path& a, const fs::path& b, const std::vector<std::string>& prefixes) {
  const auto fa = dtrain::SafetensorsFile::open(a / "model.safetensors");
  const auto fb = dtrain::SafetensorsFile::open(b / "model.safetensors");
  const auto chosen = [&](const dtrain::SafetensorsFile& f) {
    std::set<std::string> out;
    for (const std::string& n : f.names())
      if (std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return n.starts_with(p); }))
        out.insert(n);
    return out;
  };
  const std::set<std::string> names = chosen(fa);
  BOOST_TEST((names == chosen(fb)));
  for (const std::string& n : names) {
    if (!fb.contains(n)) continue;
    const auto ta = fa.tensor(n), tb = fb.tensor(n);
    BOOST_TEST((ta.dtype == tb.dtype && ta.shape == tb.shape), n);
    BOOST_TEST((ta.bytes.size() == tb.bytes.size() && std::equal(ta.bytes.begin(), ta.bytes.end(), tb.bytes.begin())),
               n << " changed");
  }
  return names.size();
}

// Whether some tensor under `prefix` differs between the two.
bool any_changed(const fs::path& a, const fs::path& b, const std::string& prefix) {
  const auto fa = dtrain::SafetensorsFile::open(a / "model.safetensors");
  const auto fb = dtrain::SafetensorsFile::open(b / "model.safetensors");
  for (const std::string& n : fa.names())
    if (n.starts_with(prefix) && (!fb.contains(n) || fa.read_f32(n) != fb.read_f32(n))) return true;
  return false;
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(tiny_llava, Fixture)

BOOST_AUTO_TEST_CASE(trains_each_mode_and_saves_what_it_froze_unchanged) {
  // The source: one step from the config, saved (the model= every mode starts from).
  const fs::path base = scratch("base"), all = scratch("all"), projector = scratch("projector"),
                 vision = scratch("projector_vision");
  fs::remove_all(base);
  BOOST_TEST_REQUIRE(train_vlm("config=" + config.string() + " data=" + data.string() +
                               " train=all steps=1 eval_batches=0 save_hf=" + base.string()) == 0,
                     last_log());
  const std::string from = "model=" + base.string() + " data=" + data.string();
  trains(from + " train=all strategy=fsdp-full lr=1e-2", all, "train=all: ");
  trains(from + " train=projector lr=1e-2", projector, "train=projector: ");
  // The tower's layers recomputed in the backward pass (checkpoint_modules).
  trains(from + " train=projector,vision lr=1e-2 activation_checkpointing=true checkpoint_modules=encoder.layers.*",
         vision, "train=projector,vision: ");
  // projector: only multi_modal_projector. changed; projector,vision: the tower too.
  const std::string tower = "vision_tower.", language = "language_model.", projection = "multi_modal_projector.";
  BOOST_TEST(same_tensors(base, projector, {tower, language}) > 20u);
  BOOST_TEST(any_changed(base, projector, projection));
  BOOST_TEST(same_tensors(base, vision, {language}) > 10u);
  BOOST_TEST(any_changed(base, vision, projection));
  BOOST_TEST(any_changed(base, vision, tower));
  BOOST_TEST(any_changed(base, all, language));
}

BOOST_AUTO_TEST_CASE(refuses_bad_input_before_writing_anything) {
  const fs::path saved = scratch("refused");
  const auto refused = [&](const std::string& args, const std::string& says) {
    fs::remove_all(saved);
    const int status = train_vlm(args + " steps=2 save_hf=" + saved.string());
    const std::string log = last_log();
    BOOST_TEST(status == 2, args << ": " << log);
    BOOST_TEST(log.find(says) != std::string::npos, args << ": " << log);
    // One error line (each rank prints the same one), and nothing else on it.
    std::set<std::string> errors;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);)
      if (line.find("train_vlm: error: ") != std::string::npos) errors.insert(line.substr(line.find("train_vlm: ")));
    BOOST_TEST(errors.size() == 1u, args << ": " << log);
    BOOST_TEST(log.find("train_vlm: 2 rank(s)") == std::string::npos, args << " started: " << log);
    BOOST_TEST(!fs::exists(saved), args << " wrote " << saved);
  };
  const std::string model = "config=" + config.string() + " ";
  const auto with = [&](const std::string& name, const TinyLlavaData& d, bool labels = true, bool float_ids = false) {
    const fs::path file = scratch(name + ".safetensors");
    dtrain::SafetensorsWriter w;
    std::vector<float> as_float(d.ids.begin(), d.ids.end());
    const std::int64_t t = static_cast<std::int64_t>(d.ids.size()) / std::max<std::int64_t>(d.n, 1);
    w.add("pixel_values", {d.n, d.channels, d.size, d.size}, d.pixels);
    if (float_ids)
      w.add("input_ids", {d.n, t}, as_float);
    else
      w.add("input_ids", {d.n, t}, d.ids);
    if (labels) w.add("labels", {static_cast<std::int64_t>(d.labels.size()) / t, t}, d.labels);
    w.write(file);
    return model + "data=" + file.string();
  };
  const TinyLlavaData good = TinyLlavaData::make(40);
  refused(with("no_labels", good, false), "has no tensor \"labels\"");
  refused(with("float_ids", good, true, true), "\"input_ids\" is ");
  {
    TinyLlavaData d = good;  // one row of labels too few
    d.labels.resize(d.labels.size() - dtrain::test::tiny_llava_tokens);
    refused(with("short_labels", d), "but pixel_values holds 40 images");
  }
  {
    TinyLlavaData d = TinyLlavaData::make(40);  // 24 px images
    d.size = 24;
    d.pixels.resize(static_cast<std::size_t>(40 * 3 * 24 * 24));
    refused(with("big_images", d),
            "the images are 3 x 24 x 24 (channels x height x width), the tower takes 3 x 16 x 16");
  }
  {
    TinyLlavaData d = good;  // one channel
    d.channels = 1;
    d.pixels.resize(static_cast<std::size_t>(40 * 16 * 16));
    refused(with("gray_images", d), "the images are 1 x 16 x 16");
  }
  {
    TinyLlavaData d = good;  // record 3 has one image token less
    d.ids[3 * dtrain::test::tiny_llava_tokens + 4] = 7;
    refused(with("few_image_tokens", d), "record 3 holds 3 image tokens (id 63), the model makes 4 features per image");
  }
  {
    TinyLlavaData d = good;
    d.ids[5 * dtrain::test::tiny_llava_tokens + 6] = 70;
    refused(with("outside_vocabulary", d), "record 5 token 6 is id 70, outside the model's vocabulary of 64");
  }
  refused(with("one_record", TinyLlavaData::make(1)), "has 1 record(s): too few");
  {
    TinyLlavaData d = good;  // nothing to learn
    std::fill(d.labels.begin(), d.labels.end(), -100);
    refused(with("unlabelled", d), "every label is -100");
  }
  refused(with("fine", good) + " activation_checkpointing=true checkpoint_modules=vision_model.*",
          "\"vision_model.*\" names no module of this llava model");
  refused(with("fine", good) + " train=projector,decoder", "train: \"decoder\" is not a part of a LLaVA model");
  {
    auto c = dtrain::test::tiny_llava_config();
    c["vision_feature_layer"] = -5;
    dtrain::test::write_json(scratch("layer.json"), c);
    refused("config=" + scratch("layer.json").string() + " data=" + data.string(),
            "vision_feature_layer -5 is out of range for a tower of 2 layers");
    c = dtrain::test::tiny_llava_config();
    c["text_config"]["max_position_embeddings"] = 8;
    dtrain::test::write_json(scratch("short.json"), c);
    refused("config=" + scratch("short.json").string() + " data=" + data.string(),
            "records of 10 tokens are longer than the language model's 8 positions (max_position_embeddings)");
    c = dtrain::test::tiny_llava_config();
    c["model_type"] = "llava_next";
    dtrain::test::write_json(scratch("next.json"), c);
    refused("config=" + scratch("next.json").string() + " data=" + data.string(),
            "model_type \"llava_next\" is not a LLaVA model");
  }
  refused("data=" + data.string(), "give exactly one of model=DIR (fine-tune) and config=FILE");
}

BOOST_AUTO_TEST_SUITE_END()
