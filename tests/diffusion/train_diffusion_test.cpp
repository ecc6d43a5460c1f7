// train_diffusion (examples/diffusion) as real processes under dtrain-run,
// on 2 CPU ranks, over a tiny Stable Diffusion pipeline diffusers makes
// (diffusers_pipeline.py: random VAE, CLIP text encoder and UNet; 20
// captioned 32 x 32 images of stripes), cached by
// examples/diffusion/cache_latents.py with diffusers and transformers:
//  - LoRA with the preset (DDP): the held-out loss after 40 steps is below
//    the one before training, and the adapters save_lora= writes load in
//    diffusers' StableDiffusionPipeline.load_lora_weights and change what it
//    samples;
//  - a full fine-tune under FSDP FullShard with bf16 compute and
//    save_diffusers=: UNet2DConditionModel.from_pretrained loads it and its
//    prediction is finite and moved;
//  - resuming draws the same: 6 steps in one run and 3 + 3 resumed from a
//    checkpoint give the same losses (the draws are a function of seed,
//    epoch and record), and the same EMA of the adapters (ema_decay=, saved
//    in the checkpoint, continued, written beside the adapters in ema/);
//  - the held-out loss uses the records' own noise and timesteps where they
//    carry them (the same for any seed), draws at a fixed epoch otherwise;
//  - the refusals, each one line with its fix, exit 2, nothing written:
//    latents of other channels or of a size the UNet cannot halve, text of
//    another width, SDXL's pooled and time_ids for an SD UNet, an objective
//    the scheduler config contradicts, an unsupported diffusers class.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "examples/run_example.hpp"
#include "hf/run_logged.hpp"
#include "support/pinned_main.hpp"
#include "support/python_venv.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/io/safetensors.hpp>

namespace fs = std::filesystem;
using namespace dtrain::test;

namespace {

const std::string program = TRAIN_DIFFUSION_PATH;
const std::string preset = std::string(DTRAIN_SOURCE_DIR) + "/examples/configs/diffusion_lora_host.yaml";
const std::string cache = std::string(DTRAIN_SOURCE_DIR) + "/examples/diffusion/cache_latents.py";
const std::string pipeline_script = std::string(DTRAIN_SOURCE_DIR) + "/tests/diffusion/diffusers_pipeline.py";

int python(const std::string& script, const std::string& args, const fs::path& log) {
  return dtrain::testing::run_logged(
      "OPENBLAS_NUM_THREADS=1 " + dtrain::testing::pinned_python("torch2") + " " + script + " " + args, log);
}

// The tiny pipeline and its cached records (with draws: records_draws), made once.
const fs::path& tiny() {
  static const fs::path dir = [] {
    const fs::path d = fresh("tiny");
    fs::create_directories(d);
    BOOST_TEST_REQUIRE(python(pipeline_script, "make " + d.string(), d / "make.log") == 0, read_file(d / "make.log"));
    const std::string images = (d / "pipeline").string() + " " + (d / "images").string() + " ";
    BOOST_TEST_REQUIRE(
        python(cache, images + (d / "records.safetensors").string() + " --resolution 32", d / "cache.log") == 0,
        read_file(d / "cache.log"));
    BOOST_TEST_REQUIRE(
        python(cache, images + (d / "records_draws.safetensors").string() + " --resolution 32 --with-draws --seed 4",
               d / "cache_draws.log") == 0,
        read_file(d / "cache_draws.log"));
    return d;
  }();
  return dir;
}

// The preset on the tiny pipeline (rank-4 adapters: its attention is 16 wide).
std::string base_args(const std::string& records = "records.safetensors", const std::string& model = "") {
  return "--config " + preset + " model=" + (model.empty() ? (tiny() / "pipeline").string() : model) +
         " data=" + (records.find('/') == std::string::npos ? (tiny() / records).string() : records) +
         " lora_r=4 lora_alpha=4 num_workers=0 log_every=10";
}

// The value after `key` on the first line of the log starting with `prefix`.
double value_after(const std::string& log, const std::string& prefix, const std::string& key) {
  const auto line = log.find(prefix);
  BOOST_TEST_REQUIRE(line != std::string::npos, "no \"" << prefix << "\" in:\n" << log);
  const auto at = log.find(key, line);
  BOOST_TEST_REQUIRE(at != std::string::npos);
  return std::stod(log.substr(at + key.size()));
}

}  // namespace

