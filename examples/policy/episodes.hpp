#pragma once
// train_policy policy=act's data: recorded episodes, as a LeRobot dataset
// holds them, and the ACT samples drawn from them.
//
// The file (data=FILE.safetensors; export_data=FILE writes the simulator's;
// examples/policy/export_lerobot_dataset.py writes a LeRobot dataset's):
//   observation.images.<camera>  uint8 [N, 3, H, W] per camera (RGB)
//   observation.state            float32 [N, state_dim]
//   action                       float32 [N, action_dim]
//   episode_index                int64 [N]: each episode's frames together, in time order
//   metadata "format": "dtrain-episodes/1", "cameras": the camera keys in order, "fps"
//
// A sample is every frame t of every episode: the images and state at t and
// the actions t .. t + chunk - 1 of the same episode; steps past its last
// frame repeat the last action and are padded (action_is_pad = 1), as
// LeRobot's delta_timestamps pad them. Images become float in [0, 1], then
// every feature is normalised as LeRobot's MEAN_STD: (v - mean) / (std +
// 1e-8), with the training episodes' statistics (per channel for images),
// or the normaliser's of the policy directory model= names.
//
// The simulator: the example's two-link arm reaching for a goal under its
// expert, seen by one camera ("observation.images.top": the whole workspace
// from above: the links red and green, the goal a blue disc) or two
// (+ "observation.images.wrist": a view twice as close, centred on the
// hand). The goal is in the images only: the state holds the joint angles
// and velocities (4), the action the two torques.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <list>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <dtrain/core/error.hpp>
#include <dtrain/core/random.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/io/safetensors.hpp>

namespace policy {

struct Episodes {
  std::vector<std::string> cameras;
  std::int64_t height = 0, width = 0, state_dim = 0, action_dim = 0;
  double fps = 20;
  std::vector<std::uint8_t> images;   // [N, cameras, 3, H, W]
  std::vector<float> state, action;   // [N, state_dim], [N, action_dim]
  std::vector<std::int64_t> episode;  // [N]

