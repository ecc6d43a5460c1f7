// models::Act (LeRobot's ACT policy) against LeRobot itself: small random
// ACTPolicy models made by LeRobot 0.4 (tests/lerobot/lerobot_act.py make:
// chunk 5, dim 32, 4 heads, feed-forward 48, 2 encoder layers, 1 decoder
// layer, 2 VAE layers, latent 8, state 3, actions 2, one 64 x 64 camera or
// two, the backbone's frozen batch-norm statistics random), in three forms:
// VAE on (post-norm), VAE off, VAE on with pre-norm and two cameras. For each:
//  - one step on 4 samples with LeRobot's latent noise: the loss within 1e-5
//    (relative) of LeRobot's float64 loss, and every trainable parameter's
//    gradient (one SGD step, lr = 1) within 1e-5 of the largest reference
//    gradient; the frozen batch-norm tensors unchanged;
//  - (VAE on, post-norm) 20 AdamW steps (lr 1e-3, weight decay 1e-4, LeRobot's optimizer
//    preset with both groups at one rate) at 1 rank, and at 2 ranks (2
//    samples each) under DDP and FSDP FullShard: the 20 losses within 2e-3
//    (relative) of LeRobot's float64 run, every parameter within lr x steps
//    of LeRobot's and of one another (AdamW's step is about lr whatever the
//    gradient, so an element whose gradient is rounding noise can use up
//    that budget; the share of elements beyond 1e-5 is printed);
//  - (VAE on and off) the policy saved by dtrain after training (FSDP, 2 ranks) loads with
//    ACTPolicy.from_pretrained, whose predict_action_chunk and select_action
//    give dtrain's action chunk within 1e-5.
// torchvision's resnet18 weights (with fc and counters) initialise the
// trunk exactly. dtrain-estimate's model states for the VAE case equal a Trainer's (DDP
// fp32 at 1 rank, FSDP bf16 at 2), its activations never above them.
// And the loader's refusals: an unsupported policy type, an unknown key,
// a backbone other than resnet18.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "hf/run_logged.hpp"
#include "support/pinned_main.hpp"
#include "support/python_venv.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/io/json.hpp>
#include <dtrain/lerobot/act.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
using namespace dtrain;
using namespace dtrain::testing;

namespace {

const fs::path work = fs::path(DTRAIN_TEST_BINARY_DIR) / "act";
const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/tests/lerobot/lerobot_act.py";
constexpr std::int64_t samples = 4;
constexpr int adamw_count = 20;
constexpr float adamw_lr = 1e-3f;

using Values = std::map<std::string, std::vector<float>>;

std::string python() { return pinned_python("lerobot"); }

void run_script(const std::string& args, const fs::path& log) {
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 " + python() + " " + script + " " + args;
  BOOST_TEST_REQUIRE(run_logged(cmd, log) == 0, "lerobot_act.py " << args << " failed: " << read_text(log));
}

struct Case {
  std::string name;
  int use_vae, pre_norm, cameras;
  fs::path dir;
};

Case make_case(const std::string& name, int use_vae, int pre_norm, int cameras) {
  const fs::path dir = work / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  run_script("make " + (dir / "policy").string() + " --seed 7 --use-vae " + std::to_string(use_vae) + " --pre-norm " +
                 std::to_string(pre_norm) + " --batch " + std::to_string(samples) +
                 " --height 64 --width 64 --cameras " + std::to_string(cameras) + " --steps " +
                 std::to_string(adamw_count),
             dir / "make.log");
  return {name, use_vae, pre_norm, cameras, dir};
}

// Rows [first, first + n) of a tensor of `file` (step `step` of a stacked one, or -1).
template <class E>
HostTensor rows_of(const SafetensorsFile& f, const std::string& name, std::int64_t first, std::int64_t n,
                   std::int64_t step) {
  std::vector<std::int64_t> shape = f.tensor(name).shape;
  std::vector<E> all;
  if constexpr (std::is_same_v<E, float>)
    all = f.read_f32(name);
  else
    all = f.read_i64(name);
  std::size_t offset = 0;
  if (step >= 0) {
    const std::size_t per_step = all.size() / static_cast<std::size_t>(shape[0]);
    offset = per_step * static_cast<std::size_t>(step);
    shape.erase(shape.begin());
  }
  std::int64_t per = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) per *= shape[d];
  shape[0] = n;
  const auto begin = all.begin() + static_cast<std::ptrdiff_t>(offset + first * per);
  return HostTensor::of(std::vector<E>(begin, begin + n * per), shape);
}

