// dtrain-estimate's memory model (train/estimate.hpp) against what the
// Trainer's allocator measures: train_mlp's model and an uneven one (shapes no
// world size divides, a frozen layer, a LayerNorm) trained for two steps by
// real Trainers, ranks as threads over Gloo, for every strategy, world sizes
// 1-3 (and 4 with HybridShard groups of 2), fp32 / bf16 / bf16 reduced in
// bf16, AdamW and SGD with momentum, Accumulate<1> and <2>. Then the CLI.
#define BOOST_TEST_MODULE tools_estimate
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <strategy/common.hpp>
#include <support/ranks.hpp>
#include <support/strategy_options.hpp>
#ifdef DTRAIN_ESTIMATE_PATH
#include <tools/estimate_cli.hpp>
#endif

#include <dtrain/models/gpt.hpp>
#include <dtrain/models/mlp.hpp>
#include <dtrain/train/estimate.hpp>
#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

constexpr double tolerance = 0.05;

constexpr std::array<const char*, 7> category_names = {"params",   "grads",       "optimizer", "master",
                                                       "gathered", "activations", "other"};

std::size_t category(const MemoryUsage& m, std::size_t c) {
  const std::array<std::size_t, 7> v = {m.params, m.grads, m.optimizer, m.master, m.gathered, m.activations, m.other};
  return v[c];
}

// |estimate - measured| / measured; a category measured empty must be estimated empty.
double rel_diff(std::size_t estimate, std::size_t measured) {
  if (measured == 0) return estimate == 0 ? 0.0 : 1.0;
  return std::abs(static_cast<double>(estimate) - static_cast<double>(measured)) / static_cast<double>(measured);
}

// The largest difference per category over every case, for the report.
struct Worst {
  std::array<double, 7> diff{};
  std::array<std::string, 7> where;
  double gathered_ratio_max = 0, gathered_ratio_min = INFINITY;  // estimate / measured, FSDP
  int cases = 0;
};
Worst worst;

// `rows` deterministic random samples for one rank's micro-batch k of `step`.
Batch random_batch(std::int64_t features, std::int64_t classes, std::int64_t rows, std::uint64_t seed) {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (double v : random_values(static_cast<std::size_t>(rows * features), seed)) x.push_back(static_cast<float>(v));
  for (std::int64_t r = 0; r < rows; ++r)
    y.push_back(static_cast<std::int32_t>((seed + static_cast<std::uint64_t>(r) * 7) % classes));
  return Batch::table(x, y, rows, features);
}

// train_mlp's own model (dtrain/models/mlp.hpp): Linear 32->128, GELU,
// Linear 128->128, GELU, Linear 128->10.
struct MlpCase {
  static constexpr const char* name = "mlp";
  using Net = models::MlpClassifier;
  static constexpr std::int64_t features = 32, classes = 10, rows = 8;
  static inline const std::vector<std::int64_t> hidden = {128, 128};
  static models::MlpConfig config() {
    models::MlpConfig c;
    c.hidden = hidden;
    return c;
  }
  static Net make() { return Net(config(), features, classes); }
  // No unit workspace in this model: model_activation_bytes is exact.
  static std::optional<std::size_t> activations(std::size_t compute_bytes) {
    Net net = make();
    return model_activation_bytes(net, {rows, 1}, features, static_cast<std::size_t>(rows) * sizeof(std::int32_t),
                                  compute_bytes, false);
  }
};

// strategy/common.hpp's UnevenNet: Linear 7->15, LayerNorm, GELU, Linear 15->16
// (frozen), ReLU, Linear 16->17, GELU, Linear 17->5. Its LayerNorm workspace
// counts as activations, which the MLP helper does not model: model states only.
struct UnevenCase {
  static constexpr const char* name = "uneven";
  using Net = UnevenNet;
  static constexpr std::int64_t features = dtrain::testing::features, classes = dtrain::testing::classes, rows = 6;
  static Net make() { return {}; }
  static std::optional<std::size_t> activations(std::size_t) { return std::nullopt; }
};

