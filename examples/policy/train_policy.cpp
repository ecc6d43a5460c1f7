// train_policy: behaviour cloning of a robot policy with dtrain on every rank
// it was launched with: policy=mlp (observation -> a chunk of continuous
// actions, MSE) or policy=act (LeRobot's ACT on camera images, loaded from
// and saved for LeRobot).
//
//   dtrain-run --nproc-per-node 2 train_policy --config examples/configs/policy_host.yaml image=true
//   dtrain-run --nproc-per-node 2 train_policy --config examples/configs/act_host.yaml save_lerobot=./act
//
// Compiled by g++ only: yaml-cpp and range-v3 stay out of the nvcc translation units.

#include <cstdio>
#include <exception>
#include <string>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "policy.hpp"
#include "train_act.hpp"

namespace policy {
namespace {

constexpr const char* usage = R"(Behaviour cloning: a two-link arm reaching goals under an expert controller.
policy=mlp: the policy maps the observation (joints, velocities, goal; with
image=true also the goal drawn on a grid) to the expert's next `horizon`
torques, with a mean-squared-error loss, and reports the held-out action MSE.
policy=act: LeRobot's ACT (a ResNet-18 on each camera, a transformer encoder
and decoder, a conditional-VAE latent) maps camera images of the arm and the
goal (cameras= 1 or 2, camera_size^2 RGB) and the joint state to the next
`horizon` torques (chunk_size), with LeRobot's masked L1 + KL loss, and
reports the held-out action L1. model=DIR starts from a LeRobot ACT policy
directory (its config sets the sizes), save_lerobot=DIR writes one
ACTPolicy.from_pretrained loads. data=FILE trains on recorded episodes instead
of the simulator's: a safetensors file of N frames, observation.images.<cam>
uint8 [N, 3, H, W] per camera, observation.state float32 [N, S], action
float32 [N, A], episode_index int64 [N] (examples/policy/
export_lerobot_dataset.py writes one from a LeRobot dataset).
)";

void declare_extra(dtrain::ConfigReader& r, Config& c) {
  r.add("hidden", c.hidden, "hidden widths, e.g. [256, 256] or 256,256");
  r.add("horizon", c.horizon, "actions per chunk");
  r.add("image", c.image, "also the goal drawn on a grid");
  r.add("image_size", c.image_size, "grid side");
  r.add("episodes", c.episodes, "generated demonstrations");
  r.add("episode_length", c.episode_length, "steps per demonstration");
  r.add("data_seed", c.data_seed, "seed of the demonstrations");
  r.add("policy", c.policy, "mlp | act (LeRobot's ACT on camera images)");
  r.section("policy=act: the data, LeRobot's policy directories");
  r.add("cameras", c.cameras, "the simulator's cameras: 1 (top) or 2 (top, wrist)");
  r.add("camera_size", c.camera_size, "the simulator's images: camera_size x camera_size RGB");
  r.add("data", c.data, "recorded episodes (see above) instead of the simulator's");
  r.add("export_data", c.export_data, "write the simulator's episodes to this file and stop");
  r.add("model", c.model, "a LeRobot ACT policy directory to fine-tune (its config.json sets the sizes)");
  r.add("save_lerobot", c.save_lerobot, "at the end, write the policy here as ACTPolicy.save_pretrained does");
  r.add("backbone_weights", c.backbone_weights,
        "torchvision resnet18 weights as safetensors (conv1.weight, layer1.0.conv1.weight, ...) for the backbone");
  r.section("policy=act: LeRobot's ACTConfig (ignored with model=; horizon is chunk_size)");
  r.add("dim_model", c.act.dim_model, "the transformer's width");
  r.add("n_heads", c.act.n_heads, "attention heads");
  r.add("dim_feedforward", c.act.dim_feedforward, "the feed-forward blocks' width");
  r.add("n_encoder_layers", c.act.n_encoder_layers, "encoder layers");
  r.add("n_decoder_layers", c.act.n_decoder_layers, "decoder layers");
  r.add("use_vae", c.act.use_vae, "the conditional-VAE style latent and its KL term");
  r.add("latent_dim", c.act.latent_dim, "the latent's size");
  r.add("n_vae_encoder_layers", c.act.n_vae_encoder_layers, "the VAE encoder's layers");
  r.add("kl_weight", c.act.kl_weight, "the KL term's weight");
  r.add("dropout", c.act.dropout, "dropout in the transformer layers");
  r.add("pre_norm", c.act.pre_norm, "pre-norm layers (LeRobot's default: post-norm)");
  r.add("feedforward_activation", c.act.feedforward_activation, "relu | gelu");
}

