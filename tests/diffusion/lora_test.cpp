// LoRA on models::UNet2DCondition (diffusion/lora.hpp) against diffusers
// 0.42.1 and PEFT 0.21.2 themselves (the pinned torch2 set;
// diffusers_lora.py), on the tiny SD- and SDXL-shaped UNets of
// diffusers_unet.py, adapters of rank 2 and alpha 3 on SD's usual targets
// (to_q, to_k, to_v, to_out.0 of both attentions: attn2's k and v read the
// text) and, for SDXL, the feed-forward and the linear proj_in/proj_out too:
//  - adapters PEFT made, in diffusers' pipeline file (save_lora_weights)
//    and in PEFT's own folder (save_pretrained), load into dtrain with their
//    config (rank, alpha, targets) and predict within 1e-5 of the largest
//    element of diffusers' float64 prediction, at one rank and at two under
//    FSDP FullShard;
//  - the first step: the loss within 1e-5 (relative) and each adapter's
//    gradient (one SGD step, lr 1) within 1e-5 of the largest; the base
//    weights do not move;
//  - 20 AdamW steps (lr 1e-3) over the adapters at one rank and at two under
//    DDP and FSDP FullShard: losses within 2e-3 (relative) of PEFT's float64
//    run, adapters within 1e-4 of PEFT's and of each other; the adapters PEFT
//    trained, saved by save_lora_weights, load into dtrain and predict like
//    PEFT's trained model (within 1e-5);
//  - adapters trained by dtrain at two ranks (FSDP) and saved by save_lora
//    load in diffusers (load_lora_adapter, prefix "unet") and predict like
//    dtrain; the same model saved whole by save_diffusers (adapters merged)
//    loads with from_pretrained alone and predicts the same;
//  - refusals: targets that match nothing dtrain adapts, all-linear, a 1x1
//    convolution proj_in, a projection adapted in some of a block's
//    transformer layers only, text-encoder adapters and older names in a
//    file.
// Measured (SD / SDXL): predictions within 4.8e-7 of 1.26 / 1.5e-6 of 1.87
// (the adapters move them by 0.18 / 1.16); first-step loss equal to 8
// digits / 1e-7, adapter gradients within 4.9e-8 of 1.1e-2 / 6.0e-8 of
// 0.21; 20 AdamW steps: losses within 1.9e-7, adapters 5.7e-7 / 1.7e-5 from
// PEFT's and 6.2e-7 / 2.2e-6 between DDP or FSDP x2 and x1; PEFT's trained
// adapters in dtrain 4.2e-7 / 6.3e-7; dtrain's saves in diffusers 4.8e-7 /
// 1.1e-6, merged 5.4e-7 / 1.1e-6.
// Skipped (77) where the torch2 set cannot be installed.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "diffusion/unet_fixture.hpp"
#include "support/pinned_main.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/diffusion/lora.hpp>

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::testing;
using namespace dtrain::testing::unet;