// A weight used by two units (tied parameters): Linear 7->7, ReLU, the same
// weight again with its own bias, ReLU, Linear 7->5. The Trainer's tie
// buffers (the owner's values, the tied gradient) count as gathered and grads.
struct TiedCase {
  static constexpr const char* name = "tied";
  struct Net {
    nn::Linear in{7, 7};
    nn::ReLU r1;
    nn::Linear mid{7, 7, {.tie_weight = "0.weight"}};
    nn::ReLU r2;
    nn::Linear head{7, 5};
    nn::SoftmaxCrossEntropy loss;
    auto units() { return std::tie(in, r1, mid, r2, head); }
  };
  static constexpr std::int64_t features = 7, classes = 5, rows = 6;
  static Net make() { return {}; }
  static std::optional<std::size_t> activations(std::size_t) { return std::nullopt; }
};

// HybridShard's group for n ranks: replicated singles at 2, one group at 3,
// two groups of two at 4.
int hybrid_group(int n) { return n == 4 ? 2 : n == 3 ? 3 : 1; }

template <class Kind>
std::vector<int> world_sizes() {
  if constexpr (std::is_same_v<Kind, FSDP<HybridShard>>)
    return {1, 2, 3, 4};
  else
    return {1, 2, 3};
}

// What one case trained and what the estimator is given for it. Built by
// the templates below, compared by compare(), which is not a template: the
// ~200 instantiations then hold only the training (this file compiles in
// two thirds of the time it took when each also held the comparison).
struct Trained {
  std::string label;
  std::vector<MemoryUsage> measured;  // per rank
  EstimateInputs in;
  bool has_activations = false;
};

// Compares every rank's measured memory with the estimate.
void compare(const Trained& t) {
  const MemoryUsage e = estimate_memory(t.in);
  ++worst.cases;
  for (std::size_t r = 0; r < t.measured.size(); ++r) {
    const MemoryUsage& m = t.measured[r];
    for (std::size_t c = 0; c < category_names.size(); ++c) {
      const std::string cat = category_names[c];
      if (cat == "gathered" || (cat == "activations" && !t.has_activations)) continue;
      const double d = rel_diff(category(e, c), category(m, c));
      BOOST_TEST(d <= tolerance, t.label << " rank " << r << " " << cat << ": estimate " << category(e, c)
                                         << " B, measured " << category(m, c) << " B");
      if (d > worst.diff[c]) worst.diff[c] = d, worst.where[c] = t.label;
    }
    // Gathered buffers: none outside FSDP, and never more than the estimate.
    BOOST_TEST(m.gathered <= e.gathered, t.label << " rank " << r << " gathered: estimate " << e.gathered
                                                 << " B below the measured " << m.gathered << " B");
    if (m.gathered != 0) {
      const double ratio = static_cast<double>(e.gathered) / static_cast<double>(m.gathered);
      worst.gathered_ratio_max = std::max(worst.gathered_ratio_max, ratio);
      worst.gathered_ratio_min = std::min(worst.gathered_ratio_min, ratio);
    }
  }
}