  std::int64_t frames() const { return static_cast<std::int64_t>(episode.size()); }
  std::int64_t image_size() const { return 3 * height * width; }
  std::int64_t frame_images() const { return static_cast<std::int64_t>(cameras.size()) * image_size(); }
};

// Per-feature mean and std (images: per camera and channel).
struct Normaliser {
  std::vector<double> image_mean, image_std;  // [cameras * 3]
  std::vector<double> state_mean, state_std, action_mean, action_std;
};

namespace detail {

inline double segment_distance(double px, double py, double ax, double ay, double bx, double by) {
  const double dx = bx - ax, dy = by - ay, len = dx * dx + dy * dy;
  const double t = len > 0 ? std::clamp(((px - ax) * dx + (py - ay) * dy) / len, 0.0, 1.0) : 0.0;
  const double ex = px - ax - t * dx, ey = py - ay - t * dy;
  return std::sqrt(ex * ex + ey * ey);
}

// One camera's image of the arm (angles q0, q1) and the goal: a view of
// half-width `extent` centred at (cx, cy), `size` pixels a side, written
// CHW into out.
inline void render(double q0, double q1, double gx, double gy, double cx, double cy, double extent, std::int64_t size,
                   std::uint8_t* out) {
  const double ex = std::cos(q0), ey = std::sin(q0);
  const double hx = ex + std::cos(q0 + q1), hy = ey + std::sin(q0 + q1);
  const double pixel = 2 * extent / static_cast<double>(size), link = 0.09, goal = 0.16;
  const std::int64_t plane = size * size;
  for (std::int64_t r = 0; r < size; ++r)
    for (std::int64_t k = 0; k < size; ++k) {
      const double px = cx - extent + (static_cast<double>(k) + 0.5) * pixel;
      const double py = cy + extent - (static_cast<double>(r) + 0.5) * pixel;
      double rgb[3] = {0.15, 0.15, 0.15};
      const auto paint = [&](double distance, double radius, double cr, double cg, double cb) {
        // a soft edge one pixel wide
        const double a = std::clamp((radius - distance) / pixel + 0.5, 0.0, 1.0);
        rgb[0] += a * (cr - rgb[0]);
        rgb[1] += a * (cg - rgb[1]);
        rgb[2] += a * (cb - rgb[2]);
      };
      paint(std::hypot(px - gx, py - gy), goal, 0.1, 0.3, 0.95);
      paint(segment_distance(px, py, 0, 0, ex, ey), link, 0.9, 0.2, 0.15);
      paint(segment_distance(px, py, ex, ey, hx, hy), link, 0.2, 0.85, 0.25);
      for (int ch = 0; ch < 3; ++ch)
        out[ch * plane + r * size + k] = static_cast<std::uint8_t>(std::lround(std::clamp(rgb[ch], 0.0, 1.0) * 255));
    }
}

}  // namespace detail

// The simulator's episodes: `episodes` reaches of `length` frames each.
inline Episodes simulate_episodes(std::int64_t episodes, std::int64_t length, std::int64_t cameras, std::int64_t size,
                                  std::uint64_t seed) {
  Episodes e;
  e.cameras = {"observation.images.top"};
  if (cameras == 2) e.cameras.push_back("observation.images.wrist");
  e.height = e.width = size;
  e.state_dim = 4;
  e.action_dim = 2;
  const auto n = static_cast<std::size_t>(episodes * length);
  e.images.resize(n * static_cast<std::size_t>(e.frame_images()));
  dtrain::SplitMix64 rng(seed);
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * rng.uniform(); };
  std::int64_t f = 0;
  for (std::int64_t ep = 0; ep < episodes; ++ep) {
    double q0 = uniform(-3.1, 3.1), q1 = uniform(-2.5, 2.5), v0 = 0, v1 = 0;
    const double radius = uniform(0.4, 1.9), angle = uniform(-3.14159, 3.14159);
    const double gx = radius * std::cos(angle), gy = radius * std::sin(angle);
    for (std::int64_t t = 0; t < length; ++t, ++f) {
      std::uint8_t* img = e.images.data() + f * e.frame_images();
      detail::render(q0, q1, gx, gy, 0, 0, 2.2, size, img);
      if (cameras == 2) {
        const double hx = std::cos(q0) + std::cos(q0 + q1), hy = std::sin(q0) + std::sin(q0 + q1);
        detail::render(q0, q1, gx, gy, hx, hy, 1.1, size, img + e.image_size());
      }
      for (double v : {q0, q1, v0, v1}) e.state.push_back(static_cast<float>(v));
      // the expert (train_policy's MLP task): Jacobian-transpose PD, torques clipped to +-2
      const double x = std::cos(q0) + std::cos(q0 + q1), y = std::sin(q0) + std::sin(q0 + q1);
      const double ex = gx - x, ey = gy - y;
      const double j00 = -std::sin(q0) - std::sin(q0 + q1), j01 = -std::sin(q0 + q1);
      const double j10 = std::cos(q0) + std::cos(q0 + q1), j11 = std::cos(q0 + q1);
      const double t0 = std::clamp(6.0 * (j00 * ex + j10 * ey) - 2.5 * v0, -2.0, 2.0);
      const double t1 = std::clamp(6.0 * (j01 * ex + j11 * ey) - 2.5 * v1, -2.0, 2.0);
      e.action.push_back(static_cast<float>(t0));
      e.action.push_back(static_cast<float>(t1));
      e.episode.push_back(ep);
      constexpr double dt = 0.05;
      v0 += t0 * dt;
      v1 += t1 * dt;
      q0 += v0 * dt;
      q1 += v1 * dt;
    }
  }
  return e;
}