// The model's batch from LeRobot's tensors: the cameras side by side in x.
Batch batch_of(const models::ActConfig& c, const SafetensorsFile& f, std::int64_t first, std::int64_t n,
               std::int64_t step = -1) {
  Batch b;
  const std::int64_t image = c.image_channels * c.image_height * c.image_width;
  std::vector<float> x(static_cast<std::size_t>(n * image * static_cast<std::int64_t>(c.cameras.size())));
  for (std::size_t k = 0; k < c.cameras.size(); ++k) {
    const HostTensor t = rows_of<float>(f, c.cameras[k], first, n, step);
    const std::span<const float> cam = t.values<float>();
    for (std::int64_t r = 0; r < n; ++r)
      std::copy_n(cam.begin() + r * image, image,
                  x.begin() + (r * static_cast<std::int64_t>(c.cameras.size()) + static_cast<std::int64_t>(k)) * image);
  }
  b.set("x", HostTensor::of(std::move(x), {n, static_cast<std::int64_t>(c.cameras.size()) * image}));
  b.set("observation.state", rows_of<float>(f, "observation.state", first, n, step));
  b.set("action", rows_of<float>(f, "action", first, n, step));
  b.set("action_is_pad", rows_of<std::int64_t>(f, "action_is_pad", first, n, step));
  b.set("latent_noise", rows_of<float>(f, "latent_noise", first, n, step));
  return b;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (const float e : v) m = std::max(m, std::abs(double(e)));
  return m;
}

std::map<std::string, bool> trainable_of(models::Act& model) {
  std::map<std::string, bool> out;
  dtrain::detail::for_each_unit(model.units(), [&](std::size_t i, auto& unit) {
    for (const ParamSpec& s : unit.params()) out[std::to_string(i) + "." + s.name] = s.trainable;
  });
  return out;
}

void check_gradients(const Case& c) {
  const models::ActConfig config = lerobot::read_act_config(c.dir / "policy");
  run_script("grads " + (c.dir / "policy").string() + " " + (c.dir / "grads.safetensors").string(),
             c.dir / "grads.log");
  const SafetensorsFile ref = SafetensorsFile::open(c.dir / "grads.safetensors");
  const SafetensorsFile in = SafetensorsFile::open(c.dir / "policy/batch.safetensors");
  models::Act model(config);
  Values before, after;
  StepStats stats;
  run_ranks(1, [&](World& w) {
    models::Act mine = model;
    Trainer<models::Act> t(w, mine, SGD{.lr = 1.f});
    lerobot::load_lerobot(t, c.dir / "policy", mine);
    before = t.parameters();
    stats = t.step(std::vector<Batch>{batch_of(config, in, 0, samples)});
    after = t.parameters();
  });
  const double loss = ref.read_f32("loss").at(0);
  BOOST_TEST(std::abs(stats.loss - loss) <= 1e-5 * std::abs(loss),
             c.name << ": loss " << stats.loss << ", LeRobot " << loss);
  const std::map<std::string, bool> trainable = trainable_of(model);
  const hf::TransformersNames names = lerobot::act_names(model);
  double scale = 0, worst = 0;
  std::string worst_name;
  std::size_t trained = 0, frozen = 0;
  for (const auto& [ours, theirs] : names.tensors) {
    BOOST_TEST_REQUIRE(ref.contains("param." + theirs.front()), "LeRobot has no " << theirs.front());
    if (!trainable.at(ours)) {
      BOOST_TEST((before.at(ours) == after.at(ours)), c.name << ": frozen " << theirs.front() << " changed");
      ++frozen;
      continue;
    }
    BOOST_TEST_REQUIRE(ref.contains("grad." + theirs.front()), "no LeRobot gradient for " << theirs.front());
    scale = std::max(scale, max_abs(ref.read_f32("grad." + theirs.front())));
  }
  for (const auto& [ours, theirs] : names.tensors) {
    if (!trainable.at(ours)) continue;
    ++trained;
    const std::vector<float> g = ref.read_f32("grad." + theirs.front());
    const std::vector<float>& b = before.at(ours);
    const std::vector<float>& a = after.at(ours);
    BOOST_TEST_REQUIRE(g.size() == b.size(), theirs.front() << ": " << g.size() << " vs " << b.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double d = std::abs(double(b[i]) - a[i] - g[i]);
      if (d > worst) {
        worst = d;
        worst_name = theirs.front();
      }
    }
  }
  BOOST_TEST(worst <= 1e-5 * scale,
             c.name << ": gradients differ by " << worst << " at " << worst_name << " (largest " << scale << ")");
  std::printf(
      "%s: loss %.8f vs LeRobot %.8f (l1 %.6f, kld %.6f), %zu trained tensors, %zu frozen, gradients max "
      "difference %.3e (largest %.3e)\n",
      c.name.c_str(), stats.loss, loss, ref.read_f32("l1_loss").at(0), ref.read_f32("kld_loss").at(0), trained, frozen,
      worst, scale);
}