// Trains Case's model with Kind for two steps on n ranks and compares every
// rank's measured memory with the estimate.
template <class Case, class Kind, class Prec, int A, class Opt>
void check(int n, Opt opt, std::size_t optimizer_states) {
  using T = typename Prec::param_type;
  using R = typename Prec::reduce_type;
  const int group = hybrid_group(n);
  Trained t;
  t.measured.resize(static_cast<std::size_t>(n));
  run_ranks(n, [&](World& w) {
    typename Case::Net net = Case::make();
    if (w.rank() == 0) t.in.units = declared_units(net);
    TrainerOptions o{.seed = 7};
    Trainer<typename Case::Net, Device<Host>, Prec, Accumulate<A>, Strategy<Kind>> trainer(w, net, opt, o,
                                                                                           kind_options<Kind>(group));
    for (int step = 0; step < 2; ++step) {
      std::vector<Batch> mb;
      for (int k = 0; k < A; ++k)
        mb.push_back(random_batch(Case::features, Case::classes, Case::rows,
                                  static_cast<std::uint64_t>((step * 16 + w.rank()) * 4 + k)));
      trainer.step(mb);
    }
    t.measured[static_cast<std::size_t>(w.rank())] = trainer.memory();
  });
  t.in.compute_bytes = sizeof(T);
  t.in.reduce_bytes = sizeof(R);
  t.in.accumulate = A;
  t.in.strategy = std::string(Kind::name);
  t.in.world = n;
  t.in.shard_group = group;
  t.in.optimizer_states = optimizer_states;
  const std::optional<std::size_t> activations = Case::activations(sizeof(T));
  t.in.activations = activations.value_or(0);
  t.has_activations = activations.has_value();
  t.label = std::string(Case::name) + " " + std::string(Kind::name) + " world=" + std::to_string(n) +
            " group=" + std::to_string(group) + " T=" + std::to_string(sizeof(T)) + "B R=" + std::to_string(sizeof(R)) +
            "B A=" + std::to_string(A) + " states=" + std::to_string(optimizer_states);
  compare(t);
}

template <class Case, class Kind, class Prec, int A>
void check_optimizers(int n) {
  check<Case, Kind, Prec, A>(n, AdamW{.lr = 1e-3f}, 2);
  check<Case, Kind, Prec, A>(n, SGD{.lr = 0.05f, .momentum = 0.9f}, 1);
}

