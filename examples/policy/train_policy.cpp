// train_policy: behaviour cloning of a robot policy (observation -> a chunk
// of continuous actions, MSE) with dtrain on every rank it was launched with.
//
//   dtrain-run --nproc-per-node 2 train_policy --config examples/configs/policy_host.yaml image=true
//
// Compiled by g++ only: yaml-cpp and range-v3 stay out of the nvcc translation units.

#include <cstdio>
#include <exception>
#include <string>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "policy.hpp"

namespace policy {
namespace {

constexpr const char* usage = R"(Behaviour cloning: a two-link arm reaching goals under an expert controller;
the policy maps the observation (joints, velocities, goal; with image=true
also the goal drawn on a grid) to the expert's next `horizon` torques, with a
mean-squared-error loss, and reports the held-out action MSE at the end.
)";

void declare_extra(dtrain::ConfigReader& r, Config& c) {
  r.add("hidden", c.hidden, "hidden widths, e.g. [256, 256] or 256,256");
  r.add("horizon", c.horizon, "actions per chunk");
  r.add("image", c.image, "also the goal drawn on a grid");
  r.add("image_size", c.image_size, "grid side");
  r.add("episodes", c.episodes, "generated demonstrations");
  r.add("episode_length", c.episode_length, "steps per demonstration");
  r.add("data_seed", c.data_seed, "seed of the demonstrations");
}

void validate_extra(const Config& c) {
  if (c.hidden.empty() || c.horizon < 1 || c.image_size < 1 || c.episodes < 2)
    throw dtrain::config_error("hidden must be non-empty, horizon and image_size >= 1, episodes >= 2",
                               "see train_policy --help");
}

}  // namespace
}  // namespace policy

int main(int argc, char** argv) {
  try {
    const auto cfg = examples::parse_cli<policy::Config>(argc, argv, "train_policy", policy::usage,
                                                         policy::declare_extra, policy::validate_extra);
    auto world = examples::init_world(cfg);
    const policy::DataSets data = policy::make_demonstrations(cfg);
    if (world.rank() == 0)
      std::printf(
          "train_policy: %d rank(s), strategy=%s device=%s precision=%s accumulate=%d batch=%lld/rank, %lld "
          "demonstrations (%lld held out), observation %lld, action chunk %lld x %lld\n",
          world.size(), cfg.strategy.c_str(), cfg.device.c_str(), cfg.precision.c_str(), cfg.accumulate,
          static_cast<long long>(cfg.batch_size), static_cast<long long>(data.train.size()),
          static_cast<long long>(data.held_out.size()), static_cast<long long>(policy::observation_dim(cfg)),
          static_cast<long long>(cfg.horizon), static_cast<long long>(policy::action_dim));
    if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
      return policy::train_cuda(cfg, world, data);
#else
      throw dtrain::config_error("this train_policy was built without CUDA", "use device=host, or rebuild with CUDA");
#endif
    }
    return policy::train_host(cfg, world, data);
  } catch (const std::exception& e) {
    examples::report_failure(e);
    return examples::exit_status(e);
  }
}
