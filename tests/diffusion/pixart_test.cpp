// models::PixArt and diffusion/pixart.hpp against diffusers 0.42.1's
// PixArtTransformer2DModel itself (the pinned torch2 set;
// diffusers_pixart.py): a tiny random PixArt (two blocks of two heads of 8,
// patch 2, caption_channels 12, 4 latent channels and 8 out: a learned
// variance, interpolation_scale 2) loaded from the folder save_pretrained
// wrote, on latents 8 x 12 (wider than sample_size 8: the positions of a
// 4 x 6 grid) with a padded caption token mask:
//  - the prediction (all 8 channels) for the same latents, timesteps and
//    caption within 1e-5 of the largest element of diffusers' float64
//    prediction, at one rank and at two under FSDP FullShard;
//  - the first step's MSE loss (of the first 4 channels, as diffusers'
//    PixArt training scripts take it) within 1e-5 (relative) and every
//    parameter's gradient (one SGD step, lr 1) within 1e-5 of the largest
//    gradient;
//  - 20 AdamW steps (lr 1e-3, no weight decay) at one rank under DDP and at
//    two under DDP and FSDP FullShard: the losses before each step within
//    2e-3 (relative) of diffusers' float64 run's, every parameter within
//    1e-4 of diffusers' and of each other (a tenth of lr), but the
//    attentions' key biases, whose gradient is zero but for rounding (see
//    key_bias) and whose first-step gradient is checked with the others';
//  - the same SGD step with activation checkpointing (2 ranks, FSDP);
//  - models::PixArtLoss, with and without a learned variance, weighted,
//    against the prediction;
//  - a model trained two steps at two ranks (FSDP), saved by save_diffusers,
//    loaded by from_pretrained: diffusers' prediction within 1e-5 of
//    dtrain's;
//  - read_pixart_config's refusals.
// diffusers computes the timestep sinusoids in float32; the script gives it
// dtrain's float64 ones (see diffusers_pixart.py). Skipped (77) where the
// torch2 set cannot be installed.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "diffusion/unet_fixture.hpp"
#include "support/pinned_main.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/diffusion/pixart.hpp>

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::testing;
using dtrain::testing::unet::adamw_count;
using dtrain::testing::unet::adamw_lr;
using dtrain::testing::unet::adamw_with;
using dtrain::testing::unet::max_abs;
using dtrain::testing::unet::predict_with;
using dtrain::testing::unet::rows;
using dtrain::testing::unet::rows_of;
using dtrain::testing::unet::run_python;
using dtrain::testing::unet::tolerance;
using dtrain::testing::unet::Values;
using dtrain::testing::unet::worst_difference;

