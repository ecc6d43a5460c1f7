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

#include <cstdint>
#include <vector>

#include "dtrain/models/mlp.hpp"
#include "dtrain/models/run_config.hpp"
#include "dtrain/nn/regression_loss.hpp"

namespace dtrain::models {

// train_policy's keys that shape the model.
struct PolicyConfig : RunConfig {
  std::vector<std::int64_t> hidden = {256, 256};
  std::int64_t horizon = 8;  // actions per predicted chunk
  bool image = false;        // add the goal image to the observation
  std::int64_t image_size = 8;
};

inline constexpr std::int64_t action_dim = 2;
inline std::int64_t observation_dim(const PolicyConfig& c) { return 6 + (c.image ? c.image_size * c.image_size : 0); }

struct Policy : Mlp<nn::MSELoss> {
  explicit Policy(const PolicyConfig& c) : Mlp(observation_dim(c), c.hidden, action_dim * c.horizon, "gelu") {}
};

}  // namespace dtrain::models
