// nn::ResnetBlock2D and nn::TimestepInput (nn/unet_units.hpp) on
// dtrain::Host in fp32 against diffusers 0.42.1's own modules in float64
// (diffusers_units.py, the pinned torch2 set): ResnetBlock2D with and without
// its 1x1 shortcut and with an output_scale_factor, and UNet2DConditionModel's
// conv_in + time embedding with and without SDXL's text_time conditioning,
// every parameter loaded strictly under the name dtrain gives it. Random
// non-zero inputs and parameters; the output within 1e-5 and every gradient
// (input, time embedding, parameters) within 1e-4 of the largest reference
// element; the time embedding a block reads gets its gradient ADDED to the
// lane's. diffusers computes timestep sinusoids in float32 (dtrain in
// float64): they must be within |t| x 2^-21 of the float64 formula the
// comparison feeds both sides. A frozen block gives the trainable one's
// input and lane gradients and no parameter gradient.
// Skipped (77) where the torch2 set cannot be installed.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include "dtrain/nn/unet_units.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.hpp"
#include "nn/unit_harness.hpp"
#include "support/pinned_main.hpp"
#include "support/python_venv.hpp"
#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "dtrain/backend/host/device.hpp"

namespace {

namespace fs = std::filesystem;
namespace t = dtrain::testing;
using dtrain::nn::Extent2;
using dtrain::nn::ResnetBlock2D;
using dtrain::nn::TimestepInput;
using json = nlohmann::json;

constexpr double forward_tol = 1e-5, grad_tol = 1e-4;

static_assert(dtrain::Unit<ResnetBlock2D, dtrain::Host, float>);
static_assert(dtrain::Unit<TimestepInput, dtrain::Host, float>);

struct ResnetCase {
  std::int64_t in, out, groups, temb_dim, batch;
  Extent2 image;
  float eps, scale;
};
const std::vector<ResnetCase> resnet_cases = {
    {8, 16, 4, 12, 2, {5, 3}, 1e-5f, 1.f},   // conv_shortcut
    {16, 16, 8, 12, 3, {4, 4}, 1e-6f, 2.f},  // identity, scaled output
    {6, 4, 2, 5, 1, {1, 7}, 1e-5f, 1.f},     // a one-row image
};

struct TimeCase {
  std::int64_t latent, channels, batch;
  Extent2 image;
  bool text_time, flip;
  double shift;
};
const std::vector<TimeCase> time_cases = {
    {4, 8, 2, {4, 6}, false, true, 0.0},  // Stable Diffusion's
    {4, 6, 3, {3, 3}, true, true, 0.0},   // SDXL's text_time
    {3, 10, 2, {2, 5}, false, false, 1.0},
};

// One tensor of `n` random non-zero values.
std::vector<double> random_values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  return t::random_nonzero(n, rng, scale);
}

json named_params(const t::UnitCase& c) {
  json out = json::object();
  for (std::size_t i = 0; i < c.specs.size(); ++i) out[c.specs[i].name] = c.params[i];
  return out;
}

struct Lane {
  dtrain::Host::buffer<float> value, grad;
  dtrain::Lanes<float> lanes;
  Lane(dtrain::Host& dev, const std::vector<double>& v, const std::vector<double>& g, std::int64_t rows,
       std::int64_t width)
      : value(t::upload<float>(dev, v)), grad(t::upload<float>(dev, g)) {
    lanes.value = {value.view(rows, width)};
    lanes.grad = {grad.view(rows, width)};
  }
};

// A batch of float tensors on the host device.
struct FloatBatch {
  std::vector<std::vector<float>> data;
  dtrain::DeviceBatch batch;
  void add(const std::string& name, const std::vector<double>& v, std::vector<std::int64_t> shape) {
    data.emplace_back(v.begin(), v.end());
    batch.set(name, dtrain::DeviceTensor{dtrain::element_type::f32, std::move(shape),
                                         reinterpret_cast<const std::byte*>(data.back().data()),
                                         reinterpret_cast<const std::byte*>(data.back().data()), name});
  }
};

int shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::vector<double> doubles(const json& j) { return j.get<std::vector<double>>(); }

