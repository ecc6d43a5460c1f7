// A consolidated checkpoint's model.safetensors is a plain safetensors file:
// Python's safetensors (PyPI, in the build's venv) and PyTorch's load_file
// read it, and weights Python writes load into a Trainer. Exits 77 (skipped)
// only when pip cannot install safetensors (no network).
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>
#include <strategy/common.hpp>
#include <support/python_venv.hpp>

using namespace dtrain;
using namespace dtrain::testing;
namespace fs = std::filesystem;

namespace {

const fs::path venv = fs::path(DTRAIN_TEST_BINARY_DIR) / "venv";
const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/tests/checkpoint/interop.py";

int shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

nlohmann::json python_json(const std::string& args) {
  const fs::path out = fs::path(DTRAIN_TEST_BINARY_DIR) / "interop_out.json";
  BOOST_REQUIRE_EQUAL(shell((venv / "bin/python").string() + " " + script + " " + args + " > " + out.string()), 0);
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

Params train_and_save(const fs::path& dir) {
  fs::remove_all(dir);
  Params params;
  run_ranks(3, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Device<Host>, Strategy<FSDP<FullShard>>, Precision<bf16>> t(w, net, AdamW{.lr = 1e-2f},
                                                                                   {.seed = 21});
    for (int s = 0; s < 2; ++s) t.step(micro_batches(s, w.rank(), {4}));
    t.save(dir, {.consolidated = true});
    auto p = t.parameters();
    if (w.rank() == 0) params = std::move(p);
  });
  return params;
}

}  // namespace

BOOST_AUTO_TEST_CASE(python_and_torch_read_a_consolidated_checkpoint) {
  const fs::path dir = fs::path(DTRAIN_TEST_BINARY_DIR) / "interop_ckpt";
  const Params want = train_and_save(dir);
  const auto got = python_json("read " + (dir / "model.safetensors").string());
  for (const char* reader : {"numpy", "torch"}) {
    if (got[reader].is_null()) {
      BOOST_TEST_MESSAGE("torch is not importable: only safetensors.numpy was checked");
      continue;
    }
    BOOST_TEST(got[reader].size() == want.size());
    for (const auto& [name, values] : want) {
      BOOST_TEST_CONTEXT(reader << " " << name) {
        const auto& t = got[reader].at(name);
        BOOST_TEST(t.at("dtype").get<std::string>() == (std::string(reader) == "numpy" ? "float32" : "torch.float32"));
        const auto v = t.at("values").get<std::vector<double>>();
        BOOST_REQUIRE_EQUAL(v.size(), values.size());
        for (std::size_t i = 0; i < v.size(); ++i) BOOST_TEST(static_cast<float>(v[i]) == values[i]);
      }
    }
    BOOST_TEST((got[reader].at("5.weight").at("shape").get<std::vector<int>>() == std::vector<int>{17, 16}));
  }
}

BOOST_AUTO_TEST_CASE(weights_python_writes_load_into_a_trainer) {
  for (const char* dtype : {"F32", "F16", "BF16"}) {
    const fs::path file = fs::path(DTRAIN_TEST_BINARY_DIR) / (std::string("from_python_") + dtype + ".safetensors");
    const nlohmann::json spec = {
        {"0.weight", {{15, 7}, dtype}}, {"0.bias", {{15}, dtype}}, {"5.weight", {{17, 16}, dtype}}};
    BOOST_REQUIRE_EQUAL(
        shell((venv / "bin/python").string() + " " + script + " write " + file.string() + " '" + spec.dump() + "'"), 0);
    run_ranks(2, [&](World& w) {
      UnevenNet net;
      Trainer<UnevenNet, Device<Host>, Strategy<ZeRO1>> t(w, net, AdamW{}, {.seed = 3});
      const auto report = t.load_params(file, {.strict = false});
      require(report.loaded.size() == 3, "loaded " + std::to_string(report.loaded.size()));
      const auto p = t.parameters();
      for (const char* name : {"0.weight", "0.bias", "5.weight"}) {
        const auto& v = p.at(name);
        for (std::size_t i = 0; i < v.size(); ++i) {
          const double want = 0.001 * static_cast<double>(i + 1) * (i % 2 == 0 ? 1 : -1);
          const double tol = std::string(dtype) == "F32" ? 1e-7 : std::string(dtype) == "F16" ? 1e-3 : 8e-3;
          require(std::abs(v[i] - want) <= tol * std::max(1.0, std::abs(want)) + 1e-6,
                  std::string(dtype) + " " + name + "[" + std::to_string(i) + "] = " + std::to_string(v[i]));
        }
      }
    });
  }
}

static bool init_unit_test() { return true; }

int main(int argc, char* argv[]) {
  if (const std::string why = dtrain::testing::python_venv_with(venv, "safetensors", "safetensors==0.8.0", 300);
      !why.empty()) {
    std::printf("%s: test skipped (exit 77)\n", why.c_str());
    return 77;
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