BOOST_AUTO_TEST_CASE(lora_learns_and_diffusers_loads_it) {
  const fs::path out = fresh("lora");
  BOOST_TEST_REQUIRE(run_example(program, 2, base_args() + " steps=40 lr=0.003 save_lora=" + out.string()) == 0,
                     last_log());
  const std::string log = last_log();
  const double before = value_after(log, "eval (before training): held-out loss", "loss ");
  const double after = value_after(log, "eval: held-out loss", "loss ");
  std::printf("train_diffusion LoRA r=4, 2 ranks, 40 steps: held-out loss %.5f -> %.5f\n", before, after);
  BOOST_TEST(after < before, log);
  BOOST_TEST_REQUIRE(fs::exists(out / "pytorch_lora_weights.safetensors"));
  const fs::path sampled = scratch("sampled.safetensors");
  BOOST_TEST_REQUIRE(python(pipeline_script, "sample " + tiny().string() + " " + out.string() + " " + sampled.string(),
                            scratch("sample.log")) == 0,
                     read_file(scratch("sample.log")));
  const dtrain::SafetensorsFile f = dtrain::SafetensorsFile::open(sampled);
  const std::vector<float> with = f.read_f32("with"), without = f.read_f32("without");
  double moved = 0;
  for (std::size_t i = 0; i < with.size(); ++i) {
    BOOST_TEST_REQUIRE(std::isfinite(with[i]));
    moved = std::max(moved, double(std::abs(with[i] - without[i])));
  }
  std::printf("diffusers' pipeline with the adapters: the sample moves by %.4f\n", moved);
  BOOST_TEST(moved > 1e-4, "the adapters change what the pipeline samples");
}

BOOST_AUTO_TEST_CASE(full_fine_tune_saves_for_diffusers) {
  const fs::path out = fresh("full");
  BOOST_TEST_REQUIRE(
      run_example(program, 2,
                  "model=" + (tiny() / "pipeline").string() + " data=" + (tiny() / "records.safetensors").string() +
                      " batch_size=4 steps=4 lr=0.001 eval_batches=1 num_workers=0 strategy=fsdp-full "
                      "precision=bf16 save_diffusers=" +
                      out.string()) == 0,
      last_log());
  BOOST_TEST(fs::exists(out / "diffusion_pytorch_model.safetensors"));
  const std::string unet_script = std::string(DTRAIN_SOURCE_DIR) + "/tests/diffusion/diffusers_unet.py";
  const std::string inputs = (tiny() / "records_draws.safetensors").string();
  const fs::path a = scratch("base_pred.safetensors"), b = scratch("tuned_pred.safetensors");
  BOOST_TEST_REQUIRE(
      python(unet_script, "predict " + (tiny() / "pipeline/unet").string() + " " + inputs + " " + a.string(),
             scratch("p1.log")) == 0,
      read_file(scratch("p1.log")));
  BOOST_TEST_REQUIRE(
      python(unet_script, "predict " + out.string() + " " + inputs + " " + b.string(), scratch("p2.log")) == 0,
      read_file(scratch("p2.log")));
  const std::vector<float> before = dtrain::SafetensorsFile::open(a).read_f32("pred");
  const std::vector<float> after = dtrain::SafetensorsFile::open(b).read_f32("pred");
  double moved = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    BOOST_TEST_REQUIRE(std::isfinite(after[i]));
    moved = std::max(moved, double(std::abs(after[i] - before[i])));
  }
  BOOST_TEST(moved > 1e-4, "the fine-tune changed the UNet diffusers loads");
}

BOOST_AUTO_TEST_CASE(a_resumed_run_draws_the_same) {
  const fs::path one = fresh("one.jsonl"), two = fresh("two.jsonl"), ckpt = fresh("ckpt");
  const fs::path lora_one = fresh("lora_one"), lora_two = fresh("lora_two");
  // a constant rate: the schedule of a run of 3 steps is the first half of a run of 6; an EMA every 2nd step
  const std::string common =
      base_args() + " eval_batches=0 lr=0.003 schedule=constant warmup_steps=0 ema_decay=0.5 ema_every=2";
  const std::string args = common + " checkpoint_dir=" + ckpt.string();
  BOOST_TEST_REQUIRE(
      run_example(program, 2,
                  common + " steps=6 log_every=1 metrics=" + one.string() + " save_lora=" + lora_one.string()) == 0,
      last_log());
  BOOST_TEST_REQUIRE(run_example(program, 2, args + " steps=3 save_every=3") == 0, last_log());
  for (const auto& dir : fs::directory_iterator(ckpt))
    BOOST_TEST(fs::exists(dir.path() / "ema.safetensors"), dir.path());
  BOOST_TEST_REQUIRE(run_example(program, 2,
                                 args + " steps=6 save_every=3 resume=latest log_every=1 metrics=" + two.string() +
                                     " save_lora=" + lora_two.string()) == 0,
                     last_log());
  BOOST_TEST(last_log().find("ema: continued from") != std::string::npos, last_log());
  const std::vector<double> all = losses(one), resumed = losses(two);
  BOOST_TEST_REQUIRE(all.size() == 6u);
  BOOST_TEST_REQUIRE(resumed.size() == 3u);
  for (std::size_t i = 0; i < 3; ++i)
    BOOST_TEST(resumed[i] == all[i + 3], "step " << i + 4 << ": " << resumed[i] << " resumed, " << all[i + 3]);
  // the EMA of the adapters, saved beside them, the same whether the run was resumed or not
  const auto a = dtrain::SafetensorsFile::open(lora_one / "ema" / "pytorch_lora_weights.safetensors");
  const auto b = dtrain::SafetensorsFile::open(lora_two / "ema" / "pytorch_lora_weights.safetensors");
  BOOST_TEST_REQUIRE(a.names() == b.names());
  for (const auto& n : a.names()) BOOST_TEST(a.read_f32(n) == b.read_f32(n), n);
  const auto trained = dtrain::SafetensorsFile::open(lora_one / "pytorch_lora_weights.safetensors");
  bool differs = false;
  for (const auto& n : a.names()) differs = differs || a.read_f32(n) != trained.read_f32(n);
  BOOST_TEST(differs, "the EMA is not the last weights");
}