template <class Kind>
Values adamw_steps(const Case& c, int ranks, std::vector<double>* losses = nullptr) {
  const models::ActConfig config = lerobot::read_act_config(c.dir / "policy");
  const SafetensorsFile steps = SafetensorsFile::open(c.dir / "policy/steps.safetensors");
  Values out;
  run_ranks(ranks, [&](World& w) {
    models::Act model(config);
    Trainer<models::Act, Strategy<Kind>> t(w, model, AdamW{.lr = adamw_lr, .weight_decay = 1e-4f});
    lerobot::load_lerobot(t, c.dir / "policy", model);
    const std::int64_t per = samples / ranks;
    for (int s = 0; s < adamw_count; ++s) {
      const StepStats st = t.step(std::vector<Batch>{batch_of(config, steps, w.rank() * per, per, s)});
      if (losses != nullptr && w.rank() == 0) losses->push_back(st.loss);
    }
    const Values p = t.parameters();
    if (w.rank() == 0) out = p;
  });
  return out;
}

// The attention's key biases (in_proj_bias's middle third) get no gradient:
// softmax ignores a shift every score of a query shares. Their gradient is
// rounding noise, which AdamW turns into steps of about lr each, so they are
// held to the steps' bound (lr x steps) and the rest to the tight one.
bool key_bias(const std::string& name, std::size_t i, std::size_t size) {
  return name.ends_with("in_proj_bias") && i >= size / 3 && i < 2 * size / 3;
}

struct Difference {
  double rest = 0, key_biases = 0;
  std::string where;
  std::size_t elements = 0, loose = 0;  // and how many differ by more than 1e-5
  double loose_share() const { return elements == 0 ? 0 : double(loose) / double(elements); }
};

// `names` maps a's names (dtrain's) to LeRobot's for the message.
Difference max_difference(const Values& a, const Values& b, const hf::TransformersNames& names) {
  Difference d;
  for (const auto& [name, v] : a) {
    const auto& u = b.at(name);
    const std::string theirs = names.tensors.at(name).front();
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double e = std::abs(double(v[i]) - u[i]);
      ++d.elements;
      if (e > 1e-5) ++d.loose;
      if (key_bias(theirs, i, v.size())) {
        d.key_biases = std::max(d.key_biases, e);
      } else if (e > d.rest) {
        d.rest = e;
        d.where = theirs;
      }
    }
  }
  return d;
}