// Every world size, precision, accumulation and optimizer for one strategy.
template <class Kind>
void check_strategy() {
  for (int n : world_sizes<Kind>()) {
    [&]<class... Case>(std::tuple<Case...>*) {
      ((check_optimizers<Case, Kind, Precision<fp32>, 1>(n), check_optimizers<Case, Kind, Precision<fp32>, 2>(n),
        check_optimizers<Case, Kind, Precision<bf16>, 1>(n), check_optimizers<Case, Kind, Precision<bf16>, 2>(n),
        check_optimizers<Case, Kind, Precision<bf16, bf16>, 1>(n),
        check_optimizers<Case, Kind, Precision<bf16, bf16>, 2>(n)),
       ...);
    }(static_cast<std::tuple<MlpCase, UnevenCase, TiedCase>*>(nullptr));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(ddp_matches_the_measurement) { check_strategy<DDP>(); }
BOOST_AUTO_TEST_CASE(fsdp_full_shard_matches_the_measurement) { check_strategy<FSDP<FullShard>>(); }
BOOST_AUTO_TEST_CASE(fsdp_shard_grad_op_matches_the_measurement) { check_strategy<FSDP<ShardGradOp>>(); }
BOOST_AUTO_TEST_CASE(fsdp_no_shard_matches_the_measurement) { check_strategy<FSDP<NoShard>>(); }
BOOST_AUTO_TEST_CASE(fsdp_hybrid_shard_matches_the_measurement) { check_strategy<FSDP<HybridShard>>(); }
BOOST_AUTO_TEST_CASE(zero1_matches_the_measurement) { check_strategy<ZeRO1>(); }

// A GPT's activations (train_gpt's model: embeddings, 3 blocks, final
// LayerNorm, head) without activation checkpointing, with it on every block,
// on every second block and within a memory budget (one block's share below
// keeping everything: two blocks recomputed, the memory of every second
// block), 2 ranks, DDP and FSDP, fp32 and bf16: model_activation_bytes
// counts every buffer the Trainer sizes; what the allocator measures beyond
// it is the units' transient workspace, the same in every mode, so each
// saving is predicted to the byte. The parameters after two steps are the
// same in every mode, bit for bit.
template <class Kind, class Prec>
void check_gpt_activations() {
  using T = typename Prec::param_type;
  const SeqShape shape{4, 16};
  const std::int64_t vocab = 11;
  // What each block keeps for backward, and all units together.
  std::size_t block = 0, all = 0;
  {
    models::Gpt net(vocab, shape.time, 3, 4, 32);
    std::int64_t width = 0;
    dtrain::detail::for_each_unit(net.units(), [&](std::size_t u, auto& unit) {
      const auto s = static_cast<std::size_t>(dtrain::saved_size_of(unit, shape, width)) * sizeof(T);
      if (u == 2) block = s;  // the first block
      all += s;
      width = unit.out_features(width);
    });
  }
  BOOST_REQUIRE(block > 0);
  std::size_t measured[4] = {}, estimated[4] = {};
  std::map<std::string, std::vector<float>> params[4];
  for (const int mode : {0, 1, 2, 3}) {  // none, every block, every second block, a budget
    const bool recompute = mode > 0;
    const std::size_t every = mode == 2 ? 2 : 1;
    const std::size_t budget = mode == 3 ? all - block : 0;
    std::size_t m = 0, e = 0;
    run_ranks(2, [&](World& w) {
      models::Gpt net(vocab, shape.time, 3, 4, 32);
      TrainerOptions o{.seed = 3};
      o.activation_checkpointing = recompute;
      o.checkpoint_every = every;
      o.checkpoint_budget_bytes = budget;
      Trainer<models::Gpt, Device<Host>, Prec, Strategy<Kind>> trainer(w, net, AdamW{.lr = 1e-3f}, o);
      std::vector<std::int32_t> x, y;
      for (std::int64_t i = 0; i < shape.rows(); ++i) {
        x.push_back(static_cast<std::int32_t>((i * 7 + w.rank()) % vocab));
        y.push_back(static_cast<std::int32_t>((i * 5 + 1) % vocab));
      }
      Batch b;
      b.set("x", HostTensor::of(x, {shape.batch, shape.time}));
      b.set("y", HostTensor::of(y, {shape.batch, shape.time}));
      for (int step = 0; step < 2; ++step) trainer.step(std::span<const Batch>(&b, 1));
      auto p = trainer.parameters();
      if (w.rank() == 0) {
        m = trainer.memory().activations;
        e = model_activation_bytes(net, shape, 0, 2 * static_cast<std::size_t>(shape.rows()) * sizeof(std::int32_t),
                                   sizeof(T), recompute, every, {}, budget);
        params[mode] = std::move(p);
      }
    });
    measured[mode] = m;
    estimated[mode] = e;
    BOOST_TEST_MESSAGE("GPT " << Kind::name << " " << sizeof(T) << "-byte compute, checkpointing mode " << mode
                              << ": estimate " << e << " B, measured " << m << " B");
    BOOST_TEST(e <= m);
    BOOST_TEST(m - e < m / 2, "workspace beyond the estimate: " << m - e << " of " << m << " B");
    BOOST_TEST((params[mode] == params[0]), "checkpointing mode " << mode << " changed the parameters");
  }
  BOOST_TEST(measured[0] - measured[1] == estimated[0] - estimated[1]);
  BOOST_TEST(measured[0] - measured[2] == estimated[0] - estimated[2]);
  BOOST_TEST(measured[0] - measured[3] == estimated[0] - estimated[3]);
  BOOST_TEST(measured[0] - measured[3] == block);  // two blocks share one buffer
  BOOST_TEST(measured[3] == measured[2]);
  BOOST_TEST(measured[1] < measured[2]);
  BOOST_TEST(measured[2] < measured[0]);
}

BOOST_AUTO_TEST_CASE(gpt_activations_with_and_without_checkpointing) {
  check_gpt_activations<DDP, Precision<fp32>>();
  check_gpt_activations<DDP, Precision<bf16>>();
  check_gpt_activations<FSDP<FullShard>, Precision<fp32>>();
}

// Printed whatever the log level: the numbers the docs quote.
BOOST_AUTO_TEST_CASE(report) {
  if (worst.cases == 0) return;  // run alone: nothing was compared
  std::printf("estimate vs measurement over %d cases (each on every rank):\n", worst.cases);
  for (std::size_t c = 0; c < category_names.size(); ++c)
    if (category_names[c] != std::string("gathered"))
      std::printf("  %-11s max relative difference %.4g%s%s\n", category_names[c], worst.diff[c],
                  worst.where[c].empty() ? " (exact in every case)" : ", at ", worst.where[c].c_str());
  std::printf("  gathered    estimate / measured between %.3f and %.3f (an upper bound)\n", worst.gathered_ratio_min,
              worst.gathered_ratio_max);
}

BOOST_AUTO_TEST_CASE(bad_inputs_throw_config_errors) {
  EstimateInputs in;
  in.units = {{10, 0}};
  in.world = 4;
  in.strategy = "fsdp-hybrid";
  in.shard_group = 3;
  BOOST_CHECK_THROW(estimate_memory(in), config_error);
  in.strategy = "fsdp-everything";
  BOOST_CHECK_THROW(estimate_memory(in), config_error);
  in.strategy = "ddp";
  in.world = 0;
  BOOST_CHECK_THROW(estimate_memory(in), config_error);
}

#ifdef DTRAIN_ESTIMATE_PATH
namespace {

// The cells of the table row whose first cell is `strategy`.
std::vector<std::string> table_row(const std::string& out, const std::string& strategy) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> cells;
    std::istringstream parts(line);
    for (std::string cell; std::getline(parts, cell, '|');) {
      const auto b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
      if (b != std::string::npos) cells.push_back(cell.substr(b, e - b + 1));
    }
    if (!cells.empty() && cells[0] == strategy) return cells;
  }
  return {};
}

}  // namespace