namespace {

const fs::path root = fs::path(DTRAIN_TEST_BINARY_DIR) / "lora";

// The UNet of `kind` with PEFT's adapters (diffusers_lora.py make), once.
const fs::path& with_lora(const std::string& kind) {
  static std::map<std::string, bool> done;
  const fs::path& dir = made(kind, root);
  if (!done[kind]) {
    run_python("diffusers_lora.py", "make " + dir.string() + " " + kind, dir / "lora_make.log");
    done[kind] = true;
  }
  return dir;
}

struct Model {
  models::UNetConfig config;
  hf::LoraConfig lora;
};

Model model_of(const fs::path& dir, const fs::path& lora_dir) {
  return {config_of(dir, SafetensorsFile::open(dir / "inputs.safetensors")), diffusion::read_lora_config(lora_dir)};
}

// The base from dir/unet and the adapters from `lora_dir`, into a trainer.
template <class Trainer>
void load(Trainer& t, const fs::path& dir, const fs::path& lora_dir, const models::UNet2DCondition& model) {
  const LoadParamsReport base = diffusion::load_diffusers(t, dir / "unet", model);
  require(base.missing.empty() && base.unexpected.empty(), "the base loads whole");
  const LoadParamsReport r = diffusion::load_lora(t, lora_dir, model);
  require(r.missing.empty() && r.unexpected.empty() && r.mismatched.empty() && !r.loaded.empty(),
          "every adapter loads");
}

template <class Kind>
std::vector<float> predict(const fs::path& dir, const fs::path& lora_dir, int ranks) {
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  const Model m = model_of(dir, lora_dir);
  return predict_with<Kind>(
      ranks, batch_of(in, 0, 2), [&] { return models::UNet2DCondition(m.config, m.lora); },
      [&](auto& t, const auto& model) { load(t, dir, lora_dir, model); });
}

void loads_peft_adapters(const std::string& kind) {
  const fs::path& dir = with_lora(kind);
  const hf::LoraConfig c = diffusion::read_lora_config(dir / "lora");
  BOOST_TEST(c.r == 2);
  BOOST_TEST(c.alpha == 3.f);
  BOOST_TEST(c.targets.size() == (kind == "sd" ? 4u : 8u));
  const hf::LoraConfig peft = diffusion::read_lora_config(dir / "lora_peft");
  BOOST_TEST((peft.r == c.r && peft.alpha == c.alpha && peft.targets == c.targets));
  const std::vector<float> want = SafetensorsFile::open(dir / "lora_expected.safetensors").read_f32("pred");
  const std::vector<float> base = SafetensorsFile::open(dir / "expected.safetensors").read_f32("pred");
  const double scale = max_abs(want);
  const double one = worst_difference(predict<DDP>(dir, dir / "lora", 1), want);
  const double two = worst_difference(predict<FSDP<FullShard>>(dir, dir / "lora", 2), want);
  const double from_peft = worst_difference(predict<DDP>(dir, dir / "lora_peft", 1), want);
  std::printf(
      "%s UNet + PEFT's LoRA: prediction within %.2e (1 rank), %.2e (FSDP, 2 ranks), %.2e (PEFT's folder) of "
      "diffusers' (largest %.3f; the adapters move it by %.3f)\n",
      kind.c_str(), one, two, from_peft, scale, worst_difference(want, base));
  BOOST_TEST(worst_difference(want, base) > 1e-2, "the adapters change the prediction");
  BOOST_TEST(one <= tolerance * scale);
  BOOST_TEST(two <= tolerance * scale);
  BOOST_TEST(from_peft <= tolerance * scale);
}

void first_step_like_peft(const std::string& kind) {
  const fs::path& dir = with_lora(kind);
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  const SafetensorsFile ref = SafetensorsFile::open(dir / "lora_expected.safetensors");
  const Model m = model_of(dir, dir / "lora");
  Values before, after;
  StepStats stats;
  std::map<std::string, std::string> names;
  run_ranks(1, [&](World& w) {
    models::UNet2DCondition model(m.config, m.lora);
    names = diffusion::lora_names(model);
    Trainer<models::UNet2DCondition> t(w, model, SGD{.lr = 1.f});
    load(t, dir, dir / "lora", model);
    before = t.parameters();
    stats = t.step(std::vector<Batch>{batch_of(in, 0, 2)});
    after = t.parameters();
  });
  const double loss = ref.read_f32("loss").at(0);
  BOOST_TEST(std::abs(stats.loss - loss) <= tolerance * std::abs(loss),
             kind << ": loss " << stats.loss << " vs " << loss);
  double scale = 0, worst = 0, frozen = 0;
  for (const auto& [ours, theirs] : names) scale = std::max(scale, max_abs(ref.read_f32("grad." + theirs)));
  for (const auto& [ours, theirs] : names) {
    const std::vector<float> g = ref.read_f32("grad." + theirs);
    const std::vector<float>&b = before.at(ours), &a = after.at(ours);
    BOOST_TEST_REQUIRE(g.size() == b.size(), theirs);
    for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(double(b[i]) - a[i] - g[i]));
  }
  for (const auto& [name, values] : before)
    if (!names.contains(name)) frozen = std::max(frozen, worst_difference(after.at(name), values));
  std::printf("%s UNet LoRA: loss %.8f vs PEFT %.8f; %zu adapters, gradients within %.3e of PEFT's (largest %.3e)\n",
              kind.c_str(), stats.loss, loss, names.size(), worst, scale);
  BOOST_TEST(names.size() == ref.names().size() - 2);  // every adapter PEFT has (beside pred and loss)
  BOOST_TEST(worst <= tolerance * scale);
  BOOST_TEST(frozen == 0.0, "the base weights are frozen");
}