namespace {

const fs::path work = fs::path(DTRAIN_TEST_BINARY_DIR) / "pixart";

void run_script(const std::string& args, const fs::path& log) { run_python("diffusers_pixart.py", args, log); }

// The folder of the tiny PixArt, made once.
const fs::path& made() {
  static const fs::path dir = [] {
    const fs::path d = work / "model";
    fs::remove_all(d);
    fs::create_directories(d);
    run_script("make " + d.string(), d / "make.log");
    return d;
  }();
  return dir;
}

Batch batch_of(const SafetensorsFile& in, std::int64_t first, std::int64_t n) {
  Batch b;
  b.set("x", rows(in, "latents", first, n, true));
  b.set("y", rows(in, "target", first, n, true));
  b.set("timesteps", rows(in, "timesteps", first, n));
  b.set("encoder_hidden_states", rows(in, "encoder_hidden_states", first, n));
  b.set("encoder_attention_mask",
        rows_of(in.read_i64("encoder_attention_mask"), in.tensor("encoder_attention_mask").shape, first, n, false));
  return b;
}

// The folder's config for the inputs' latents and caption.
models::PixArtConfig config_of(const fs::path& dir, const SafetensorsFile& in) {
  models::PixArtConfig c = diffusion::read_pixart_config(dir / "transformer");
  const auto& latents = in.tensor("latents").shape;
  c.sample_height = latents.at(2);
  c.sample_width = latents.at(3);
  c.context_length = in.tensor("encoder_hidden_states").shape.at(1);
  return c;
}

// dtrain's prediction for the whole batch at `ranks` ranks under Kind.
template <class Kind>
std::vector<float> predict(const fs::path& dir, int ranks) {
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  return predict_with<Kind>(
      ranks, batch_of(in, 0, 2), [&] { return models::PixArt(config_of(dir, in)); },
      [&](auto& t, const auto& model) {
        const LoadParamsReport r = diffusion::load_diffusers(t, dir / "transformer", model);
        require(r.missing.empty() && r.unexpected.empty() && r.mismatched.empty(), "every tensor loads");
      });
}

// Parameters after `adamw_count` AdamW steps at `ranks` ranks under Kind on
// the inputs' batch (split over the ranks), and rank 0's losses.
template <class Kind>
Values adamw_steps(const fs::path& dir, int ranks, std::vector<double>* losses = nullptr) {
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  return adamw_with<Kind>(
      ranks, [&] { return models::PixArt(config_of(dir, in)); },
      [&](auto& t, const auto& model) { diffusion::load_diffusers(t, dir / "transformer", model); },
      [&](std::int64_t first, std::int64_t n) { return batch_of(in, first, n); }, losses);
}

// The attentions' key biases: a bias added to every key adds q . b to every
// score of a query, which the softmax takes away, so their gradient is zero
// but for rounding, and AdamW (whose step is about lr whatever the
// gradient's size) moves them by that noise's sign: by up to lr a step, and
// differently in every run. They change no prediction.
bool key_bias(const std::string& name) { return name.ends_with("to_k.bias"); }

// The largest difference between two runs' parameters but the key biases
// (printed with its tensor).
double params_apart(const Values& a, const Values& b, const char* what) {
  double w = 0;
  std::string at;
  for (const auto& [name, values] : a)
    if (const double d = key_bias(name) ? 0.0 : worst_difference(values, b.at(name)); d > w) {
      w = d;
      at = name;
    }
  std::printf("PixArt: %s: parameters apart by %.3e at %s\n", what, w, at.c_str());
  return w;
}

}  // namespace

BOOST_AUTO_TEST_CASE(predicts_like_diffusers) {
  const fs::path& dir = made();
  const std::vector<float> want = SafetensorsFile::open(dir / "expected.safetensors").read_f32("pred");
  const double scale = max_abs(want);
  const double one = worst_difference(predict<DDP>(dir, 1), want);
  const double two = worst_difference(predict<FSDP<FullShard>>(dir, 2), want);
  std::printf("PixArt: prediction within %.2e (1 rank), %.2e (FSDP, 2 ranks) of diffusers' (largest %.3f)\n", one, two,
              scale);
  BOOST_TEST(one <= tolerance * scale);
  BOOST_TEST(two <= tolerance * scale);
}

