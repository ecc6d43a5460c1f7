// nn::Conv2d on dtrain::Host in fp32 against PyTorch's
// torch.nn.functional.conv2d in float64 (conv_torch.py: the output, and the
// input, weight and bias gradients by autograd) on the host test's cases:
// forward within 1e-5 and gradients within 1e-4 of the largest reference
// element. Exits 77 (skipped) when the tests' Python has no PyTorch.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/unit_harness.hpp"
#include "nn/vision_reference.hpp"
#include "support/python_venv.hpp"
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "dtrain/backend/host/device.hpp"
#include "dtrain/nn/convolution.hpp"

namespace {

namespace fs = std::filesystem;
namespace t = dtrain::testing;

int shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

}  // namespace

BOOST_AUTO_TEST_CASE(conv2d_matches_torch_conv2d) {
  const fs::path in = fs::path(DTRAIN_TEST_BINARY_DIR) / "conv_torch_in.json";
  const fs::path out = fs::path(DTRAIN_TEST_BINARY_DIR) / "conv_torch_out.json";
  dtrain::Host dev(1);
  nlohmann::json cases = nlohmann::json::array();
  std::vector<t::UnitResult> ours;
  for (const auto& k : t::conv_cases) {
    dtrain::nn::Conv2d unit = k.unit();
    const t::UnitCase c = t::rounded<float>(t::make_case(unit, k.batch, k.in_size(), 17));
    ours.push_back(t::run_unit<float>(dev, unit, c));
    cases.push_back({{"x", c.x},
                     {"weight", c.params[0]},
                     {"bias", k.bias ? nlohmann::json(c.params[1]) : nlohmann::json(nullptr)},
                     {"dy", c.dy},
                     {"shape", {k.batch, k.channels, k.height, k.width}},
                     {"weight_shape", c.specs[0].shape},
                     {"stride", {k.stride_h, k.stride_w}},
                     {"padding", {k.pad_h, k.pad_w}},
                     {"groups", k.groups}});
  }
  std::ofstream(in) << nlohmann::json{{"cases", cases}}.dump();
  const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/tests/nn/conv_torch.py";
  BOOST_TEST_REQUIRE(shell(t::test_python() + " " + script + " " + in.string() + " " + out.string()) == 0);
  std::ifstream from(out);
  const nlohmann::json torch = nlohmann::json::parse(from);
  BOOST_TEST_REQUIRE(torch.size() == t::conv_cases.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    BOOST_TEST_CONTEXT(t::describe(t::conv_cases[i])) {
      const auto& r = torch[i];
      t::expect_close(ours[i].y, r["y"].get<std::vector<double>>(), 1e-5, "forward");
      t::expect_close(ours[i].dx, r["dx"].get<std::vector<double>>(), 1e-4, "input gradient");
      t::expect_close(ours[i].grads[0], r["dweight"].get<std::vector<double>>(), 1e-4, "weight gradient");
      if (t::conv_cases[i].bias)
        t::expect_close(ours[i].grads[1], r["dbias"].get<std::vector<double>>(), 1e-4, "bias gradient");
    }
  }
}

static bool init_unit_test() { return true; }

int main(int argc, char* argv[]) {
  if (shell(dtrain::testing::test_python() + " -c 'import torch' 2> /dev/null") != 0) {
    std::printf("%s has no PyTorch: test skipped (exit 77)\n", dtrain::testing::test_python().c_str());
    return 77;
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