void check_training(const Case& c) {
  run_script("train " + (c.dir / "policy").string() + " " + (c.dir / "train.safetensors").string() + " --lr " +
                 std::to_string(adamw_lr) + " --steps " + std::to_string(adamw_count),
             c.dir / "train.log");
  const SafetensorsFile ref = SafetensorsFile::open(c.dir / "train.safetensors");
  models::Act model(lerobot::read_act_config(c.dir / "policy"));
  const hf::TransformersNames names = lerobot::act_names(model);
  std::vector<double> losses;
  const Values one = adamw_steps<DDP>(c, 1, &losses), ddp = adamw_steps<DDP>(c, 2),
               fsdp = adamw_steps<FSDP<FullShard>>(c, 2);
  const std::map<std::string, bool> trainable = trainable_of(model);
  Values want;
  for (const auto& [ours, theirs] : names.tensors)
    want[ours] = trainable.at(ours) ? ref.read_f32("param." + theirs.front()) : one.at(ours);
  const std::vector<float> ref_losses = ref.read_f32("losses");
  double loss_gap = 0;
  for (std::size_t k = 0; k < losses.size(); ++k)
    loss_gap = std::max(loss_gap, std::abs(losses[k] - ref_losses[k]) / std::abs(double(ref_losses[k])));
  BOOST_TEST(loss_gap <= 2e-3, c.name << ": the steps' losses differ from LeRobot's by " << loss_gap << " (relative)");
  const Difference vs = max_difference(one, want, names), d_ddp = max_difference(one, ddp, names),
                   d_fsdp = max_difference(one, fsdp, names);
  // AdamW moves an element by about lr a step whatever its gradient's size,
  // so an element whose gradient is rounding noise (the key biases, and
  // convolution weights whose gradient sums cancel to nearly nothing) can
  // part by up to lr x steps between two exact runs; the rest agree closely
  // (the share beyond 1e-5 is printed).
  const double steps_bound = adamw_lr * adamw_count;
  for (const Difference* d : {&vs, &d_ddp, &d_fsdp}) {
    BOOST_TEST(d->rest <= steps_bound, c.name << ": parameters differ by " << d->rest << " at " << d->where);
    BOOST_TEST(d->key_biases <= steps_bound, c.name << ": key biases differ by " << d->key_biases);
  }
  std::printf(
      "%s: %d AdamW steps: losses within %.2e of LeRobot's; parameters vs LeRobot %.3e, DDP x2 vs x1 %.3e, FSDP x2 vs "
      "x1 %.3e (the key biases, gradient "
      "0: %.3e, %.3e, %.3e); share over 1e-5: %.2e, %.2e, %.2e at %s, %s, %s\n",
      c.name.c_str(), adamw_count, loss_gap, vs.rest, d_ddp.rest, d_fsdp.rest, vs.key_biases, d_ddp.key_biases,
      d_fsdp.key_biases, vs.loose_share(), d_ddp.loose_share(), d_fsdp.loose_share(), vs.where.c_str(),
      d_ddp.where.c_str(), d_fsdp.where.c_str());
}

void check_save(const Case& c) {
  const models::ActConfig config = lerobot::read_act_config(c.dir / "policy");
  const SafetensorsFile steps = SafetensorsFile::open(c.dir / "policy/steps.safetensors");
  const SafetensorsFile in = SafetensorsFile::open(c.dir / "policy/batch.safetensors");
  const fs::path saved = c.dir / "saved";
  fs::remove_all(saved);
  std::vector<float> mine;
  run_ranks(2, [&](World& w) {
    models::Act model(config);
    Trainer<models::Act, Strategy<FSDP<FullShard>>> t(w, model, AdamW{.lr = adamw_lr, .weight_decay = 1e-4f});
    lerobot::load_lerobot(t, c.dir / "policy", model);
    for (int s = 0; s < 3; ++s) t.step(std::vector<Batch>{batch_of(config, steps, w.rank() * 2, 2, s)});
    std::ifstream base(c.dir / "policy/config.json");
    const std::string text((std::istreambuf_iterator<char>(base)), std::istreambuf_iterator<char>());
    lerobot::save_lerobot(t, saved, model, text);
    const std::vector<float> p = t.predict(batch_of(config, in, 0, samples));
    if (w.rank() == 0) mine = p;
  });
  run_script("predict " + saved.string() + " " + (c.dir / "policy/batch.safetensors").string() + " " +
                 (c.dir / "predict.safetensors").string(),
             c.dir / "predict.log");
  const SafetensorsFile ref = SafetensorsFile::open(c.dir / "predict.safetensors");
  const std::vector<float> want = ref.read_f32("actions"), first = ref.read_f32("first_action");
  const std::int64_t acts = config.chunk_size * config.action_dim, width = acts + 2 * config.latent_dim;
  BOOST_TEST_REQUIRE(mine.size() == static_cast<std::size_t>(samples * width));
  double worst = 0, worst_first = 0;
  for (std::int64_t r = 0; r < samples; ++r)
    for (std::int64_t k = 0; k < acts; ++k) {
      const double d = std::abs(double(mine[r * width + k]) - want[r * acts + k]);
      worst = std::max(worst, d);
      if (k < config.action_dim)
        worst_first = std::max(worst_first, std::abs(double(mine[r * width + k]) - first[r * config.action_dim + k]));
    }
  const double scale = std::max(1.0, max_abs(want));
  BOOST_TEST(worst <= 1e-5 * scale, c.name << ": LeRobot's chunk from dtrain's save differs by " << worst);
  BOOST_TEST(worst_first <= 1e-5 * scale, c.name << ": select_action differs by " << worst_first);
  std::printf(
      "%s: saved by dtrain (FSDP x2), loaded by LeRobot: action chunk max difference %.3e, select_action "
      "%.3e\n",
      c.name.c_str(), worst, worst_first);
}

}  // namespace