BOOST_AUTO_TEST_CASE(first_step_like_diffusers) {
  const fs::path& dir = made();
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  const SafetensorsFile ref = SafetensorsFile::open(dir / "expected.safetensors");
  const models::PixArtConfig config = config_of(dir, in);
  models::PixArt model(config);
  Values before, after;
  StepStats stats;
  run_ranks(1, [&](World& w) {
    models::PixArt mine = model;
    Trainer<models::PixArt> t(w, mine, SGD{.lr = 1.f});
    diffusion::load_diffusers(t, dir / "transformer", mine);
    before = t.parameters();
    stats = t.step(std::vector<Batch>{batch_of(in, 0, 2)});
    after = t.parameters();
  });
  const double loss = ref.read_f32("loss").at(0);
  BOOST_TEST(std::abs(stats.loss - loss) <= tolerance * std::abs(loss),
             "loss " << stats.loss << ", diffusers " << loss);
  const hf::TransformersNames names = diffusion::pixart_names(model);
  double scale = 0, worst = 0;
  std::string worst_name;
  for (const auto& [ours, theirs] : names.tensors) {
    BOOST_TEST_REQUIRE(ref.contains("grad." + theirs.front()), "diffusers has no gradient for " << theirs.front());
    scale = std::max(scale, max_abs(ref.read_f32("grad." + theirs.front())));
  }
  for (const auto& [ours, theirs] : names.tensors) {
    const std::vector<float> g = ref.read_f32("grad." + theirs.front());
    const std::vector<float>& b = before.at(ours);
    const std::vector<float>& a = after.at(ours);
    BOOST_TEST_REQUIRE(g.size() == b.size(), theirs.front() << ": " << g.size() << " vs " << b.size());
    for (std::size_t i = 0; i < g.size(); ++i)
      if (const double d = std::abs(double(b[i]) - a[i] - g[i]); d > worst) {
        worst = d;
        worst_name = theirs.front();
      }
  }
  std::printf(
      "PixArt: loss %.8f vs diffusers %.8f; %zu tensors, gradients within %.3e (at %s) of diffusers' (largest "
      "%.3e)\n",
      stats.loss, loss, names.tensors.size(), worst, worst_name.c_str(), scale);
  BOOST_TEST(worst <= tolerance * scale, "gradients differ by " << worst << " at " << worst_name);
  // the learned variance's channels get no gradient: proj_out's rows of channels 4..7 ((r p + q) C + c)
  for (const auto& [ours, theirs] : names.tensors)
    if (theirs.front() == "proj_out.bias")
      for (std::size_t i = 0; i < before.at(ours).size(); ++i)
        if (i % 8 >= 4) BOOST_TEST(before.at(ours)[i] == after.at(ours)[i], "proj_out.bias[" << i << "] moved");
}

// Activation checkpointing recomputes every unit's forward, lanes included,
// right before its backward: the same SGD step, at 2 ranks under FSDP.
BOOST_AUTO_TEST_CASE(activation_checkpointing_takes_the_same_step) {
  const fs::path& dir = made();
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  const models::PixArtConfig config = config_of(dir, in);
  const auto step = [&](bool recompute) {
    Values out;
    run_ranks(2, [&](World& w) {
      models::PixArt model(config);
      TrainerOptions o;
      o.activation_checkpointing = recompute;
      Trainer<models::PixArt, Strategy<FSDP<FullShard>>> t(w, model, SGD{.lr = 1.f}, o);
      diffusion::load_diffusers(t, dir / "transformer", model);
      t.step(std::vector<Batch>{batch_of(in, w.rank(), 1)});
      Values p = t.parameters();
      if (w.rank() == 0) out = std::move(p);
    });
    return out;
  };
  const Values plain = step(false), recomputed = step(true);
  double worst = 0;
  for (const auto& [name, values] : plain) worst = std::max(worst, worst_difference(recomputed.at(name), values));
  std::printf("PixArt: an SGD step with activation checkpointing differs by %.2e from one without\n", worst);
  BOOST_TEST(worst == 0.0);
}

