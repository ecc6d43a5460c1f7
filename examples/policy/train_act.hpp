#pragma once
// train_policy policy=act: LeRobot's ACT (dtrain/models/act.hpp) on camera
// episodes (episodes.hpp), started from a LeRobot policy directory or from
// scratch, evaluated on the held-out episodes and saved for LeRobot.
// Everything that can be wrong with the config, the policy directory or the
// data is found by prepare_act, before the job starts or writes anything.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/loop.hpp"
#include "episodes.hpp"
#include "policy.hpp"

#include <dtrain/lerobot/act.hpp>

namespace policy {

struct ActRun {
  dtrain::models::ActConfig config;
  std::string base_config_json;  // the policy directory's config.json ("" from scratch)
  Episodes episodes;
  Normaliser norm;
  bool norm_from_model = false;
  ActSamples train, held_out;
};

namespace detail {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The normaliser LeRobot keeps with a policy (its preprocessor's state), if any.
inline bool read_normaliser(const std::filesystem::path& dir, const Episodes& e, Normaliser& n) {
  namespace fs = std::filesystem;
  fs::path file;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("policy_preprocessor_step_", 0) == 0 &&
        name.find("normalizer_processor.safetensors") != std::string::npos)
      file = entry.path();
  }
  if (file.empty()) return false;
  const auto f = dtrain::SafetensorsFile::open(file);
  const auto vec = [&](const std::string& key, std::size_t size) {
    if (!f.contains(key))
      throw dtrain::config_error("\"" + file.string() + "\" lacks \"" + key + "\"",
                                 "give the data the policy was trained on (the same feature names)");
    const std::vector<float> v = f.read_f32(key);
    if (v.size() != size)
      throw dtrain::config_error("\"" + file.string() + "\": \"" + key + "\" holds " + std::to_string(v.size()) +
                                     " values, the data needs " + std::to_string(size),
                                 "give the data the policy was trained on");
    return std::vector<double>(v.begin(), v.end());
  };
  n.image_mean.clear();
  n.image_std.clear();
  for (const auto& cam : e.cameras) {
    for (const double v : vec(cam + ".mean", 3)) n.image_mean.push_back(v);
    for (const double v : vec(cam + ".std", 3)) n.image_std.push_back(v);
  }
  n.state_mean = vec("observation.state.mean", static_cast<std::size_t>(e.state_dim));
  n.state_std = vec("observation.state.std", static_cast<std::size_t>(e.state_dim));
  n.action_mean = vec("action.mean", static_cast<std::size_t>(e.action_dim));
  n.action_std = vec("action.std", static_cast<std::size_t>(e.action_dim));
  return true;
}

// LeRobot's processor files for `n`: the preprocessor normalises the inputs
// and the action, the postprocessor unnormalises the action.
inline void write_processors(const std::filesystem::path& dir, const dtrain::models::ActConfig& c,
                             const Normaliser& n) {
  std::list<std::vector<float>> values;
  dtrain::SafetensorsWriter w;
  const auto add = [&](const std::string& key, const std::vector<double>& v, std::size_t first, std::size_t count,
                       std::vector<std::int64_t> shape) {
    w.add(key, std::move(shape),
          std::span<const float>(values.emplace_back(v.begin() + static_cast<std::ptrdiff_t>(first),
                                                     v.begin() + static_cast<std::ptrdiff_t>(first + count))));
  };
  for (std::size_t k = 0; k < c.cameras.size(); ++k) {
    add(c.cameras[k] + ".mean", n.image_mean, 3 * k, 3, {3, 1, 1});
    add(c.cameras[k] + ".std", n.image_std, 3 * k, 3, {3, 1, 1});
  }
  add("observation.state.mean", n.state_mean, 0, n.state_mean.size(), {c.state_dim});
  add("observation.state.std", n.state_std, 0, n.state_std.size(), {c.state_dim});
  add("action.mean", n.action_mean, 0, n.action_mean.size(), {c.action_dim});
  add("action.std", n.action_std, 0, n.action_std.size(), {c.action_dim});
  w.write(dir / "policy_preprocessor_step_3_normalizer_processor.safetensors");
  w.write(dir / "policy_postprocessor_step_0_unnormalizer_processor.safetensors");
  std::string inputs = "\"observation.state\": {\"type\": \"STATE\", \"shape\": [" + std::to_string(c.state_dim) + "]}";
  for (const auto& cam : c.cameras)
    inputs += ", \"" + cam + "\": {\"type\": \"VISUAL\", \"shape\": [3, " + std::to_string(c.image_height) + ", " +
              std::to_string(c.image_width) + "]}";
  const std::string action = "\"action\": {\"type\": \"ACTION\", \"shape\": [" + std::to_string(c.action_dim) + "]}";
  const std::string norm_map = R"("norm_map": {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"})";
  const std::string device =
      R"({"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": null}})";
  std::ofstream(dir / "policy_preprocessor.json")
      << "{\"name\": \"policy_preprocessor\", \"steps\": [{\"registry_name\": \"rename_observations_processor\", "
         "\"config\": {\"rename_map\": {}}}, {\"registry_name\": \"to_batch_processor\", \"config\": {}}, "
      << device << ", {\"registry_name\": \"normalizer_processor\", \"config\": {\"eps\": 1e-08, \"features\": {"
      << inputs << ", " << action << "}, " << norm_map
      << "}, \"state_file\": \"policy_preprocessor_step_3_normalizer_processor.safetensors\"}]}\n";
  std::ofstream(dir / "policy_postprocessor.json")
      << "{\"name\": \"policy_postprocessor\", \"steps\": [{\"registry_name\": \"unnormalizer_processor\", "
         "\"config\": {\"eps\": 1e-08, \"features\": {"
      << action << "}, " << norm_map
      << "}, \"state_file\": \"policy_postprocessor_step_0_unnormalizer_processor.safetensors\"}, " << device << "]}\n";
}

}  // namespace detail