BOOST_AUTO_TEST_CASE(held_out_loss_uses_the_records_own_draws) {
  const auto before = [&](const std::string& records, int seed) {
    BOOST_TEST_REQUIRE(
        run_example(program, 2,
                    base_args(records) + " steps=1 schedule=constant warmup_steps=0 seed=" + std::to_string(seed)) == 0,
        last_log());
    return value_after(last_log(), "eval (before training): held-out loss", "loss ");
  };
  BOOST_TEST(before("records_draws.safetensors", 1) == before("records_draws.safetensors", 2));
  BOOST_TEST(before("records.safetensors", 1) != before("records.safetensors", 2));
}

BOOST_AUTO_TEST_CASE(refusals) {
  const fs::path dir = fresh("bad");
  fs::create_directories(dir);
  const auto records = [&](const std::string& name, std::vector<std::int64_t> latents, std::int64_t width,
                           bool sdxl = false) {
    dtrain::SafetensorsWriter w;
    std::int64_t n = 1;
    for (const auto d : latents) n *= d;
    static std::vector<std::vector<float>> kept;
    kept.emplace_back(static_cast<std::size_t>(n), 0.5f);
    w.add("latents", latents, kept.back());
    kept.emplace_back(static_cast<std::size_t>(latents[0] * 12 * width), 0.25f);
    w.add("encoder_hidden_states", {latents[0], 12, width}, kept.back());
    if (sdxl) {  // SDXL's added conditioning, which an SD UNet has not
      kept.emplace_back(static_cast<std::size_t>(latents[0] * 16), 0.125f);
      w.add("pooled", {latents[0], 16}, kept.back());
      kept.emplace_back(static_cast<std::size_t>(latents[0] * 6), 32.f);
      w.add("time_ids", {latents[0], 6}, kept.back());
    }
    w.write(dir / name);
    return (dir / name).string();
  };
  const fs::path out = dir / "lora";
  const auto refused = [&](const std::string& args, const std::string& says) {
    const int status = run_example(program, 2, args + " steps=2 save_lora=" + out.string());
    BOOST_TEST(status == 2, args << ": exit " << status << "\n" << last_log());
    BOOST_TEST(last_log().find(says) != std::string::npos, args << ":\n" << last_log());
    BOOST_TEST(!fs::exists(out), "nothing written");
  };
  refused(base_args(records("channels.safetensors", {4, 3, 16, 16}, 24)), "latents of 3 channels");
  refused(base_args(records("odd.safetensors", {4, 4, 15, 15}, 24)), "divide by 2");
  refused(base_args(records("width.safetensors", {4, 4, 16, 16}, 16)), "encoder_hidden_states are 16 wide");
  refused(base_args(records("sdxl.safetensors", {4, 4, 16, 16}, 24, true)), "which the UNet in");
  refused(base_args() + " objective=v", "objective=v, but the scheduler config");
  // a UNet folder whose config names another diffusers class
  const fs::path other = dir / "unet2d";
  fs::create_directories(other);
  fs::copy(tiny() / "pipeline/unet", other, fs::copy_options::recursive);
  std::string config = read_file(other / "config.json");
  config.replace(config.find("UNet2DConditionModel"), 20, "UNet2DModel");
  std::ofstream(other / "config.json") << config;
  refused(base_args("records.safetensors", other.string()), "_class_name \"UNet2DModel\" is not supported");
}

int main(int argc, char* argv[]) { return dtrain::testing::main_needing_set("torch2", argc, argv); }