// Mixed-precision FullShard with AdamW: 4 B master + 4 B gradient + 8 B Adam
// state per parameter, split 4 ways (1,000,000 divides by 4: no padding).
BOOST_AUTO_TEST_CASE(cli_full_shard_holds_16_bytes_per_parameter_over_the_world) {
  const auto [rc, out] = run_cli("--params 1000000 --world 4 --precision bf16");
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE_EQUAL(rc, 0);
  const auto cells = table_row(out, "fsdp-full");
  BOOST_REQUIRE_EQUAL(cells.size(), 8u);
  double model_states_mib = 0;
  for (std::size_t c = 1; c <= 4; ++c) model_states_mib += std::stod(cells[c]);  // params, grads, optimizer, master
  const double expected_mib = 16.0 * 1e6 / 4 / (1024.0 * 1024.0);
  BOOST_TEST(std::abs(model_states_mib - expected_mib) <= 0.01 * expected_mib,
             "fsdp-full model states " << model_states_mib << " MiB, expected " << expected_mib);
}

// Llama 3 8B's config.json: 8,030,261,248 parameters (the published count),
// in 35 units (embedding, 32 layers, final norm, head); FullShard over 8
// ranks in bf16 with AdamW holds 16 bytes per parameter / 8.
BOOST_AUTO_TEST_CASE(cli_reads_a_transformers_config) {
  const auto file = std::filesystem::path(DTRAIN_TEST_BINARY_DIR) / "llama3_8b_config.json";
  std::ofstream(file) << R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu",
    "tie_word_embeddings": false})";
  const auto [rc, out] = run_cli("--hf-config " + file.string() + " --world 8 --precision bf16");
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE_EQUAL(rc, 0);
  BOOST_TEST(out.find("8,030,261,248 parameters in 35 units") != std::string::npos, out);
  const auto cells = table_row(out, "fsdp-full");
  BOOST_REQUIRE_EQUAL(cells.size(), 8u);
  double model_states_mib = 0;
  for (std::size_t c = 1; c <= 4; ++c) model_states_mib += std::stod(cells[c]);
  const double expected_mib = 16.0 * 8030261248.0 / 8 / (1024.0 * 1024.0);
  BOOST_TEST(std::abs(model_states_mib - expected_mib) <= 0.001 * expected_mib, model_states_mib);

  const auto [bad_rc, bad] = run_cli("--hf-config " + file.string() + " --params 7B");
  BOOST_TEST(bad_rc == 2);
  BOOST_TEST(bad.find("more than one of --params, --config and --hf-config") != std::string::npos, bad);
}