BOOST_AUTO_TEST_CASE(vae_post_norm_matches_lerobot) {
  const Case c = make_case("vae", 1, 0, 1);
  check_gradients(c);
  check_training(c);
  check_save(c);
}

BOOST_AUTO_TEST_CASE(without_vae_matches_lerobot) {
  const Case c = make_case("novae", 0, 0, 1);
  check_gradients(c);
  check_save(c);
}

BOOST_AUTO_TEST_CASE(pre_norm_two_cameras_match_lerobot) {
  const Case c = make_case("prenorm2", 1, 1, 2);
  check_gradients(c);
}

// torchvision's resnet18 state dict (the VAE case's backbone under
// torchvision's names, with an fc head and num_batches_tracked counters,
// which are ignored) initialises the trunk of a fresh model exactly.
BOOST_AUTO_TEST_CASE(torchvision_weights_initialise_the_backbone) {
  BOOST_TEST_REQUIRE(fs::exists(work / "vae/policy/model.safetensors"), "the vae case makes the policy");
  const SafetensorsFile policy = SafetensorsFile::open(work / "vae/policy/model.safetensors");
  const std::string prefix = "model.backbone.";
  std::list<std::vector<float>> values;
  std::list<std::vector<std::int64_t>> counters;
  SafetensorsWriter w;
  for (const auto& name : policy.names())
    if (name.starts_with(prefix)) {
      const std::string theirs = name.substr(prefix.size());
      w.add(theirs, policy.tensor(name).shape, std::span<const float>(values.emplace_back(policy.read_f32(name))));
      if (theirs.ends_with("running_var"))
        w.add(theirs.substr(0, theirs.size() - 11) + "num_batches_tracked", {},
              std::span<const std::int64_t>(counters.emplace_back(1, 0)));
    }
  w.add("fc.weight", {3, 512}, std::span<const float>(values.emplace_back(3 * 512, 0.5f)));
  w.add("fc.bias", {3}, std::span<const float>(values.emplace_back(3, 0.5f)));
  const fs::path file = work / "resnet18.safetensors";
  w.write(file);
  const models::ActConfig config = lerobot::read_act_config(work / "vae/policy");
  models::Act model(config);
  const hf::TransformersNames names = lerobot::act_names(model);
  std::size_t checked = 0;
  run_ranks(1, [&](World& world) {
    Trainer<models::Act> t(world, model, AdamW{});
    const LoadParamsReport r = lerobot::load_torchvision_backbone(t, file, model);
    BOOST_TEST(r.unexpected.empty());
    for (const auto& [ours, values] : t.parameters()) {
      const std::string theirs = names.tensors.at(ours).front();
      if (!theirs.starts_with(prefix)) continue;
      BOOST_TEST((values == policy.read_f32(theirs)), theirs);
      ++checked;
    }
  });
  BOOST_TEST(checked == 100u, "resnet18's 100 tensors (weights, biases, running statistics)");
}