// Reads and checks everything: the policy directory's config (model=) or
// the keys, the episodes (data= or the simulator), their agreement, the
// normaliser. Throws config_error (exit 2) before anything starts.
inline ActRun prepare_act(const Config& c) {
  ActRun r;
  r.episodes = c.data.empty() ? simulate_episodes(c.episodes, c.episode_length, c.cameras, c.camera_size, c.data_seed)
                              : read_episodes(c.data);
  const Episodes& e = r.episodes;
  if (!c.model.empty()) {
    r.config = dtrain::lerobot::read_act_config(c.model);
    r.base_config_json = detail::read_text(std::filesystem::path(c.model) / "config.json");
    const auto& m = r.config;
    std::string theirs, ours;
    for (const auto& cam : m.cameras) theirs += (theirs.empty() ? "" : ", ") + cam;
    for (const auto& cam : e.cameras) ours += (ours.empty() ? "" : ", ") + cam;
    if (theirs != ours)
      throw dtrain::config_error("the policy's cameras (" + theirs + ") are not the data's (" + ours + ")",
                                 "give episodes recorded with the cameras the policy was trained on, in its order");
    if (m.image_height != e.height || m.image_width != e.width)
      throw dtrain::config_error("the policy takes " + std::to_string(m.image_height) + "x" +
                                     std::to_string(m.image_width) + " images, the data's are " +
                                     std::to_string(e.height) + "x" + std::to_string(e.width),
                                 "resize the recorded images to the policy's size (or camera_size= for the simulator)");
    if (m.state_dim != e.state_dim)
      throw dtrain::config_error("the policy's state has " + std::to_string(m.state_dim) + " values, the data's " +
                                     std::to_string(e.state_dim),
                                 "give episodes of the robot the policy was trained for");
    if (m.action_dim != e.action_dim)
      throw dtrain::config_error("the policy's action has " + std::to_string(m.action_dim) + " values, the data's " +
                                     std::to_string(e.action_dim),
                                 "give episodes of the robot the policy was trained for");
  } else {
    r.config = dtrain::models::simulator_act_config(c);
    r.config.cameras = e.cameras;
    r.config.image_height = e.height;
    r.config.image_width = e.width;
    r.config.state_dim = e.state_dim;
    r.config.action_dim = e.action_dim;
    dtrain::models::check_act_config(r.config);
  }
  const std::vector<std::int64_t> starts = episode_starts(e);
  const std::size_t episodes = starts.size() - 1;
  if (episodes < 2)
    throw dtrain::config_error("the data holds " + std::to_string(episodes) + " episode(s)",
                               "give at least 2 episodes (the last tenth is held out)");
  std::int64_t longest = 0;
  for (std::size_t i = 0; i < episodes; ++i) longest = std::max(longest, starts[i + 1] - starts[i]);
  if (r.config.chunk_size > longest)
    throw dtrain::config_error("chunk_size " + std::to_string(r.config.chunk_size) + " is longer than every episode (" +
                                   std::to_string(longest) + " frames at most)",
                               "use a shorter chunk (horizon=, or the policy's chunk_size) or longer episodes");
  const std::size_t held_out_from = episodes - std::max<std::size_t>(1, episodes / 10);
  if (!c.model.empty()) r.norm_from_model = detail::read_normaliser(c.model, e, r.norm);
  if (!r.norm_from_model) r.norm = statistics(e, 0, starts[held_out_from]);
  r.train = act_samples(e, r.norm, r.config.chunk_size, starts, 0, held_out_from);
  r.held_out = act_samples(e, r.norm, r.config.chunk_size, starts, held_out_from, episodes);
  return r;
}