BOOST_AUTO_TEST_CASE(cli_rejects_a_shard_group_that_does_not_divide_the_world) {
  const auto [rc, out] = run_cli("--params 1000000 --shard-group 3 --world 4 --strategy fsdp-hybrid");
  BOOST_TEST(rc == 2);
  BOOST_TEST(out.find("shard group of 3 ranks does not divide the world of 4 ranks") != std::string::npos, out);
  BOOST_TEST(out.find("fix:") != std::string::npos, out);
  BOOST_TEST(std::count(out.begin(), out.end(), '\n') == 1, "one line: " << out);
}

BOOST_AUTO_TEST_CASE(cli_reads_a_train_mlp_config_with_overrides) {
  const std::string config = std::string(DTRAIN_SOURCE_DIR) + "/examples/configs/ddp_host.yaml";
  const auto [rc, out] = run_cli("--config " + config + " --world 2 hidden=256,256 steps=5 --json");
  BOOST_REQUIRE_EQUAL(rc, 0);
  // Linear 32->256, 256->256, 256->10 with biases
  const std::size_t params = (32 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10);
  BOOST_TEST(out.find("\"parameters\": " + std::to_string(params)) != std::string::npos, out);
  const auto [missing_rc, missing] = run_cli("--config /nonexistent.yaml --world 2");
  BOOST_TEST(missing_rc == 2);
  BOOST_TEST(missing.find("does not exist") != std::string::npos, missing);
}

// A train_gpt config's activation checkpointing within a budget: the
// summary says so, the activations fall between keeping everything and
// recomputing every block, and a budget below one block's share is refused
// with the least that works.
BOOST_AUTO_TEST_CASE(cli_reads_a_checkpoint_budget) {
  const std::string config =
      std::string(DTRAIN_SOURCE_DIR) + "/examples/configs/gpt_host.yaml --example gpt --world 2 n_layer=4";
  const auto activations = [&](const std::string& extra) -> double {
    const auto [rc, text] = run_cli("--config " + config + " " + extra + " --json");
    BOOST_TEST_REQUIRE(rc == 0, text);
    const auto at = text.find("\"activations\": ");
    BOOST_TEST_REQUIRE(at != std::string::npos, text);
    return std::stod(text.substr(at + 15));
  };
  const double none = activations(""), every = activations("activation_checkpointing=true");
  // none - every is what the units keep less one block's share: a budget of
  // that recomputes two or three of the four blocks
  const double budget =
      activations("activation_checkpointing=true checkpoint_budget_mib=" + std::to_string((none - every) / 1048576.0));
  const auto [said_rc, said] =
      run_cli("--config " + config + " activation_checkpointing=true checkpoint_budget_mib=20");
  BOOST_TEST(said_rc == 0);
  BOOST_TEST(said.find("activation checkpointing within 20971520 bytes") != std::string::npos, said);
  BOOST_TEST(every < budget);
  BOOST_TEST(budget < none);
  const auto [bad_rc, bad] =
      run_cli("--config " + config + " activation_checkpointing=true checkpoint_budget_mib=0.000001");
  BOOST_TEST(bad_rc == 2);
  BOOST_TEST(bad.find("is below what one unit keeps for backward") != std::string::npos, bad);
}

