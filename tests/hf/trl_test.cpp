// DPO and GRPO against TRL's trainers (TRL 1.16 in the pinned torch2 set,
// scripts/python/torch2.txt; CTest names its python in DTRAIN_PYTHON_TORCH2):
// train_lm objective=dpo on a tiny random Llama from transformers with a
// PEFT adapter whose A and B are both random, on 36 pairs of random ids;
// tests/hf/trl_dpo.py replays the very pairs train_lm trained on (its
// dump_batches) through DPOTrainer.compute_loss and a torch optimizer.
//   - the first step under every loss_type (sigmoid, hinge, ipo, robust with
//     label smoothing 0.1), the reference as the LoRA-off base and as a
//     frozen copy: the loss, TRL's six reward and log-probability metrics,
//     and the adapters' gradients (an SGD step of lr 100 without momentum,
//     so the update is the gradient times 100), each within 1e-5 of TRL's;
//   - 20 AdamW steps (lr 1e-3) at one rank and at two under DDP and
//     fsdp-full, and a full fine-tune against a frozen copy under fsdp-full
//     at two ranks: every step's loss within 1e-5 of TRL's and the trained
//     parameters within 1e-4 of the largest (AdamW's normalised steps let
//     float32 rounding of a tiny gradient move a weight by up to lr per step).
// GRPO (tests/hf/trl_grpo.py): 16 fixed completions of 4 prompts with random
// rewards, old log-probabilities 0.3 away from the policy's (so ratios fall
// outside the clip both ways) and the LoRA-off base as the reference with
// beta 0.04: the loss, the advantages, the KL and clip figures and the
// adapters' gradients within 1e-5 of GRPOTrainer._compute_loss's.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "hf/parity.hpp"
#include "hf/run_logged.hpp"
#include "support/pinned_main.hpp"
#include "support/python_venv.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/io/json.hpp>
#include <dtrain/io/safetensors.hpp>
#include <dtrain/train/grpo.hpp>
#include <dtrain/trainer.hpp>

namespace fs = std::filesystem;
using dtrain::SafetensorsFile;
using dtrain::testing::read_text;
using dtrain::testing::run_logged;
using dtrain::testing::worst;