// models::PixArtLoss against the prediction: the weighted mean of the
// squared errors of the first in_channels channels with a learned variance
// (out_channels 8), of every channel without (out_channels 4; dtrain's own
// initialisation), records weighted 0.25 and 1.5.
BOOST_AUTO_TEST_CASE(the_loss_reads_the_channels_it_trains) {
  const fs::path& dir = made();
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  for (const std::int64_t out : {8, 4}) {
    models::PixArtConfig c = config_of(dir, in);
    c.out_channels = out;
    models::PixArt model(c);
    const std::int64_t used = c.in_channels * c.sample_height * c.sample_width;
    BOOST_TEST(model.loss.used_columns() == (out == 8 ? used : 0));
    model.loss = models::PixArtLoss(model.loss.used_columns(), "y", "weight");
    Batch b = batch_of(in, 0, 2);
    const std::vector<float> weights{0.25f, 1.5f};
    b.set("weight", HostTensor::of(weights, {2}));
    const std::vector<float> y = in.read_f32("target");
    double want = 0, got = 0;
    run_ranks(1, [&](World& w) {
      models::PixArt mine = model;
      Trainer<models::PixArt> t(w, mine, SGD{.lr = 1e-3f});
      if (out == 8) diffusion::load_diffusers(t, dir / "transformer", mine);
      const std::vector<float> pred = t.predict(b);
      const std::int64_t width = mine.output_features();
      require(static_cast<std::int64_t>(pred.size()) == 2 * width, "one prediction per record");
      double sum = 0;
      for (std::int64_t r = 0; r < 2; ++r)
        for (std::int64_t k = 0; k < used; ++k) {
          const double d = double(pred[r * width + k]) - y[r * used + k];
          sum += weights[r] * d * d;
        }
      want = sum / ((weights[0] + weights[1]) * used);
      got = t.step(std::vector<Batch>{b}).loss;
    });
    std::printf("PixArt, %lld out channels: weighted loss %.8f, from the prediction %.8f\n", (long long)out, got, want);
    BOOST_TEST(std::abs(got - want) <= 1e-6 * want);
  }
}

BOOST_AUTO_TEST_CASE(trains_like_diffusers) {
  const fs::path& dir = made();
  const fs::path out = dir / "adamw.safetensors";
  run_script(
      "train " + dir.string() + " " + std::to_string(adamw_count) + " " + std::to_string(adamw_lr) + " " + out.string(),
      dir / "train.log");
  const SafetensorsFile ref = SafetensorsFile::open(out);
  std::vector<double> losses;
  const Values one = adamw_steps<DDP>(dir, 1, &losses), ddp = adamw_steps<DDP>(dir, 2),
               fsdp = adamw_steps<FSDP<FullShard>>(dir, 2);
  const std::vector<float> want = ref.read_f32("losses");
  BOOST_TEST_REQUIRE(losses.size() == want.size());
  double loss_gap = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    loss_gap = std::max(loss_gap, std::abs(losses[i] - want[i]) / std::abs(double(want[i])));
  Values theirs;
  models::PixArt model(config_of(dir, SafetensorsFile::open(dir / "inputs.safetensors")));
  for (const auto& [ours, names] : diffusion::pixart_names(model).tensors)
    theirs[ours] = ref.read_f32("param." + names.front());
  const double vs_diffusers = params_apart(one, theirs, "vs diffusers"), vs_ddp = params_apart(ddp, one, "DDP x2"),
               vs_fsdp = params_apart(fsdp, one, "FSDP x2"), bound = 1e-4;
  std::printf(
      "PixArt: %d AdamW steps: losses within %.2e (relative) of diffusers' (%.4f -> %.4f); parameters vs "
      "diffusers %.3e, DDP x2 vs x1 %.3e, FSDP x2 vs x1 %.3e (bound %.3e)\n",
      adamw_count, loss_gap, want.front(), want.back(), vs_diffusers, vs_ddp, vs_fsdp, bound);
  BOOST_TEST(loss_gap <= 2e-3);
  BOOST_TEST(want.back() < want.front(), "diffusers' loss fell");
  BOOST_TEST(vs_diffusers <= bound);
  BOOST_TEST(vs_ddp <= bound);
  BOOST_TEST(vs_fsdp <= bound);
}

