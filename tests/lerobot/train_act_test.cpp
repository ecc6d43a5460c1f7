// train_policy policy=act (examples/policy) as real processes under
// dtrain-run, on 2 CPU ranks:
//  - from scratch on the arm simulator's camera images (the preset, 60
//    steps): the held-out action L1 beats predicting the mean chunk, and save_lerobot= writes a
//    directory LeRobot 0.4 loads (ACTPolicy.from_pretrained and its
//    processors) whose predicted chunks are finite;
//  - LeRobot -> dtrain -> LeRobot: a policy made by LeRobot (model=), fine-tuned
//    and saved, loads in LeRobot and predicts other chunks than before;
//  - every strategy, precision and accumulation runs (a few steps each);
//  - a LeRobot dataset (LeRobotDataset.create) exported by
//    export_lerobot_dataset.py trains;
//  - the refusals, each one line with its fix, exit 2, nothing written:
//    images of another size or count than the policy's, another state size,
//    a chunk longer than every episode, an unsupported policy type, an
//    unknown config key; and recorded episodes read back as written.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "examples/run_example.hpp"
#include "hf/run_logged.hpp"
#include "support/pinned_main.hpp"
#include "support/python_venv.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/io/safetensors.hpp>

namespace fs = std::filesystem;
using namespace dtrain::test;

namespace {

const std::string program = TRAIN_POLICY_PATH;
const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/tests/lerobot/lerobot_act.py";
const std::string preset = std::string(DTRAIN_SOURCE_DIR) + "/examples/configs/act_host.yaml";
// A small run of the preset: fewer episodes, two layers of width 64.
const std::string small = "--config " + preset +
                          " episodes=30 episode_length=30 dim_model=64 dim_feedforward=128 n_vae_encoder_layers=1 "
                          "n_encoder_layers=1 latent_dim=8 log_every=20 num_workers=0";

int python(const std::string& args, const fs::path& log) {
  return dtrain::testing::run_logged(
      "OPENBLAS_NUM_THREADS=1 " + dtrain::testing::pinned_python("lerobot") + " " + script + " " + args, log);
}

// The value after `key` in the log's line starting with `prefix`.
double value_after(const std::string& log, const std::string& prefix, const std::string& key) {
  const auto line = log.find(prefix);
  BOOST_TEST_REQUIRE(line != std::string::npos, "no \"" << prefix << "\" in:\n" << log);
  const auto at = log.find(key, line);
  BOOST_TEST_REQUIRE(at != std::string::npos);
  return std::stod(log.substr(at + key.size()));
}

// A LeRobot-made policy the simulator's data fits: one 64 x 64 camera, state 4, action 2.
fs::path lerobot_policy() {
  const fs::path dir = scratch("lerobot");
  if (fs::exists(dir / "policy/config.json")) return dir;
  fs::create_directories(dir);
  BOOST_TEST_REQUIRE(python("make " + (dir / "policy").string() +
                                " --seed 3 --use-vae 1 --pre-norm 0 --batch 4 --height 64 --width 64 --cameras 1 "
                                "--steps 1 --state-dim 4",
                            dir / "make.log") == 0,
                     read_file(dir / "make.log"));
  return dir;
}

}  // namespace

BOOST_AUTO_TEST_CASE(learns_from_the_simulator_and_saves_for_lerobot) {
  const fs::path out = fresh("act");
  // the preset's model on 40 episodes, 60 steps (about 45 s on 2 cores)
  BOOST_TEST_REQUIRE(
      run_example(
          program, 2,
          "--config " + preset + " episodes=40 steps=60 log_every=20 num_workers=0 save_lerobot=" + out.string()) == 0,
      last_log());
  const std::string log = last_log();
  const double l1 = value_after(log, "eval: held-out action L1", "L1 ");
  const double baseline = value_after(log, "eval: held-out action L1", "mean chunk: ");
  std::printf("train_policy policy=act, 2 ranks, 60 steps: held-out L1 %.4f, mean chunk %.4f\n", l1, baseline);
  BOOST_TEST(l1 < baseline, "held-out L1 " << l1 << " does not beat the mean chunk " << baseline);
  for (const char* f : {"config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"})
    BOOST_TEST(fs::exists(out / f), f);
  const fs::path policy = lerobot_policy();
  BOOST_TEST_REQUIRE(python("predict " + out.string() + " " + (policy / "policy/batch.safetensors").string() + " " +
                                (out.string() + ".predict.safetensors"),
                            scratch("predict.log")) == 0,
                     read_file(scratch("predict.log")));
  BOOST_TEST(read_file(scratch("predict.log")).find("processors: ok") != std::string::npos,
             read_file(scratch("predict.log")));
  for (const float v : dtrain::SafetensorsFile::open(out.string() + ".predict.safetensors").read_f32("actions"))
    BOOST_TEST_REQUIRE(std::isfinite(v));
}

BOOST_AUTO_TEST_CASE(lerobot_to_dtrain_to_lerobot) {
  const fs::path policy = lerobot_policy();
  const fs::path out = fresh("tuned");
  BOOST_TEST_REQUIRE(run_example(program, 2,
                                 small + " steps=3 strategy=fsdp-full model=" + (policy / "policy").string() +
                                     " save_lerobot=" + out.string()) == 0,
                     last_log());
  BOOST_TEST(last_log().find("normaliser: the policy's") != std::string::npos, last_log());
  const std::string batch = (policy / "policy/batch.safetensors").string();
  BOOST_TEST_REQUIRE(
      python("predict " + (policy / "policy").string() + " " + batch + " " + scratch("before.safetensors").string(),
             scratch("before.log")) == 0,
      read_file(scratch("before.log")));
  BOOST_TEST_REQUIRE(python("predict " + out.string() + " " + batch + " " + scratch("after.safetensors").string(),
                            scratch("after.log")) == 0,
                     read_file(scratch("after.log")));
  BOOST_TEST(read_file(scratch("after.log")).find("processors: ok") != std::string::npos);
  const auto before = dtrain::SafetensorsFile::open(scratch("before.safetensors")).read_f32("actions");
  const auto after = dtrain::SafetensorsFile::open(scratch("after.safetensors")).read_f32("actions");
  BOOST_TEST_REQUIRE(before.size() == after.size());
  double moved = 0;
  for (std::size_t i = 0; i < before.size(); ++i) moved = std::max(moved, double(std::abs(before[i] - after[i])));
  BOOST_TEST(moved > 1e-4, "3 steps of fine-tuning changed no prediction");
}