inline void write_episodes(const Episodes& e, const std::filesystem::path& file) {
  dtrain::SafetensorsWriter w;
  w.set_metadata("format", "dtrain-episodes/1");
  std::string cams;
  for (const auto& c : e.cameras) cams += (cams.empty() ? "" : ",") + c;
  w.set_metadata("cameras", cams);
  w.set_metadata("fps", std::to_string(e.fps));
  const std::int64_t n = e.frames();
  std::list<std::vector<std::uint8_t>> planes;  // the writer refers to them until write()
  for (std::size_t k = 0; k < e.cameras.size(); ++k) {
    auto& v = planes.emplace_back(static_cast<std::size_t>(n * e.image_size()));
    for (std::int64_t f = 0; f < n; ++f)
      std::copy_n(e.images.begin() + f * e.frame_images() + static_cast<std::int64_t>(k) * e.image_size(),
                  e.image_size(), v.begin() + f * e.image_size());
    w.add(e.cameras[k], {n, 3, e.height, e.width}, std::span<const std::uint8_t>(v));
  }
  w.add("observation.state", {n, e.state_dim}, std::span<const float>(e.state));
  w.add("action", {n, e.action_dim}, std::span<const float>(e.action));
  w.add("episode_index", {n}, std::span<const std::int64_t>(e.episode));
  w.write(file);
}

// Reads and checks a recorded-episodes file; every problem is one error
// naming the tensor and the fix.
inline Episodes read_episodes(const std::filesystem::path& file) {
  const std::string where = "data \"" + file.string() + "\"";
  const dtrain::SafetensorsFile f = dtrain::SafetensorsFile::open(file);
  Episodes e;
  const auto meta = f.metadata();
  if (auto it = meta.find("cameras"); it != meta.end()) {
    std::string s = it->second;
    for (std::size_t at = 0; at <= s.size();) {
      const std::size_t comma = std::min(s.find(',', at), s.size());
      if (comma > at) e.cameras.push_back(s.substr(at, comma - at));
      at = comma + 1;
    }
  } else {
    for (const auto& n : f.names())
      if (n.rfind("observation.images.", 0) == 0) e.cameras.push_back(n);
  }
  if (e.cameras.empty())
    throw dtrain::config_error(where + " holds no camera (observation.images.*)",
                               "give each camera's frames as uint8 [N, 3, H, W] (see train_policy --help)");
  const auto need = [&](const std::string& name, std::size_t rank) {
    if (!f.contains(name))
      throw dtrain::config_error(where + " lacks \"" + name + "\"", "see train_policy --help for the episodes format");
    dtrain::SafetensorsTensor t = f.tensor(name);
    if (t.shape.size() != rank)
      throw dtrain::config_error(where + ": \"" + name + "\" has " + std::to_string(t.shape.size()) +
                                     " dimensions, not " + std::to_string(rank),
                                 "see train_policy --help for the episodes format");
    return t;
  };
  const auto state = need("observation.state", 2);
  const auto action = need("action", 2);
  const auto index = need("episode_index", 1);
  const std::int64_t n = index.shape[0];
  if (state.shape[0] != n || action.shape[0] != n)
    throw dtrain::config_error(where + ": " + std::to_string(n) + " frames in episode_index but " +
                                   std::to_string(state.shape[0]) + " states and " + std::to_string(action.shape[0]) +
                                   " actions",
                               "give one state and one action per frame");
  e.state_dim = state.shape[1];
  e.action_dim = action.shape[1];
  e.state = f.read_f32("observation.state");
  e.action = f.read_f32("action");
  e.episode = f.read_i64("episode_index");
  for (std::int64_t i = 1; i < n; ++i)
    if (e.episode[static_cast<std::size_t>(i)] < e.episode[static_cast<std::size_t>(i - 1)])
      throw dtrain::config_error(where + ": episode_index decreases at frame " + std::to_string(i),
                                 "store each episode's frames together, in time order");
  for (std::size_t k = 0; k < e.cameras.size(); ++k) {
    const auto t = need(e.cameras[k], 4);
    if (t.dtype != dtrain::element_type::u8)
      throw dtrain::config_error(where + ": camera \"" + e.cameras[k] + "\" holds " +
                                     std::string(dtrain::element_name(t.dtype)) + ", not uint8",
                                 "store images as uint8 RGB (export_lerobot_dataset.py does)");
    if (t.shape[0] != n || t.shape[1] != 3)
      throw dtrain::config_error(where + ": camera \"" + e.cameras[k] + "\" has shape " + dtrain::shape_text(t.shape) +
                                     " for " + std::to_string(n) + " frames",
                                 "give [frames, 3, H, W] per camera");
    if (k == 0) {
      e.height = t.shape[2];
      e.width = t.shape[3];
      e.images.resize(
          static_cast<std::size_t>(n * static_cast<std::int64_t>(e.cameras.size()) * 3 * e.height * e.width));
    } else if (t.shape[2] != e.height || t.shape[3] != e.width) {
      throw dtrain::config_error(where + ": camera \"" + e.cameras[k] + "\" is " + std::to_string(t.shape[2]) + "x" +
                                     std::to_string(t.shape[3]) + ", \"" + e.cameras[0] + "\" " +
                                     std::to_string(e.height) + "x" + std::to_string(e.width),
                                 "give every camera the same size (as LeRobot's ACT requires)");
    }
    const auto* v = reinterpret_cast<const std::uint8_t*>(t.bytes.data());
    for (std::int64_t i = 0; i < n; ++i)
      std::copy_n(v + i * e.image_size(), e.image_size(),
                  e.images.begin() + i * e.frame_images() + static_cast<std::int64_t>(k) * e.image_size());
  }
  if (auto it = meta.find("fps"); it != meta.end()) e.fps = std::atof(it->second.c_str());
  return e;
}

