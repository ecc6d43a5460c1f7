#pragma once
// A ready model: train_policy's robot policy with its keys (examples/policy
// trains it by behaviour cloning). An observation (a planar two-link arm's
// joint angles and velocities and its goal, with image=true also the goal
// rendered on an image_size^2 grid) goes to the next `horizon` actions (two
// torques each) through an MLP (Linear, GELU per hidden width, Linear)
// trained with a mean-squared-error loss.
//
//   units: the layers in order (Linear, GELU, ..., Linear)
//   batch: x float [B, observation_dim], y float [B, action_dim * horizon]
// With policy=act train_policy trains models::Act instead (models/act.hpp)
// on the simulator's camera images: simulator_act_config gives its config.

#include <cstdint>
#include <string>
#include <vector>

#include "dtrain/models/act.hpp"
#include "dtrain/models/mlp.hpp"
#include "dtrain/models/run_config.hpp"
#include "dtrain/nn/regression_loss.hpp"

namespace dtrain::models {

// train_policy's keys that shape the model.
struct PolicyConfig : RunConfig {
  std::string policy = "mlp";  // mlp | act (LeRobot's ACT on camera images: models/act.hpp)
  std::vector<std::int64_t> hidden = {256, 256};
  std::int64_t horizon = 8;  // actions per predicted chunk (ACT's chunk_size)
  bool image = false;        // add the goal image to the observation
  std::int64_t image_size = 8;
  std::int64_t cameras = 1;  // policy=act: the simulator's cameras, 1 (top) or 2 (top, wrist)
  std::int64_t camera_size = 64;
  ActConfig act;  // policy=act: the ACT keys (LeRobot's ACTConfig names)
};

// The simulator's features for policy=act: its cameras, a 4-value state
// (joint angles and velocities), 2 torques; the chunk is `horizon`.
inline ActConfig simulator_act_config(const PolicyConfig& c) {
  ActConfig a = c.act;
  a.chunk_size = a.n_action_steps = c.horizon;
  a.cameras = {"observation.images.top"};
  if (c.cameras == 2) a.cameras.push_back("observation.images.wrist");
  a.image_height = a.image_width = c.camera_size;
  a.state_dim = 4;
  a.action_dim = 2;
  return a;
}

inline constexpr std::int64_t action_dim = 2;
inline std::int64_t observation_dim(const PolicyConfig& c) { return 6 + (c.image ? c.image_size * c.image_size : 0); }

struct Policy : Mlp<nn::MSELoss> {
  explicit Policy(const PolicyConfig& c) : Mlp(observation_dim(c), c.hidden, action_dim * c.horizon, "gelu") {}
};

}  // namespace dtrain::models