#ifdef DTRAIN_ESTIMATE_PATH
namespace {
// dtrain-estimate --hf-config over a policy directory, its rows as JSON.
nlohmann::json estimate_rows(const fs::path& dir, const std::string& args) {
  const std::string cmd = std::string(DTRAIN_ESTIMATE_PATH) + " --hf-config " + dir.string() + " --json " + args;
  FILE* pipe = popen(cmd.c_str(), "r");
  BOOST_TEST_REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  while (const std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  BOOST_TEST_REQUIRE(pclose(pipe) == 0, cmd << ":\n" << out);
  return nlohmann::json::parse(out).at("strategies");
}

template <class Prec, class Kind>
void check_estimate(const std::string& precision, int world) {
  const fs::path dir = work / "vae/policy";
  const models::ActConfig config = lerobot::read_act_config(dir);
  const SafetensorsFile steps = SafetensorsFile::open(dir / "steps.safetensors");
  const std::int64_t per = samples / world;
  const nlohmann::json rows =
      estimate_rows(dir, "--precision " + precision + " --world " + std::to_string(world) + " --strategy " +
                             std::string(Kind::name) + " --batch-size " + std::to_string(per));
  BOOST_TEST_REQUIRE(rows.size() == 1u);
  const nlohmann::json& e = rows.at(0);
  MemoryUsage m;
  run_ranks(world, [&](World& w) {
    models::Act model(config);
    Trainer<models::Act, Device<Host>, Prec, Strategy<Kind>> t(w, model, AdamW{});
    for (int s = 0; s < 2; ++s) t.step(std::vector<Batch>{batch_of(config, steps, w.rank() * per, per, s)});
    if (w.rank() == 0) m = t.memory();
  });
  const std::string label = precision + " " + std::string(Kind::name) + " world " + std::to_string(world);
  BOOST_TEST(e.at("params").get<std::size_t>() == m.params, label << " params");
  BOOST_TEST(e.at("grads").get<std::size_t>() == m.grads, label << " grads");
  BOOST_TEST(e.at("optimizer").get<std::size_t>() == m.optimizer, label << " optimizer");
  BOOST_TEST(e.at("master").get<std::size_t>() == m.master, label << " master");
  const auto activations = e.at("activations").get<std::size_t>();
  BOOST_TEST(activations <= m.activations,
             label << ": activations estimated " << activations << ", measured " << m.activations);
  std::printf(
      "dtrain-estimate, ACT %s: params %zu, grads %zu, optimizer %zu B as measured; activations %zu B "
      "estimated, %zu B measured\n",
      label.c_str(), m.params, m.grads, m.optimizer, activations, m.activations);
}
}  // namespace

// The model states dtrain-estimate gives for a LeRobot ACT directory are
// the Trainer's, byte for byte; its activations never above what the
// allocator counts (which adds the units' transient workspace).
BOOST_AUTO_TEST_CASE(the_estimate_matches_the_trainer) {
  BOOST_TEST_REQUIRE(fs::exists(work / "vae/policy/config.json"), "the vae case makes the policy");
  check_estimate<Precision<fp32>, DDP>("fp32", 1);
  check_estimate<Precision<bf16>, FSDP<FullShard>>("bf16", 2);
}
#endif

namespace {
fs::path config_with(const std::string& name, const std::string& from, const std::string& to) {
  const fs::path dir = work / "bad" / name;
  fs::create_directories(dir);
  std::ifstream in(work / "vae/policy/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find(from);
  BOOST_TEST_REQUIRE(at != std::string::npos, "no " << from << " in the config");
  text.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << text;
  return dir;
}
bool refused(const fs::path& dir, const std::string& says) {
  try {
    lerobot::read_act_config(dir);
  } catch (const config_error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return std::string(e.what()).find(says) != std::string::npos;
  }
  return false;
}
}  // namespace

BOOST_AUTO_TEST_CASE(the_loader_refuses_what_it_cannot_build) {
  BOOST_TEST_REQUIRE(fs::exists(work / "vae/policy/config.json"), "the vae case makes the config these edit");
  BOOST_TEST(refused(config_with("type", "\"type\": \"act\"", "\"type\": \"diffusion\""),
                     "policy type \"diffusion\" is not supported (supported: act)"));
  BOOST_TEST(refused(config_with("key", "\"type\": \"act\"", "\"type\": \"act\", \"flux_capacitor\": 1"),
                     "unknown key \"flux_capacitor\""));
  BOOST_TEST(refused(config_with("backbone", "\"resnet18\"", "\"resnet50\""), "vision_backbone \"resnet50\""));
}

// Skipped with the fixture that makes the pinned set's venv when it cannot be installed here.
int main(int argc, char* argv[]) { return dtrain::testing::main_needing_set("lerobot", argc, argv); }