// The episodes' numbers, in order, and the split: the last tenth held out.
inline std::vector<std::int64_t> episode_starts(const Episodes& e) {
  std::vector<std::int64_t> starts;
  for (std::int64_t i = 0; i < e.frames(); ++i)
    if (i == 0 || e.episode[static_cast<std::size_t>(i)] != e.episode[static_cast<std::size_t>(i - 1)])
      starts.push_back(i);
  starts.push_back(e.frames());
  return starts;
}

// Statistics over the frames [first, last).
inline Normaliser statistics(const Episodes& e, std::int64_t first, std::int64_t last) {
  Normaliser s;
  const auto moments = [&](std::int64_t dim, auto value, std::vector<double>& mean, std::vector<double>& stdev) {
    mean.assign(static_cast<std::size_t>(dim), 0.0);
    stdev.assign(static_cast<std::size_t>(dim), 0.0);
    std::vector<double> sq(static_cast<std::size_t>(dim), 0.0);
    double count = 0;
    for (std::int64_t f = first; f < last; ++f) value(f, mean, sq, count);
    for (std::size_t d = 0; d < mean.size(); ++d) {
      const double m = mean[d] / count;
      mean[d] = m;
      stdev[d] = std::sqrt(std::max(0.0, sq[d] / count - m * m));
    }
  };
  const std::int64_t plane = e.height * e.width, channels = static_cast<std::int64_t>(e.cameras.size()) * 3;
  moments(
      channels,
      [&](std::int64_t f, std::vector<double>& sum, std::vector<double>& sq, double& count) {
        const std::uint8_t* img = e.images.data() + f * e.frame_images();
        for (std::int64_t c = 0; c < channels; ++c)
          for (std::int64_t p = 0; p < plane; ++p) {
            const double v = img[c * plane + p] / 255.0;
            sum[static_cast<std::size_t>(c)] += v;
            sq[static_cast<std::size_t>(c)] += v * v;
          }
        count += static_cast<double>(plane);
      },
      s.image_mean, s.image_std);
  const auto rows = [&](const std::vector<float>& data, std::int64_t dim) {
    return [&data, dim](std::int64_t f, std::vector<double>& sum, std::vector<double>& sq, double& count) {
      for (std::int64_t d = 0; d < dim; ++d) {
        const double v = data[static_cast<std::size_t>(f * dim + d)];
        sum[static_cast<std::size_t>(d)] += v;
        sq[static_cast<std::size_t>(d)] += v * v;
      }
      count += 1;
    };
  };
  moments(e.state_dim, rows(e.state, e.state_dim), s.state_mean, s.state_std);
  moments(e.action_dim, rows(e.action, e.action_dim), s.action_mean, s.action_std);
  return s;
}