void validate_extra(const Config& c) {
  if (c.hidden.empty() || c.horizon < 1 || c.image_size < 1 || c.episodes < 2)
    throw dtrain::config_error("hidden must be non-empty, horizon and image_size >= 1, episodes >= 2",
                               "see train_policy --help");
  if (c.policy != "mlp" && c.policy != "act")
    throw dtrain::config_error("policy=" + c.policy + " is not a policy train_policy trains",
                               "use policy=mlp or policy=act");
  const bool act_only = !c.data.empty() || !c.export_data.empty() || !c.model.empty() || !c.save_lerobot.empty() ||
                        !c.backbone_weights.empty();
  if (c.policy != "act" && act_only)
    throw dtrain::config_error("data=, export_data=, model=, save_lerobot= and backbone_weights= are policy=act keys",
                               "add policy=act");
  if (c.cameras != 1 && c.cameras != 2)
    throw dtrain::config_error("cameras=" + std::to_string(c.cameras) + ": the simulator has 1 or 2 cameras",
                               "use cameras=1 or cameras=2");
  if (c.camera_size < 32)
    throw dtrain::config_error("camera_size=" + std::to_string(c.camera_size) + " is too small for the ResNet",
                               "use camera_size >= 32");
  if (!c.model.empty() && !c.backbone_weights.empty())
    throw dtrain::config_error("model= and backbone_weights= both set",
                               "the policy directory holds its backbone: drop backbone_weights=");
}

// policy=act: everything checked (and export_data= written) before the job starts.
int run_act(const Config& cfg) {
  if (!cfg.export_data.empty()) {
    const Episodes e = simulate_episodes(cfg.episodes, cfg.episode_length, cfg.cameras, cfg.camera_size, cfg.data_seed);
    write_episodes(e, cfg.export_data);
    std::printf("train_policy: wrote %lld episodes (%lld frames, %zu camera(s) of %lldx%lld) to %s\n",
                static_cast<long long>(cfg.episodes), static_cast<long long>(e.frames()), e.cameras.size(),
                static_cast<long long>(e.height), static_cast<long long>(e.width), cfg.export_data.c_str());
    return 0;
  }
  const ActRun run = prepare_act(cfg);
  auto world = examples::init_world(cfg);
  const dtrain::models::ActConfig& a = run.config;
  if (world.rank() == 0)
    std::printf(
        "train_policy: %d rank(s), policy=act strategy=%s device=%s precision=%s accumulate=%d batch=%lld/rank, "
        "%lld samples (%lld held out) from %s, %zu camera(s) %lldx%lld, state %lld, action chunk %lld x %lld, "
        "dim_model %lld, %lld+%lld layers, vae=%s\n",
        world.size(), cfg.strategy.c_str(), cfg.device.c_str(), cfg.precision.c_str(), cfg.accumulate,
        static_cast<long long>(cfg.batch_size), static_cast<long long>(run.train.size()),
        static_cast<long long>(run.held_out.size()), cfg.data.empty() ? "the simulator" : cfg.data.c_str(),
        a.cameras.size(), static_cast<long long>(a.image_height), static_cast<long long>(a.image_width),
        static_cast<long long>(a.state_dim), static_cast<long long>(a.chunk_size), static_cast<long long>(a.action_dim),
        static_cast<long long>(a.dim_model), static_cast<long long>(a.n_encoder_layers),
        static_cast<long long>(a.n_decoder_layers), a.use_vae ? "on" : "off");
  if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
    return train_act_cuda(cfg, world, run);
#else
    throw dtrain::config_error("this train_policy was built without CUDA", "use device=host, or rebuild with CUDA");
#endif
  }
  return train_act_host(cfg, world, run);
}

}  // namespace
}  // namespace policy

int main(int argc, char** argv) {
  try {
    const auto cfg = examples::parse_cli<policy::Config>(argc, argv, "train_policy", policy::usage,
                                                         policy::declare_extra, policy::validate_extra);
    if (cfg.policy == "act") return policy::run_act(cfg);
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