// A train_lm config (--example lm): the model from its config= file with
// the preset's adapters; without lora_ keys every parameter trains.
BOOST_AUTO_TEST_CASE(cli_reads_a_train_lm_config) {
  const auto file = std::filesystem::path(DTRAIN_TEST_BINARY_DIR) / "tiny_gpt2_config.json";
  std::ofstream(file) << R"({"model_type": "gpt2", "vocab_size": 300, "n_embd": 64, "n_layer": 2, "n_head": 4,
    "n_positions": 128, "activation_function": "gelu_new", "tie_word_embeddings": true})";
  const std::string preset = std::string(DTRAIN_SOURCE_DIR) + "/examples/configs/lm_lora_gpu.yaml";
  const auto [rc, out] =
      run_cli("--config " + preset + " --example lm --world 2 block_size=64 config=" + file.string());
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE_EQUAL(rc, 0);
  const std::string source = " (gpt2, 2 layers x 64, 64 positions, vocabulary 300, LoRA rank 16)";
  BOOST_TEST(out.find("train_lm config " + preset + source) != std::string::npos, out);
  // 2 layers x (c_attn 64x192 + c_proj 64x64 + c_fc 64x256 + mlp c_proj 256x64) adapters of rank 16
  // = 32,768
  BOOST_TEST(2 * 16 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64)) == 32768);
  BOOST_TEST(out.find("(32,768 trainable)") != std::string::npos, out);
  const auto [full_rc, full] =
      run_cli("--config " + preset + " --example lm --world 2 lora_r=0 lora_targets=[] config=" + file.string());
  BOOST_REQUIRE_EQUAL(full_rc, 0);
  BOOST_TEST(full.find("LoRA") == std::string::npos, full);
  const auto [bad_rc, bad] = run_cli("--config " + preset + " --example lm --world 2");
  BOOST_TEST(bad_rc == 2);
  BOOST_TEST(bad.find("a train_lm config needs one of model and config") != std::string::npos, bad);
}

// --offload all: every strategy with each offload it supports (params only
// for the FSDP modes); the offloaded row moves FullShard's 16 bytes per
// parameter / 4 to the device's 2 / 4 and the host's 18 / 4.
BOOST_AUTO_TEST_CASE(cli_offload_splits_device_and_host) {
  const auto [rc, out] = run_cli("--params 1000000 --world 4 --precision bf16 --offload all --json");
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE_EQUAL(rc, 0);
  BOOST_TEST(std::count(out.begin(), out.end(), '{') == 2 + 16 * 2, "16 rows with a host object each: " << out);
  const std::string full_optimizer =
      "\"strategy\": \"fsdp-full\", \"offload\": \"optimizer\", \"params\": 500000, "
      "\"grads\": 0, \"optimizer\": 0, \"master\": 0";
  BOOST_TEST(out.find(full_optimizer) != std::string::npos, out);
  BOOST_TEST(out.find("\"host\": {\"params\": 500000, \"grads\": 1000000, \"optimizer\": 2000000, \"master\": "
                      "1000000, \"total\": 4500000}") != std::string::npos,
             out);
  const auto [bad_rc, bad] = run_cli("--params 1000000 --strategy ddp --offload params");
  BOOST_TEST(bad_rc == 2);
  BOOST_TEST(bad.find("offload 'params' with strategy 'ddp'") != std::string::npos, bad);
}

// --state-on-disk: the optimizer state (FullShard, AdamW: 8 bytes per
// parameter / 4 ranks) leaves host memory for files: the JSON's "disk" and
// the table's last column; without an offload it is a usage error.
BOOST_AUTO_TEST_CASE(cli_state_on_disk_moves_the_optimizer_state_to_files) {
  const std::string args =
      "--params 1000000 --world 4 --precision bf16 --strategy fsdp-full --offload optimizer "
      "--state-on-disk";
  const auto [rc, out] = run_cli(args + " --json");
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE_EQUAL(rc, 0);
  BOOST_TEST(out.find("\"host\": {\"params\": 500000, \"grads\": 1000000, \"optimizer\": 0, \"master\": 1000000, "
                      "\"total\": 2500000}, \"disk\": 2000000}") != std::string::npos,
             out);
  const auto [table_rc, table] = run_cli(args);
  BOOST_REQUIRE_EQUAL(table_rc, 0);
  BOOST_TEST(table.find("| disk (optimizer state) |") != std::string::npos, table);
  // 2,000,000 bytes = 1.91 MiB on disk, 2,500,000 = 2.38 MiB in host memory
  BOOST_TEST(table.find("2.38 |                   1.91 |") != std::string::npos, table);
  const auto [bad_rc, bad] = run_cli("--params 1000000 --state-on-disk");
  BOOST_TEST(bad_rc == 2);
  BOOST_TEST(bad.find("--state-on-disk without an offload") != std::string::npos, bad);
}
#endif