// The adapters after `adamw_count` AdamW steps at `ranks` ranks under Kind.
template <class Kind>
Values adamw_steps(const fs::path& dir, int ranks, std::vector<double>* losses = nullptr) {
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  const Model m = model_of(dir, dir / "lora");
  const Values all = adamw_with<Kind>(
      ranks, [&] { return models::UNet2DCondition(m.config, m.lora); },
      [&](auto& t, const auto& model) { load(t, dir, dir / "lora", model); },
      [&](std::int64_t first, std::int64_t n) { return batch_of(in, first, n); }, losses);
  Values out;
  if (!all.empty())
    for (const auto& [ours, theirs] : diffusion::lora_names(models::UNet2DCondition(m.config, m.lora)))
      out[ours] = all.at(ours);
  return out;
}

void trains_like_peft(const std::string& kind) {
  const fs::path& dir = with_lora(kind);
  run_python("diffusers_lora.py",
             "train " + dir.string() + " " + std::to_string(adamw_count) + " " + std::to_string(adamw_lr),
             dir / "lora_train.log");
  const SafetensorsFile ref = SafetensorsFile::open(dir / "lora_adamw.safetensors");
  std::vector<double> losses;
  const Values one = adamw_steps<DDP>(dir, 1, &losses), ddp = adamw_steps<DDP>(dir, 2),
               fsdp = adamw_steps<FSDP<FullShard>>(dir, 2);
  const std::vector<float> want = ref.read_f32("losses");
  BOOST_TEST_REQUIRE(losses.size() == want.size());
  double loss_gap = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    loss_gap = std::max(loss_gap, std::abs(losses[i] - want[i]) / std::abs(double(want[i])));
  Values theirs;
  const Model m = model_of(dir, dir / "lora");
  for (const auto& [ours, name] : diffusion::lora_names(models::UNet2DCondition(m.config, m.lora)))
    theirs[ours] = ref.read_f32("param." + name);
  const double vs_peft = params_apart(one, theirs), vs_ddp = params_apart(ddp, one), vs_fsdp = params_apart(fsdp, one);
  // PEFT's trained adapters, saved by save_lora_weights, into dtrain
  const std::vector<float> trained = ref.read_f32("pred");
  const double loaded = worst_difference(predict<DDP>(dir, dir / "lora_trained", 1), trained);
  std::printf(
      "%s UNet LoRA: %d AdamW steps: losses within %.2e (relative) of PEFT's (%.4f -> %.4f); adapters vs PEFT "
      "%.3e, DDP x2 vs x1 %.3e, FSDP x2 vs x1 %.3e (bound 1e-4); PEFT's trained adapters in dtrain predict "
      "within %.2e\n",
      kind.c_str(), adamw_count, loss_gap, want.front(), want.back(), vs_peft, vs_ddp, vs_fsdp, loaded);
  BOOST_TEST(loss_gap <= 2e-3);
  BOOST_TEST(want.back() < want.front(), "PEFT's loss fell");
  BOOST_TEST(vs_peft <= 1e-4);
  BOOST_TEST(vs_ddp <= 1e-4);
  BOOST_TEST(vs_fsdp <= 1e-4);
  BOOST_TEST(loaded <= tolerance * max_abs(trained));
}

void saved_lora_loads_in_diffusers(const std::string& kind) {
  const fs::path& dir = with_lora(kind);
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  const Model m = model_of(dir, dir / "lora");
  const fs::path saved = dir / "dtrain_lora", merged = dir / "dtrain_merged";
  fs::remove_all(saved);
  fs::remove_all(merged);
  std::vector<float> ours;
  run_ranks(2, [&](World& w) {
    models::UNet2DCondition model(m.config, m.lora);
    Trainer<models::UNet2DCondition, Strategy<FSDP<FullShard>>> t(w, model, AdamW{.lr = 1e-2f});
    load(t, dir, dir / "lora", model);
    for (int s = 0; s < 2; ++s) t.step(std::vector<Batch>{batch_of(in, w.rank(), 1)});
    diffusion::save_lora(t, saved, model);
    diffusion::save_diffusers(t, merged, model, read_text(dir / "unet/config.json"));
    std::vector<float> p = t.predict(batch_of(in, 0, 2));
    if (w.rank() == 0) ours = std::move(p);
  });
  BOOST_TEST_REQUIRE(fs::exists(saved / "pytorch_lora_weights.safetensors"));
  const hf::LoraConfig back = diffusion::read_lora_config(saved);
  BOOST_TEST((back.r == m.lora.r && back.alpha == m.lora.alpha && back.targets == m.lora.targets));
  const fs::path out = dir / "dtrain_lora_pred.safetensors", out_merged = dir / "dtrain_merged_pred.safetensors";
  run_python("diffusers_lora.py",
             "predict " + (dir / "unet").string() + " " + saved.string() + " " + (dir / "inputs.safetensors").string() +
                 " " + out.string(),
             dir / "lora_predict.log");
  run_script("predict " + merged.string() + " " + (dir / "inputs.safetensors").string() + " " + out_merged.string(),
             dir / "merged_predict.log");
  const std::vector<float> theirs = SafetensorsFile::open(out).read_f32("pred");
  const std::vector<float> fused = SafetensorsFile::open(out_merged).read_f32("pred");
  const std::vector<float> before = SafetensorsFile::open(dir / "lora_expected.safetensors").read_f32("pred");
  const double moved = worst_difference(ours, before), err = worst_difference(ours, theirs),
               err_fused = worst_difference(ours, fused);
  std::printf(
      "%s UNet LoRA trained at 2 ranks (FSDP) and saved: prediction moved %.2e; diffusers with the saved "
      "adapters differs by %.2e, the merged save by %.2e (largest %.3f)\n",
      kind.c_str(), moved, err, err_fused, max_abs(theirs));
  BOOST_TEST(moved > 1e-3, "training changed the adapters");
  BOOST_TEST(err <= tolerance * max_abs(theirs));
  BOOST_TEST(err_fused <= tolerance * max_abs(theirs));
}

}  // namespace