BOOST_AUTO_TEST_CASE(every_strategy_precision_and_accumulation_runs) {
  for (const std::string run : {"strategy=fsdp-full precision=bf16 accumulate=2", "strategy=zero1 precision=fp16",
                                "strategy=fsdp-grad-op accumulate=2 activation_checkpointing=true"}) {
    BOOST_TEST(run_example(program, 2, small + " steps=2 episodes=12 " + run) == 0, run << ":\n" << last_log());
    BOOST_TEST(last_log().find("eval: held-out action L1") != std::string::npos, run);
  }
}

BOOST_AUTO_TEST_CASE(recorded_episodes_train_as_the_simulators) {
  const fs::path file = fresh("episodes.safetensors");
  BOOST_TEST_REQUIRE(run_example(program, 1, small + " cameras=2 episodes=6 export_data=" + file.string()) == 0,
                     last_log());
  const auto f = dtrain::SafetensorsFile::open(file);
  BOOST_TEST(f.tensor("observation.images.wrist").shape == (std::vector<std::int64_t>{180, 3, 64, 64}));
  BOOST_TEST_REQUIRE(run_example(program, 2, small + " steps=2 data=" + file.string()) == 0, last_log());
  BOOST_TEST(last_log().find("2 camera(s) 64x64") != std::string::npos, last_log());
}

// A LeRobot dataset (made by LeRobot's own LeRobotDataset) exported by
// examples/policy/export_lerobot_dataset.py trains.
BOOST_AUTO_TEST_CASE(a_lerobot_dataset_exports_and_trains) {
  const fs::path root = fresh("dataset"), file = fresh("exported.safetensors");
  BOOST_TEST_REQUIRE(
      python("dataset " + root.string() + " --episodes 3 --frames 12 --size 32", scratch("dataset.log")) == 0,
      read_file(scratch("dataset.log")));
  const std::string exporter = std::string(DTRAIN_SOURCE_DIR) + "/examples/policy/export_lerobot_dataset.py";
  BOOST_TEST_REQUIRE(dtrain::testing::run_logged("OPENBLAS_NUM_THREADS=1 " + dtrain::testing::pinned_python("lerobot") +
                                                     " " + exporter + " " + root.string() + " " + file.string(),
                                                 scratch("export.log")) == 0,
                     read_file(scratch("export.log")));
  const auto f = dtrain::SafetensorsFile::open(file);
  BOOST_TEST(f.tensor("observation.images.top").shape == (std::vector<std::int64_t>{36, 3, 32, 32}));
  BOOST_TEST(f.read_i64("episode_index").back() == 2);
  BOOST_TEST_REQUIRE(run_example(program, 2, small + " steps=2 horizon=5 data=" + file.string()) == 0, last_log());
  BOOST_TEST(last_log().find("from " + file.string() + ", 1 camera(s) 32x32") != std::string::npos, last_log());
}

namespace {
// The run must fail with exit 2, one line saying `says`, and write nothing.
void refused(const std::string& args, const std::string& says) {
  const fs::path out = fresh("refused");
  BOOST_TEST(run_example(program, 1, small + " steps=2 save_lerobot=" + out.string() + " " + args) == 2,
             args << ":\n"
                  << last_log());
  BOOST_TEST(last_log().find(says) != std::string::npos, args << ": no \"" << says << "\" in:\n" << last_log());
  BOOST_TEST(!fs::exists(out), args << " wrote " << out);
}

fs::path edited_policy(const std::string& name, const std::string& from, const std::string& to) {
  const fs::path src = lerobot_policy() / "policy", dir = fresh(name);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src)) fs::copy(e.path(), dir / e.path().filename());
  std::string text = read_file(dir / "config.json");
  const auto at = text.find(from);
  BOOST_TEST_REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << text;
  return dir;
}
}  // namespace

BOOST_AUTO_TEST_CASE(refusals_name_the_problem_and_write_nothing) {
  const std::string model = "model=" + (lerobot_policy() / "policy").string();
  refused(model + " camera_size=96", "the policy takes 64x64 images, the data's are 96x96");
  refused(model + " cameras=2", "the policy's cameras (observation.images.top) are not the data's");
  refused("model=" +
              edited_policy("state", "\"shape\": [\n                4\n", "\"shape\": [\n                3\n").string(),
          "the policy's state has 3 values, the data's 4");
  refused("horizon=50 episode_length=30", "chunk_size 50 is longer than every episode (30 frames at most)");
  refused("model=" + edited_policy("type", "\"type\": \"act\"", "\"type\": \"diffusion\"").string(),
          "policy type \"diffusion\" is not supported (supported: act)");
  refused("model=" + edited_policy("key", "\"type\": \"act\"", "\"type\": \"act\", \"use_flux\": true").string(),
          "unknown key \"use_flux\"");
}

// Skipped with the fixture that makes the pinned set's venv when it cannot be installed here.
int main(int argc, char* argv[]) { return dtrain::testing::main_needing_set("lerobot", argc, argv); }