namespace {

std::string python() { return dtrain::testing::pinned_python("torch2"); }

constexpr double tolerance = 1e-5;
const char* const metric_names[] = {"rewards/chosen",  "rewards/rejected", "rewards/accuracies",
                                    "rewards/margins", "logps/chosen",     "logps/rejected"};

// The tiny model, the pairs and the adapter, made once.
struct Prepared {
  fs::path dir, model, pairs, adapter;
};
const Prepared& prepared() {
  static const Prepared p = [] {
    const fs::path dir = dtrain::testing::make_model(python(), "trl_dpo", "llama 2 float32 0");
    BOOST_TEST_REQUIRE(run_logged(python() + " " + DTRAIN_SOURCE_DIR + "/tests/hf/trl_dpo.py prepare " +
                                      (dir / "model").string() + " " + dir.string(),
                                  dir / "prepare.txt") == 0,
                       read_text(dir / "prepare.txt"));
    return Prepared{dir, dir / "model", dir / "pairs.jsonl", dir / "adapter"};
  }();
  return p;
}

struct Run {
  std::string name;
  int ranks = 1;
  std::string strategy = "ddp";
  std::string loss_type = "sigmoid";
  double label_smoothing = 0;
  std::string reference = "base";
  bool adapter = true;  // the prepared adapter trains (else every weight, against a copy)
  std::string optimizer = "sgd";
  double lr = 100;
  int steps = 1;
};

fs::path out_dir(const Run& r) { return prepared().dir / r.name; }

// train_lm objective=dpo: 4 pairs per step over the ranks.
void train(const Run& r) {
  const Prepared& p = prepared();
  const fs::path out = out_dir(r);
  fs::remove_all(out);
  fs::create_directories(out);
  std::string cmd = (r.ranks > 1 ? std::string(DTRAIN_RUN_PATH) + " --nproc-per-node " + std::to_string(r.ranks) + " "
                                 : std::string()) +
                    TRAIN_LM_PATH + " model=" + p.model.string() + " data=" + p.pairs.string() +
                    " objective=dpo block_size=15 eval_batches=0 batch_size=" + std::to_string(4 / r.ranks) +
                    " steps=" + std::to_string(r.steps) + " strategy=" + r.strategy + " loss_type=" + r.loss_type +
                    " label_smoothing=" + std::to_string(r.label_smoothing) + " reference=" + r.reference +
                    " optimizer=" + r.optimizer + " momentum=0 lr=" + std::to_string(r.lr) +
                    " dump_batches=" + (out / "dump").string() + " metrics=" + (out / "metrics.jsonl").string();
  cmd += r.adapter ? " adapter=" + p.adapter.string() + " save_adapter=" + (out / "adapter").string()
                   : " save_hf=" + (out / "hf").string();
  BOOST_TEST_REQUIRE(run_logged(cmd, out / "log.txt") == 0, r.name << ": " << read_text(out / "log.txt"));
}

// trl_dpo.py's replay of every run, in one Python process.
fs::path replay(const std::vector<Run>& runs, const std::string& name) {
  const Prepared& p = prepared();
  nlohmann::json cases = nlohmann::json::array();
  for (const Run& r : runs)
    cases.push_back({{"name", r.name},
                     {"dump", (out_dir(r) / "dump").string()},
                     {"ranks", r.ranks},
                     {"steps", r.steps},
                     {"loss_type", r.loss_type},
                     {"beta", 0.1},
                     {"label_smoothing", r.label_smoothing},
                     {"reference", r.reference},
                     {"adapter", r.adapter ? p.adapter.string() : ""},
                     {"optimizer", r.optimizer},
                     {"lr", r.lr}});
  const fs::path spec = p.dir / (name + ".json"), out = p.dir / (name + ".safetensors");
  std::ofstream(spec) << cases.dump(1);
  BOOST_TEST_REQUIRE(run_logged(python() + " " + DTRAIN_SOURCE_DIR + "/tests/hf/trl_dpo.py replay " + p.model.string() +
                                    " " + spec.string() + " " + out.string(),
                                p.dir / (name + ".txt")) == 0,
                     read_text(p.dir / (name + ".txt")));
  return out;
}

// train_lm's metrics stream: each step's record.
std::vector<nlohmann::json> steps_of(const Run& r) {
  std::vector<nlohmann::json> out;
  std::ifstream in(out_dir(r) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j.contains("loss")) out.push_back(j);
  BOOST_TEST_REQUIRE(out.size() == static_cast<std::size_t>(r.steps), r.name << ": one record per step");
  return out;
}

// A float64 tensor of the reference file (trl_dpo.py writes its figures so).
std::vector<double> f64(const SafetensorsFile& f, const std::string& name) {
  const dtrain::SafetensorsTensor t = f.tensor(name);
  BOOST_TEST_REQUIRE((t.dtype == dtrain::element_type::f64), name << " is float64");
  std::vector<double> out(t.bytes.size() / sizeof(double));
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

// |got - want| relative to max(1, |want|).
double off(double got, double want) { return std::abs(got - want) / std::max(1.0, std::abs(want)); }

// The trained tensors dtrain saved against TRL's (their names: PEFT's or transformers').
double params_off(const Run& r, const SafetensorsFile& trl, const fs::path& saved, const std::string& prefix = "") {
  const auto ours = SafetensorsFile::open(saved);
  double err = 0;
  std::size_t compared = 0;
  for (const auto& name : ours.names()) {
    const std::string theirs = r.name + ".param." + prefix + name;
    if (!trl.contains(theirs)) continue;
    err = std::max(err, worst(ours.read_f32(name), trl.read_f32(theirs)));
    ++compared;
  }
  BOOST_TEST(compared > 0, r.name << ": the trained tensors have TRL's names");
  return err;
}

}  // namespace

BOOST_AUTO_TEST_CASE(first_step_matches_trl_for_every_loss_type_and_reference) {
  const std::vector<Run> runs{{.name = "sigmoid_base"},
                              {.name = "hinge_base", .loss_type = "hinge"},
                              {.name = "ipo_base", .loss_type = "ipo"},
                              {.name = "robust_base", .loss_type = "robust", .label_smoothing = 0.1},
                              {.name = "sigmoid_copy", .reference = "copy"}};
  for (const Run& r : runs) train(r);
  const auto trl = SafetensorsFile::open(replay(runs, "first_step"));
  const auto initial = SafetensorsFile::open(prepared().adapter / "adapter_model.safetensors");
  for (const Run& r : runs) {
    const nlohmann::json step = steps_of(r)[0];
    const double loss_off = off(step["loss"].get<double>(), f64(trl, r.name + ".loss")[0]);
    double metric_off = 0;
    for (const char* m : metric_names)
      metric_off = std::max(metric_off, off(step[m].get<double>(), f64(trl, r.name + "." + m)[0]));
    // The gradient: (initial - trained) / lr, dtrain's and TRL's.
    const auto ours = SafetensorsFile::open(out_dir(r) / "adapter/adapter_model.safetensors");
    double grad_off = 0;
    for (const auto& name : initial.names()) {
      const std::vector<float> a0 = initial.read_f32(name), mine = ours.read_f32(name),
                               theirs = trl.read_f32(r.name + ".param." + name);
      std::vector<float> g(a0.size()), want(a0.size());
      for (std::size_t i = 0; i < a0.size(); ++i) {
        g[i] = static_cast<float>((static_cast<double>(a0[i]) - mine[i]) / r.lr);
        want[i] = static_cast<float>((static_cast<double>(a0[i]) - theirs[i]) / r.lr);
      }
      grad_off = std::max(grad_off, worst(g, want));
    }
    std::printf("%s: loss %.6f (TRL %.6f), worst metric %.1e, worst adapter gradient %.1e\n", r.name.c_str(),
                step["loss"].get<double>(), f64(trl, r.name + ".loss")[0], metric_off, grad_off);
    BOOST_TEST(loss_off <= tolerance, r.name);
    BOOST_TEST(metric_off <= tolerance, r.name);
    BOOST_TEST(grad_off <= tolerance, r.name);
  }
}

BOOST_AUTO_TEST_CASE(twenty_adamw_steps_match_trl_at_one_and_two_ranks) {
  const Run adamw{.name = "", .optimizer = "adamw", .lr = 1e-3, .steps = 20};
  std::vector<Run> runs(4, adamw);
  runs[0].name = "ddp_1";
  runs[1].name = "ddp_2", runs[1].ranks = 2;
  runs[2].name = "fsdp_2", runs[2].ranks = 2, runs[2].strategy = "fsdp-full";
  runs[3].name = "full_copy_fsdp_2", runs[3].ranks = 2, runs[3].strategy = "fsdp-full", runs[3].reference = "copy",
  runs[3].adapter = false;
  for (const Run& r : runs) train(r);
  const auto trl = SafetensorsFile::open(replay(runs, "adamw"));
  for (const Run& r : runs) {
    const std::vector<nlohmann::json> steps = steps_of(r);
    const std::vector<double> want = f64(trl, r.name + ".loss");
    double loss_off = 0;
    for (std::size_t s = 0; s < steps.size(); ++s) loss_off = std::max(loss_off, off(steps[s]["loss"], want[s]));
    const double param_off = r.adapter ? params_off(r, trl, out_dir(r) / "adapter/adapter_model.safetensors")
                                       : params_off(r, trl, out_dir(r) / "hf/model.safetensors");
    std::printf("%s: loss %.6f -> %.6f (TRL %.6f -> %.6f), worst step loss %.1e, worst parameter %.1e\n",
                r.name.c_str(), steps.front()["loss"].get<double>(), steps.back()["loss"].get<double>(), want.front(),
                want.back(), loss_off, param_off);
    BOOST_TEST(loss_off <= tolerance, r.name);
    BOOST_TEST(param_off <= 1e-4, r.name);
  }
}

BOOST_AUTO_TEST_CASE(grpo_loss_matches_trl_for_fixed_completions) {
  using namespace dtrain;
  const Prepared& p = prepared();
  const hf::LmConfig config = hf::read_config(p.model);
  constexpr std::int64_t groups = 4;
  constexpr float lr = 100.f, beta = 0.04f, epsilon = 0.2f;
  std::mt19937 gen(5);
  std::vector<std::vector<std::int64_t>> prompts, completions;
  std::vector<double> rewards;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::int64_t> prompt(2 + gen() % 4);
    for (auto& id : prompt) id = gen() % config.vocab_size;
    for (int k = 0; k < groups; ++k) {
      std::vector<std::int64_t> c(1 + gen() % 6);
      for (auto& id : c) id = gen() % config.vocab_size;
      prompts.push_back(prompt);
      completions.push_back(c);
      rewards.push_back(std::uniform_real_distribution<double>(0.0, 1.0)(gen));
    }
  }
  const std::vector<double> adv = group_advantages(rewards, groups);
  Batch b = completion_batch(prompts, completions, adv, rewards);
  const fs::path dir = p.dir / "grpo", batch_file = dir / "batch.safetensors";
  fs::remove_all(dir);
  fs::create_directories(dir);
  double loss = 0;
  std::map<std::string, double> figures;
  dtrain::testing::run_ranks(1, [&](World& w) {
    hf::CausalLm m(config, hf::read_adapter_config(p.adapter));
    m.loss = nn::GrpoLoss({.epsilon = epsilon, .beta = beta});
    Trainer<hf::CausalLm, Strategy<DDP>> t(w, m, SGD{.lr = lr, .momentum = 0.f});
    hf::load_pretrained(t, p.model, config);
    hf::load_adapter(t, p.adapter, m);
    const nn::SequenceLogps now = t.sequence_logps(b), base = t.sequence_logps(b, {.adapters = false});
    std::vector<float> old(now.row_logp.size()), ref(old.size());
    std::uniform_real_distribution<double> noise(-0.3, 0.3);
    for (std::size_t r = 0; r < old.size(); ++r) {
      old[r] = static_cast<float>(now.row_logp[r] + noise(gen));
      ref[r] = static_cast<float>(base.row_logp[r]);
    }
    const std::vector<std::int64_t> shape = b.at("y").shape;
    b.set("old_logps", HostTensor::of(old, shape));
    b.set("ref_logps", HostTensor::of(ref, shape));
    SafetensorsWriter out;
    for (const char* name : {"x", "y", "rewards", "old_logps", "ref_logps"}) {
      const HostTensor& h = b.at(name);
      out.add(name, h.type, h.shape, h.bytes);
    }
    out.write(batch_file);
    const StepStats st = t.step(std::span(&b, 1));
    loss = st.loss;
    for (const auto& m_ : st.metrics) figures[m_.name] = m_.value;
    hf::save_adapter(t, dir / "adapter", m, p.model);
  });
  const fs::path ref_file = dir / "trl.safetensors";
  BOOST_TEST_REQUIRE(run_logged(python() + " " + DTRAIN_SOURCE_DIR + "/tests/hf/trl_grpo.py " + p.model.string() + " " +
                                    p.adapter.string() + " " + batch_file.string() + " " + std::to_string(beta) + " " +
                                    std::to_string(epsilon) + " " + std::to_string(groups) + " " + ref_file.string(),
                                dir / "trl.txt") == 0,
                     read_text(dir / "trl.txt"));
  const auto trl = SafetensorsFile::open(ref_file);
  const std::vector<double> trl_adv = f64(trl, "advantages");
  double adv_off = 0, figure_off = 0, grad_off = 0;
  for (std::size_t i = 0; i < adv.size(); ++i) adv_off = std::max(adv_off, off(adv[i], trl_adv[i]));
  for (const char* name : {"kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"})
    figure_off = std::max(figure_off, off(figures.at(name), f64(trl, std::string("metric.") + name)[0]));
  const auto initial = SafetensorsFile::open(p.adapter / "adapter_model.safetensors");
  const auto ours = SafetensorsFile::open(dir / "adapter/adapter_model.safetensors");
  for (const auto& name : initial.names()) {
    const std::vector<float> a0 = initial.read_f32(name), a1 = ours.read_f32(name);
    std::vector<float> g(a0.size());
    for (std::size_t i = 0; i < a0.size(); ++i) g[i] = static_cast<float>((static_cast<double>(a0[i]) - a1[i]) / lr);
    grad_off = std::max(grad_off, worst(g, trl.read_f32("grad." + name)));
  }
  std::printf(
      "grpo: loss %.6f (TRL %.6f), advantages off by %.1e, kl %.5f (TRL %.5f), clipped %.3f (TRL %.3f), worst "
      "figure %.1e, worst adapter gradient %.1e\n",
      loss, f64(trl, "loss")[0], adv_off, figures.at("kl"), f64(trl, "metric.kl")[0],
      figures.at("clip_ratio/region_mean"), f64(trl, "metric.clip_ratio/region_mean")[0], figure_off, grad_off);
  BOOST_TEST(off(loss, f64(trl, "loss")[0]) <= tolerance);
  BOOST_TEST(adv_off <= tolerance);
  BOOST_TEST(figure_off <= tolerance);
  BOOST_TEST(grad_off <= tolerance);
  BOOST_TEST(figures.at("clip_ratio/low_mean") > 0, "some ratios below the clip");
  BOOST_TEST(figures.at("clip_ratio/high_mean") > 0, "some ratios above the clip");
}

// Skipped with the fixture that makes the pinned set's venv when it cannot be installed here.
int main(int argc, char* argv[]) { return dtrain::testing::main_needing_set("torch2", argc, argv); }