void expect_grads(const t::UnitCase& c, const t::UnitResult& r, const json& want) {
  BOOST_TEST(want.size() == c.specs.size());
  for (std::size_t i = 0; i < c.specs.size(); ++i) {
    BOOST_TEST_REQUIRE(want.contains(c.specs[i].name), "diffusers has no parameter " << c.specs[i].name);
    t::expect_close(r.grads[i], doubles(want.at(c.specs[i].name)), grad_tol, c.specs[i].name + " gradient");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(resnet_block_and_time_embedding_match_diffusers) {
  dtrain::Host dev(1);
  json cases{{"resnet", json::array()}, {"timestep", json::array()}};
  std::vector<t::UnitCase> rc, tc;
  std::vector<t::UnitResult> rr, tr;
  std::vector<std::vector<double>> lane_before, lane_after, temb_out;
  std::uint64_t seed = 100;
  for (const ResnetCase& k : resnet_cases) {
    ResnetBlock2D unit(k.in, k.out, k.image,
                       {.temb_dim = k.temb_dim, .groups = k.groups, .eps = k.eps, .output_scale_factor = k.scale});
    const std::int64_t in = k.in * k.image.h * k.image.w;
    t::UnitCase c = t::make_case(unit, k.batch, in, ++seed);
    const std::vector<double> temb = random_values(static_cast<std::size_t>(k.batch * k.temb_dim), ++seed, 2.0);
    const std::vector<double> prior = random_values(temb.size(), ++seed);  // what later blocks added
    Lane lane(dev, temb, prior, k.batch, k.temb_dim);
    rr.push_back(t::run_unit<float>(dev, unit, c, true, {}, nullptr, &lane.lanes));
    lane_before.push_back(prior);
    lane_after.push_back(t::download<float>(dev, lane.grad));
    // frozen: the same input and lane gradients, no parameter gradient
    ResnetBlock2D frozen(
        k.in, k.out, k.image,
        {.temb_dim = k.temb_dim, .groups = k.groups, .eps = k.eps, .output_scale_factor = k.scale, .trainable = false});
    t::UnitCase fc = c;
    fc.specs = frozen.params();
    Lane flane(dev, temb, prior, k.batch, k.temb_dim);
    const t::UnitResult f = t::run_unit<float>(dev, frozen, fc, true, {}, nullptr, &flane.lanes);
    BOOST_TEST(f.dx == rr.back().dx);
    BOOST_TEST(t::download<float>(dev, flane.grad) == lane_after.back());
    for (const auto& g : f.grads) BOOST_TEST(g.empty());
    cases["resnet"].push_back({{"in", k.in},
                               {"out", k.out},
                               {"groups", k.groups},
                               {"temb_dim", k.temb_dim},
                               {"eps", k.eps},
                               {"output_scale_factor", k.scale},
                               {"batch", k.batch},
                               {"height", k.image.h},
                               {"width", k.image.w},
                               {"params", named_params(c)},
                               {"x", c.x},
                               {"temb", temb},
                               {"dy", c.dy}});
    rc.push_back(std::move(c));
  }
  for (const TimeCase& k : time_cases) {
    dtrain::nn::TimestepInputOptions o{.flip_sin_to_cos = k.flip,
                                       .freq_shift = k.shift,
                                       .text_time = k.text_time,
                                       .text = {.pooled_dim = 10, .time_ids = 6, .time_embed_dim = 8}};
    TimestepInput unit(k.latent, k.channels, k.image, o);
    const std::int64_t in = k.latent * k.image.h * k.image.w, temb_dim = unit.temb_dim();
    t::UnitCase c = t::make_case(unit, k.batch, in, ++seed);
    std::vector<double> steps(static_cast<std::size_t>(k.batch));
    for (std::size_t i = 0; i < steps.size(); ++i) steps[i] = static_cast<double>((377 * (i + seed)) % 1000);
    const std::vector<double> pooled = random_values(static_cast<std::size_t>(k.batch * 10), ++seed);
    std::vector<double> ids;
    for (std::int64_t b = 0; b < k.batch; ++b)
      for (double v : {64.0 + static_cast<double>(b), 48.0, 3.0 * static_cast<double>(b), 0.0, 64.0, 48.0})
        ids.push_back(v);
    FloatBatch fb;
    fb.add("timesteps", steps, {k.batch});
    if (k.text_time) {
      fb.add("pooled", pooled, {k.batch, 10});
      fb.add("time_ids", ids, {k.batch, 6});
    }
    const std::vector<double> dtemb = random_values(static_cast<std::size_t>(k.batch * temb_dim), ++seed);
    Lane lane(dev, std::vector<double>(dtemb.size(), 0.0), dtemb, k.batch, temb_dim);
    tr.push_back(t::run_unit<float>(dev, unit, c, true, {}, &fb.batch, &lane.lanes));
    temb_out.push_back(t::download<float>(dev, lane.value));
    json j{{"latent_channels", k.latent},
           {"channels", k.channels},
           {"temb_dim", temb_dim},
           {"text_time", k.text_time},
           {"flip_sin_to_cos", k.flip},
           {"freq_shift", k.shift},
           {"batch", k.batch},
           {"height", k.image.h},
           {"width", k.image.w},
           {"params", named_params(c)},
           {"x", c.x},
           {"timesteps", steps},
           {"dy", c.dy},
           {"dtemb", dtemb}};
    if (k.text_time) {
      j["pooled_dim"] = 10;
      j["time_ids"] = 6;
      j["time_embed_dim"] = 8;
      j["pooled"] = pooled;
      j["time_ids_values"] = ids;
    }
    cases["timestep"].push_back(j);
    tc.push_back(std::move(c));
  }
  const fs::path in = fs::path(DTRAIN_TEST_BINARY_DIR) / "unet_units_in.json";
  const fs::path out = fs::path(DTRAIN_TEST_BINARY_DIR) / "unet_units_out.json";
  std::ofstream(in) << cases.dump();
  const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/tests/diffusion/diffusers_units.py";
  BOOST_TEST_REQUIRE(shell(t::pinned_python("torch2") + " " + script + " " + in.string() + " " + out.string()) == 0);
  std::ifstream from(out);
  const json want = json::parse(from);
  for (std::size_t i = 0; i < rc.size(); ++i) {
    BOOST_TEST_CONTEXT("ResnetBlock2D case " << i) {
      const json& w = want.at("resnet").at(i);
      t::expect_close(rr[i].y, doubles(w.at("y")), forward_tol, "forward");
      t::expect_close(rr[i].dx, doubles(w.at("dx")), grad_tol, "input gradient");
      std::vector<double> added(lane_after[i].size());
      for (std::size_t j = 0; j < added.size(); ++j) added[j] = lane_after[i][j] - lane_before[i][j];
      t::expect_close(added, doubles(w.at("dtemb")), grad_tol, "time embedding gradient (added to the lane's)");
      expect_grads(rc[i], rr[i], w.at("grads"));
    }
  }
  for (std::size_t i = 0; i < tc.size(); ++i) {
    BOOST_TEST_CONTEXT("TimestepInput case " << i) {
      const json& w = want.at("timestep").at(i);
      t::expect_close(tr[i].y, doubles(w.at("y")), forward_tol, "conv_in");
      t::expect_close(temb_out[i], doubles(w.at("temb")), forward_tol, "time embedding");
      t::expect_close(tr[i].dx, doubles(w.at("dx")), grad_tol, "input gradient");
      expect_grads(tc[i], tr[i], w.at("grads"));
      // |t| <= 999 (time ids <= 66): float32's angle error
      BOOST_TEST(w.at("sinusoid_error").get<double>() <= 999.0 * std::ldexp(1.0, -21));
    }
  }
}

BOOST_AUTO_TEST_CASE(refusals_name_the_problem) {
  BOOST_CHECK_THROW(ResnetBlock2D(6, 8, {4, 4}, {.groups = 4}), dtrain::config_error);  // 6 % 4
  BOOST_CHECK_THROW(ResnetBlock2D(8, 8, {4, 4}, {.temb_dim = 0, .groups = 4}), dtrain::config_error);
  dtrain::Host dev(1);
  TimestepInput unit(4, 8, {2, 2});
  const t::UnitCase c = t::make_case(unit, 2, 16, 7);
  FloatBatch fb;  // no "timesteps"
  Lane lane(dev, std::vector<double>(64, 0.0), std::vector<double>(64, 0.0), 2, 32);
  try {
    t::run_unit<float>(dev, unit, c, true, {}, &fb.batch, &lane.lanes);
    BOOST_FAIL("no error without timesteps");
  } catch (const dtrain::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("\"timesteps\"") != std::string::npos);
  }
  ResnetBlock2D block(8, 8, {2, 2}, {.temb_dim = 12, .groups = 4});
  const t::UnitCase bc = t::make_case(block, 2, 32, 8);
  try {  // the lane is 32 wide, the block reads 12
    t::run_unit<float>(dev, block, bc, true, {}, nullptr, &lane.lanes);
    BOOST_FAIL("no error for a lane of the wrong width");
  } catch (const dtrain::config_error& e) {
    BOOST_TEST(std::string(e.what()).find("time embedding") != std::string::npos);
  }
}

int main(int argc, char* argv[]) { return dtrain::testing::main_needing_set("torch2", argc, argv); }