// The held-out action L1 (the loss outside training: the VAE is off, as at
// inference) against predicting the training chunks' mean at each chunk
// position, both as LeRobot's L1: over the unpadded actions, normalised,
// divided by chunk x action_dim.
template <class Trainer>
void evaluate_act(const ActRun& r, dtrain::World& world, Trainer& trainer) {
  std::vector<std::int64_t> mine;  // an equal share on every rank
  for (std::int64_t k = 0; k < r.held_out.size() / world.size(); ++k) mine.push_back(world.rank() + k * world.size());
  std::vector<dtrain::Batch> batches;
  for (std::size_t at = 0; at < mine.size(); at += 64)
    batches.push_back(r.held_out.gather(std::span(mine).subspan(at, std::min<std::size_t>(64, mine.size() - at))));
  const double l1 = trainer.evaluate(batches).loss;
  const std::int64_t C = r.config.chunk_size, A = r.config.action_dim;
  std::vector<double> mean(static_cast<std::size_t>(C * A), 0.0), count(static_cast<std::size_t>(C * A), 0.0);
  const auto each = [&](const ActSamples& s, auto f) {
    for (std::int64_t at = 0; at < s.size(); at += 256) {
      std::vector<std::int64_t> idx;
      for (std::int64_t i = at; i < std::min(s.size(), at + 256); ++i) idx.push_back(i);
      const dtrain::Batch b = s.gather(idx);
      const auto act = b.at("action").values<float>();
      const auto pad = b.at("action_is_pad").values<std::int64_t>();
      for (std::size_t i = 0; i < act.size(); ++i)
        if (pad[i / static_cast<std::size_t>(A)] == 0) f(i % static_cast<std::size_t>(C * A), act[i]);
    }
  };
  each(r.train, [&](std::size_t k, float v) {
    mean[k] += v;
    count[k] += 1;
  });
  for (std::size_t k = 0; k < mean.size(); ++k) mean[k] /= std::max(1.0, count[k]);
  double baseline = 0;
  each(r.held_out, [&](std::size_t k, float v) { baseline += std::abs(v - mean[k]); });
  baseline /= static_cast<double>(r.held_out.size() * C * A);
  if (world.rank() == 0)
    std::printf("eval: held-out action L1 %.5f (predicting the mean chunk: %.5f), normalised actions, %lld samples\n",
                l1, baseline, static_cast<long long>(r.held_out.size()));
}

template <class Dev>
int train_act(const Config& c, dtrain::World& world, const ActRun& r) {
  return examples::with_precision(c, [&]<class Prec>() {
    dtrain::models::Act model(r.config);
    const auto start = [&](auto& trainer) {
      if (!c.model.empty()) {
        const auto loaded = dtrain::lerobot::load_lerobot(trainer, c.model, model);
        if (world.rank() == 0)
          std::printf("loaded the LeRobot ACT policy %s: %zu tensors (normaliser: %s)\n", c.model.c_str(),
                      loaded.loaded.size(), r.norm_from_model ? "the policy's" : "the data's, the policy kept none");
      } else if (!c.backbone_weights.empty()) {
        const auto loaded = dtrain::lerobot::load_torchvision_backbone(trainer, c.backbone_weights, model);
        if (world.rank() == 0)
          std::printf("the backbone from %s: %zu tensors\n", c.backbone_weights.c_str(), loaded.loaded.size());
      }
    };
    const auto finish = [&](auto& trainer) {
      evaluate_act(r, world, trainer);
      if (c.save_lerobot.empty()) return;
      dtrain::lerobot::save_lerobot(trainer, c.save_lerobot, model, r.base_config_json);
      if (world.rank() == 0) {
        detail::write_processors(c.save_lerobot, r.config, r.norm);
        std::printf("saved the policy as a LeRobot directory: %s\n", c.save_lerobot.c_str());
      }
    };
    return examples::run_training<Dev, Prec>(c, world, model, r.train, start, finish);
  });
}

// A translation unit each (train_host.cpp, train_cuda.cu).
int train_act_host(const Config&, dtrain::World&, const ActRun&);
int train_act_cuda(const Config&, dtrain::World&, const ActRun&);

}  // namespace policy