BOOST_AUTO_TEST_CASE(sd_loads_peft_adapters) { loads_peft_adapters("sd"); }
BOOST_AUTO_TEST_CASE(sdxl_loads_peft_adapters) { loads_peft_adapters("sdxl"); }
BOOST_AUTO_TEST_CASE(sd_first_step_like_peft) { first_step_like_peft("sd"); }
BOOST_AUTO_TEST_CASE(sdxl_first_step_like_peft) { first_step_like_peft("sdxl"); }
BOOST_AUTO_TEST_CASE(sd_trains_like_peft) { trains_like_peft("sd"); }
BOOST_AUTO_TEST_CASE(sdxl_trains_like_peft) { trains_like_peft("sdxl"); }
BOOST_AUTO_TEST_CASE(sd_saved_lora_loads_in_diffusers) { saved_lora_loads_in_diffusers("sd"); }
BOOST_AUTO_TEST_CASE(sdxl_saved_lora_loads_in_diffusers) { saved_lora_loads_in_diffusers("sdxl"); }

BOOST_AUTO_TEST_CASE(refusals) {
  const fs::path& sd = made("sd", root);
  const fs::path& sdxl = made("sdxl", root);
  const SafetensorsFile sd_in = SafetensorsFile::open(sd / "inputs.safetensors");
  const models::UNetConfig sd_config = config_of(sd, sd_in);
  const models::UNetConfig sdxl_config = config_of(sdxl, SafetensorsFile::open(sdxl / "inputs.safetensors"));
  const auto refused = [](const models::UNetConfig& c, std::vector<std::string> targets, const std::string& says) {
    try {
      models::UNet2DCondition m(c, hf::LoraConfig{.r = 2, .alpha = 2.f, .targets = std::move(targets)});
      BOOST_FAIL("accepted the targets");
    } catch (const config_error& e) {
      BOOST_TEST(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
  };
  refused(sd_config, {"to_q", "conv1"}, "\"conv1\" matches no projection");
  refused(sd_config, {"all-linear"}, "all-linear");
  refused(sd_config, {"proj_in"}, "1x1 convolution");
  refused(sdxl_config, {"transformer_blocks.1.attn1.to_q"}, "in 1 of");
  // files: text-encoder adapters, older names
  const fs::path dir = root / "bad_files";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto file_refused = [&](const std::string& name, const std::string& says) {
    SafetensorsWriter w;
    const std::vector<float> v(4, 1.f);
    w.add(name, {2, 2}, v);
    w.write(dir / "pytorch_lora_weights.safetensors");
    try {
      diffusion::read_lora_config(dir);
      BOOST_FAIL("accepted " << name);
    } catch (const config_error& e) {
      BOOST_TEST(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
  };
  file_refused("text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight", "text-encoder adapters");
  file_refused("unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.lora.down.weight", "older LoRA naming");
  file_refused("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight", "older LoRA naming");
  BOOST_CHECK_THROW(diffusion::read_lora_config(root / "no_such_folder"), checkpoint_error);
}

int main(int argc, char* argv[]) { return main_needing_set("torch2", argc, argv); }