BOOST_AUTO_TEST_CASE(saved_model_loads_in_diffusers) {
  const fs::path& dir = made();
  const SafetensorsFile in = SafetensorsFile::open(dir / "inputs.safetensors");
  const models::PixArtConfig config = config_of(dir, in);
  const fs::path saved = dir / "tuned", out = dir / "tuned_pred.safetensors";
  fs::remove_all(saved);
  std::vector<float> ours;
  run_ranks(2, [&](World& w) {
    models::PixArt model(config);
    Trainer<models::PixArt, Strategy<FSDP<FullShard>>> t(w, model, AdamW{.lr = 1e-3f});
    diffusion::load_diffusers(t, dir / "transformer", model);
    for (int s = 0; s < 2; ++s) t.step(std::vector<Batch>{batch_of(in, w.rank(), 1)});
    diffusion::save_diffusers(t, saved, model, read_text(dir / "transformer/config.json"));
    std::vector<float> p = t.predict(batch_of(in, 0, 2));
    if (w.rank() == 0) ours = std::move(p);
  });
  BOOST_TEST_REQUIRE(fs::exists(saved / "diffusion_pytorch_model.safetensors"));
  run_script("predict " + saved.string() + " " + (dir / "inputs.safetensors").string() + " " + out.string(),
             dir / "predict.log");
  const std::vector<float> theirs = SafetensorsFile::open(out).read_f32("pred");
  const std::vector<float> base = SafetensorsFile::open(dir / "expected.safetensors").read_f32("pred");
  const double moved = worst_difference(ours, base), err = worst_difference(ours, theirs);
  std::printf(
      "PixArt trained at 2 ranks (FSDP) and saved: prediction moved %.2e; diffusers on the save differs by %.2e "
      "(largest %.3f)\n",
      moved, err, max_abs(theirs));
  BOOST_TEST(moved > 1e-4, "training changed the model");
  BOOST_TEST(err <= tolerance * max_abs(theirs));
  // the saved config reads back as the same model
  const models::PixArtConfig back = diffusion::read_pixart_config(saved);
  BOOST_TEST(back.inner_dim() == config.inner_dim());
  BOOST_TEST(back.out_channels == 8);
  BOOST_TEST(back.interpolation() == 2.0);
}

BOOST_AUTO_TEST_CASE(the_config_reader_refuses_what_it_cannot_build) {
  const fs::path dir = work / "refusals";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string base = read_text(made() / "transformer/config.json");
  const auto refused = [&](const std::string& from, const std::string& to, const std::string& says) {
    std::string text = base;
    const std::size_t at = text.find(from);
    BOOST_TEST_REQUIRE(at != std::string::npos, from);
    text.replace(at, from.size(), to);
    std::ofstream(dir / "config.json") << text;
    try {
      diffusion::read_pixart_config(dir);
      BOOST_FAIL("accepted " << to);
    } catch (const config_error& e) {
      BOOST_TEST(std::string(e.what()).find(says) != std::string::npos, e.what());
    }
  };
  refused("\"use_additional_conditions\": null", "\"use_additional_conditions\": true", "use_additional_conditions");
  refused("\"sample_size\": 8", "\"sample_size\": 128", "use_additional_conditions");  // null means true at 128
  refused("\"_class_name\": \"PixArtTransformer2DModel\"", "\"_class_name\": \"Transformer2DModel\"",
          "supported: PixArtTransformer2DModel");
  refused("\"dropout\": 0.0", "\"dropout\": 0.0, \"new_key\": 1", "new_key");
  refused("\"norm_type\": \"ada_norm_single\"", "\"norm_type\": \"ada_norm_zero\"", "norm_type");
  refused("\"attention_bias\": true", "\"attention_bias\": false", "attention_bias");
  refused("\"caption_channels\": 12", "\"caption_channels\": null", "caption_channels");
  refused("\"cross_attention_dim\": 16", "\"cross_attention_dim\": 24", "cross_attention_dim");
  // a pipeline folder is read through its transformer/
  BOOST_TEST(diffusion::read_pixart_config(made()).caption_channels == 12);
}

int main(int argc, char* argv[]) { return main_needing_set("torch2", argc, argv); }
