// dtrain::ConfigReader (run/config.hpp): declared keys from YAML files and
// key=value arguments in order, --help from the declarations, errors that
// name the key and the fix, and fit's keys.
#define BOOST_TEST_MODULE run_config
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <dtrain/run/config.hpp>

namespace {

// [snippet:config_reader]
struct Settings {
  float lr = 3e-4f;
  std::int64_t layers = 4;
  bool bias = true;
  std::string name = "run";
  std::vector<std::int64_t> hidden{256, 256};
  std::filesystem::path out = "out";
  dtrain::FitOptions fit{.steps = 100};
};

dtrain::ConfigReader reader(Settings& s) {
  dtrain::ConfigReader c("train", "Trains a test model.");
  c.section("Model");
  c.add("lr", s.lr, "learning rate").add("layers", s.layers, "blocks").add("bias", s.bias, "biases");
  c.add("name", s.name, "run name").add("hidden", s.hidden, "widths").add("out", s.out, "output folder");
  c.section("Training");
  dtrain::declare_fit_keys(c, s.fit);
  return c;
}
// [/snippet:config_reader]

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const dtrain::config_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

BOOST_AUTO_TEST_CASE(files_and_overrides_apply_in_order) {
  const auto file = std::filesystem::temp_directory_path() / ("dtrain_config_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << "lr: 0.01\nlayers: 8\nhidden: [64, 32, 16]\nsteps: 500\nresume: latest\nbias: false\n";
  Settings s;
  dtrain::ConfigReader c = reader(s);
  c.parse({"layers=2", "--config", file.string(), "lr=2e-3", "hidden=8,4", "out=/tmp/x", "save_every=50",
           "metrics=logs/m.jsonl"});
  std::filesystem::remove(file);
  BOOST_TEST(s.lr == 2e-3f);
  BOOST_TEST(s.layers == 8);  // the file came after layers=2
  BOOST_TEST(!s.bias);
  BOOST_TEST((s.hidden == std::vector<std::int64_t>{8, 4}));
  BOOST_TEST(s.out == "/tmp/x");
  BOOST_TEST(s.fit.steps == 500);
  BOOST_TEST(s.fit.resume == "latest");
  BOOST_TEST(s.fit.save_every == 50);
  BOOST_TEST(s.fit.metrics_file == "logs/m.jsonl");
  BOOST_TEST(s.name == "run");  // untouched: the default
}

BOOST_AUTO_TEST_CASE(help_lists_every_key_with_its_default) {
  Settings s;
  const std::string h = reader(s).help();
  BOOST_TEST(h.find("usage: train [--config FILE.yaml] [key=value ...]") != std::string::npos);
  BOOST_TEST(h.find("Trains a test model.") != std::string::npos);
  BOOST_TEST(h.find("\nModel:\n") != std::string::npos);
  BOOST_TEST(h.find("  hidden (integers, e.g. 256,256, default 256,256)") != std::string::npos);
  BOOST_TEST(h.find("  steps (integer, default 100)") != std::string::npos);
  BOOST_TEST(h.find("  resume (text)") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_arguments_name_the_key_and_the_fix) {
  Settings s;
  dtrain::ConfigReader c = reader(s);
  BOOST_TEST(error_of([&] { c.parse({"lrr=1"}); }).find("unknown config key 'lrr'") != std::string::npos);
  BOOST_TEST(error_of([&] { c.parse({"layers=many"}); }).find("'layers' = 'many' is not an integer") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { c.parse({"hidden=a,b"}); }).find("is not a list of integers") != std::string::npos);
  BOOST_TEST(error_of([&] { c.parse({"lr"}); }).find("neither --config FILE nor key=value") != std::string::npos);
  BOOST_TEST(error_of([&] { c.parse({"--config"}); }).find("--config needs a file") != std::string::npos);
  BOOST_TEST(error_of([&] { c.parse({"--config", "/no/such.yaml"}); }).find("cannot read config") != std::string::npos);
  BOOST_TEST(error_of([&] { c.parse({"steps=0"}); }).find("FitOptions: steps = 0") != std::string::npos);
  BOOST_TEST(error_of([&] { c.add("lr", s.lr, "again"); }).find("declared twice") != std::string::npos);
}