// The ACT samples of episodes [first, last) of `e` (fit's data source).
struct ActSamples {
  const Episodes* e = nullptr;
  const Normaliser* norm = nullptr;
  std::int64_t chunk = 1;
  std::vector<std::int64_t> frame;  // the sample's frame
  std::vector<std::int64_t> end;    // its episode's end (one past its last frame)

  std::int64_t size() const { return static_cast<std::int64_t>(frame.size()); }

  // x [B, cameras * 3 * H * W], observation.state [B, S], action [B, chunk, A]
  // (normalised), action_is_pad int64 [B, chunk].
  dtrain::Batch gather(std::span<const std::int64_t> indices) const {
    const auto n = static_cast<std::int64_t>(indices.size());
    const std::int64_t fi = e->frame_images(), plane = e->height * e->width, S = e->state_dim, A = e->action_dim;
    std::vector<float> x(static_cast<std::size_t>(n * fi)), st(static_cast<std::size_t>(n * S)),
        act(static_cast<std::size_t>(n * chunk * A));
    std::vector<std::int64_t> pad(static_cast<std::size_t>(n * chunk));
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t f = frame[static_cast<std::size_t>(indices[static_cast<std::size_t>(r)])];
      const std::int64_t last = end[static_cast<std::size_t>(indices[static_cast<std::size_t>(r)])] - 1;
      const std::uint8_t* img = e->images.data() + f * fi;
      for (std::int64_t i = 0; i < fi; ++i) {
        const auto c = static_cast<std::size_t>(i / plane);
        x[static_cast<std::size_t>(r * fi + i)] =
            static_cast<float>((img[i] / 255.0 - norm->image_mean[c]) / (norm->image_std[c] + 1e-8));
      }
      for (std::int64_t d = 0; d < S; ++d)
        st[static_cast<std::size_t>(r * S + d)] = static_cast<float>(
            (e->state[static_cast<std::size_t>(f * S + d)] - norm->state_mean[static_cast<std::size_t>(d)]) /
            (norm->state_std[static_cast<std::size_t>(d)] + 1e-8));
      for (std::int64_t k = 0; k < chunk; ++k) {
        const std::int64_t g = std::min(f + k, last);
        pad[static_cast<std::size_t>(r * chunk + k)] = f + k > last ? 1 : 0;
        for (std::int64_t d = 0; d < A; ++d)
          act[static_cast<std::size_t>((r * chunk + k) * A + d)] = static_cast<float>(
              (e->action[static_cast<std::size_t>(g * A + d)] - norm->action_mean[static_cast<std::size_t>(d)]) /
              (norm->action_std[static_cast<std::size_t>(d)] + 1e-8));
      }
    }
    dtrain::Batch b;
    b.set("x", dtrain::HostTensor::of(std::move(x), {n, fi}));
    b.set("observation.state", dtrain::HostTensor::of(std::move(st), {n, S}));
    b.set("action", dtrain::HostTensor::of(std::move(act), {n, chunk, A}));
    b.set("action_is_pad", dtrain::HostTensor::of(std::move(pad), {n, chunk}));
    return b;
  }
};

// The samples of episodes [first_episode, last_episode) (indices into starts).
inline ActSamples act_samples(const Episodes& e, const Normaliser& norm, std::int64_t chunk,
                              const std::vector<std::int64_t>& starts, std::size_t first_episode,
                              std::size_t last_episode) {
  ActSamples s{&e, &norm, chunk, {}, {}};
  for (std::size_t ep = first_episode; ep < last_episode; ++ep)
    for (std::int64_t f = starts[ep]; f < starts[ep + 1]; ++f) {
      s.frame.push_back(f);
      s.end.push_back(starts[ep + 1]);
    }
  return s;
}

}  // namespace policy
