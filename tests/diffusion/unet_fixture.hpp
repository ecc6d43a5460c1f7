#pragma once
// What the tests against diffusers' models share (unet_test.cpp,
// lora_test.cpp, pixart_test.cpp): running their Python side, the tiny
// UNets diffusers_unet.py makes and their inputs as dtrain batches, rows of
// a file's tensors, and the comparisons.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "hf/run_logged.hpp"
#include "support/python_venv.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/diffusion/unet.hpp>
#include <dtrain/trainer.hpp>

namespace dtrain::testing::unet {

namespace fs = std::filesystem;

const fs::path work = fs::path(DTRAIN_TEST_BINARY_DIR) / "unet";
constexpr double tolerance = 1e-5;
using Values = std::map<std::string, std::vector<float>>;

// Runs tests/diffusion/SCRIPT with the pinned torch2 set's Python.
inline void run_python(const std::string& script, const std::string& args, const fs::path& log) {
  const std::string path = std::string(DTRAIN_SOURCE_DIR) + "/tests/diffusion/" + script;
  BOOST_TEST_REQUIRE(run_logged(pinned_python("torch2") + " " + path + " " + args, log) == 0, script << " " << args
                                                                                                     << ":\n"
                                                                                                     << read_text(log));
}
inline void run_script(const std::string& args, const fs::path& log) { run_python("diffusers_unet.py", args, log); }

// The folder of a tiny UNet of `kind` (sd, sdxl) under `root`, made once.
inline const fs::path& made(const std::string& kind, const fs::path& root = work) {
  static std::map<fs::path, fs::path> dirs;
  const fs::path dir = root / kind;
  if (!dirs.contains(dir)) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    run_script("make " + dir.string() + " " + kind, dir / "make.log");
    dirs[dir] = dir;
  }
  return dirs.at(dir);
}

// Rows [first, first + n) of a tensor's elements `all` of `shape`, as
// [n, rest...] (flattened to [n, per] when `flat`).
template <class E>
HostTensor rows_of(const std::vector<E>& all, std::vector<std::int64_t> shape, std::int64_t first, std::int64_t n,
                   bool flat = false) {
  std::int64_t per = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) per *= shape[d];
  shape[0] = n;
  if (flat) shape = {n, per};
  const auto begin = all.begin() + first * per;
  return HostTensor::of(std::vector<E>(begin, begin + n * per), shape);
}

// The same of a float tensor of a file.
inline HostTensor rows(const SafetensorsFile& f, const std::string& name, std::int64_t first, std::int64_t n,
                       bool flat = false) {
  return rows_of(f.read_f32(name), f.tensor(name).shape, first, n, flat);
}

inline Batch batch_of(const SafetensorsFile& in, std::int64_t first, std::int64_t n) {
  Batch b;
  b.set("x", rows(in, "latents", first, n, true));
  b.set("y", rows(in, "target", first, n, true));
  b.set("timesteps", rows(in, "timesteps", first, n));
  b.set("encoder_hidden_states", rows(in, "encoder_hidden_states", first, n));
  if (in.contains("text_embeds")) {
    b.set("pooled", rows(in, "text_embeds", first, n));
    b.set("time_ids", rows(in, "time_ids", first, n));
  }
  return b;
}

inline models::UNetConfig config_of(const fs::path& dir, const SafetensorsFile& in) {
  models::UNetConfig c = diffusion::read_unet_config(dir / "unet");
  c.context_length = in.tensor("encoder_hidden_states").shape.at(1);
  return c;
}

inline double max_abs(std::span<const float> v) {
  double m = 0;
  for (const float e : v) m = std::max(m, std::abs(double(e)));
  return m;
}

inline double worst_difference(std::span<const float> got, std::span<const float> want) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  double w = 0;
  for (std::size_t i = 0; i < got.size(); ++i) w = std::max(w, std::abs(double(got[i]) - want[i]));
  return w;
}

// The largest difference between two runs' parameters.
inline double params_apart(const Values& a, const Values& b) {
  double w = 0;
  for (const auto& [name, values] : a) w = std::max(w, worst_difference(values, b.at(name)));
  return w;
}

constexpr int adamw_count = 20;
constexpr float adamw_lr = 1e-3f;

// The prediction for `batch` at `ranks` ranks under Kind of the model
// make() builds, its weights put in place by load(trainer, model).
template <class Kind, class Make, class Load>
std::vector<float> predict_with(int ranks, const Batch& batch, Make make, Load load) {
  using Model = decltype(make());
  std::vector<float> out;
  run_ranks(ranks, [&](World& w) {
    Model model = make();
    Trainer<Model, Strategy<Kind>> t(w, model, SGD{.lr = 1.f});
    load(t, model);
    std::vector<float> p = t.predict(batch);
    if (w.rank() == 0) out = std::move(p);
  });
  return out;
}

// The parameters after `adamw_count` AdamW steps (lr adamw_lr, no weight
// decay) at `ranks` ranks under Kind, each rank on its share of a batch of
// 2 (batch_of(first, n)); rank 0's losses into `losses`.
template <class Kind, class Make, class Load, class BatchOf>
Values adamw_with(int ranks, Make make, Load load, BatchOf batch_of, std::vector<double>* losses = nullptr) {
  using Model = decltype(make());
  Values out;
  run_ranks(ranks, [&](World& w) {
    Model model = make();
    Trainer<Model, Strategy<Kind>> t(w, model, AdamW{.lr = adamw_lr, .weight_decay = 0.f});
    load(t, model);
    const std::int64_t per = 2 / ranks;
    const Batch b = batch_of(w.rank() * per, per);
    for (int s = 0; s < adamw_count; ++s) {
      const StepStats st = t.step(std::vector<Batch>{b});
      if (losses != nullptr && w.rank() == 0) losses->push_back(st.loss);
    }
    Values p = t.parameters();
    if (w.rank() == 0) out = std::move(p);
  });
  return out;
}

}  // namespace dtrain::testing::unet
