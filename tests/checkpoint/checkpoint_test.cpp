// Checkpoints: saved at N ranks under any strategy, loaded at M ranks under
// any strategy, training continues as if never interrupted; verification,
// model checks and pretrained weights. Ranks are threads of this process over
// real Gloo communicators, files are real.
#define BOOST_TEST_MODULE checkpoint
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "save_loop_model.hpp"
#include "support/strategy_options.hpp"
#include <boost/test/unit_test.hpp>
#include <launch/process.hpp>
#include <strategy/common.hpp>

using namespace dtrain;
using namespace dtrain::testing;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(DTRAIN_TEST_BINARY_DIR) / "scratch" / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

constexpr std::int64_t global_rows = 12;  // every step; split evenly over 1, 2, 3 or 4 ranks

// Step s's micro-batches for rank r of n: the same 12 global rows whatever n is.
std::vector<Batch> step_batches(int s, int rank, int n, int micro) {
  const std::int64_t per_rank = global_rows / n, per_micro = per_rank / micro;
  std::vector<Batch> out;
  for (int k = 0; k < micro; ++k) out.push_back(rows_of(s, rank * per_rank + k * per_micro, per_micro));
  return out;
}

// Every strategy, to save under and to load under.
using Kinds = std::tuple<DDP, FSDP<FullShard>, FSDP<ShardGradOp>, FSDP<NoShard>, FSDP<HybridShard>, ZeRO1>;

template <class Kind, class Opt, class... Ps>
using Net = Trainer<UnevenNet, Device<Host>, Strategy<Kind>, Ps...>;

// HybridShard's group at n ranks (0: LOCAL_WORLD_SIZE).
int group_for(int n) { return n == 4 ? 2 : 0; }

// Trains `steps` steps from the start (or from `resume`), optionally saving
// after `save_after` steps into `save_dir`; returns rank 0's parameters.
template <class Kind, class Opt, class Prec = Precision<fp32>>
Params run(int n, Opt opt, int first_step, int last_step, const fs::path& resume = {}, int save_after = -1,
           const fs::path& save_dir = {}) {
  Params out;
  std::mutex mu;
  run_ranks(n, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Device<Host>, Strategy<Kind>, Prec> t(w, net, opt, {.seed = 11},
                                                             kind_options<Kind>(group_for(n)));
    if (!resume.empty()) {
      const auto info = t.load(resume);
      require(info.step == first_step, "loaded step " + std::to_string(info.step));
      require(t.steps_taken() == first_step, "steps_taken after load");
    }
    for (int s = first_step; s < last_step; ++s) {
      t.step(step_batches(s, w.rank(), n, 1));
      if (s + 1 == save_after) t.save(save_dir);
    }
    auto p = t.parameters();
    std::lock_guard lock(mu);
    if (w.rank() == 0) out = std::move(p);
  });
  return out;
}

// f(std::type_identity<Kind>{}, index of Kind in Kinds) for every kind.
template <class F>
void for_each_kind(F&& f) {
  [&]<class... K>(std::type_identity<std::tuple<K...>>) {
    int i = 0;
    (f(std::type_identity<K>{}, i++), ...);
  }(std::type_identity<Kinds>{});
}

}  // namespace

// Same world size and strategy: resuming at step 2 and training to step 4 is
// bit-identical to training to step 4 at once, for every strategy.
BOOST_AUTO_TEST_CASE(resume_at_the_same_world_size_is_bit_identical) {
  for_each_kind([]<class Kind>(std::type_identity<Kind>, int) {
    for (int n : {1, 3}) {
      const auto dir = scratch(std::string("same_") + std::string(Kind::name) + "_" + std::to_string(n));
      const auto adam = AdamW{.lr = 1e-2f};
      const Params straight = run<Kind>(n, adam, 0, 4);
      run<Kind>(n, adam, 0, 2, {}, 2, dir);
      const Params resumed = run<Kind>(n, adam, 2, 4, dir);
      BOOST_TEST((resumed == straight), Kind::name << " at " << n << " ranks: resumed run differs");
    }
  });
}

// Saved at N ranks under strategy A, loaded at M ranks under
// strategy B, training continues as the uninterrupted run at M ranks under B
// does (the same rows each step; fp32 sums in another order: 1e-5). Every
// (strategy, N, M) saves once and loads under a strategy that rotates with
// them, so each strategy saves and loads at every pair of world sizes.
BOOST_AUTO_TEST_CASE(saved_at_n_ranks_loads_at_m_ranks_under_any_strategy) {
  const auto sgd = SGD{.lr = 0.1f, .momentum = 0.9f};
  std::map<std::pair<int, int>, Params> straight;  // (load kind, m) -> uninterrupted run
  for_each_kind([&]<class Save>(std::type_identity<Save>, int save_index) {
    for (int n : {1, 2, 3}) {
      const auto dir = scratch(std::string("resave_") + std::string(Save::name) + "_" + std::to_string(n));
      run<Save>(n, sgd, 0, 2, {}, 2, dir);
      for (int m : {1, 2, 3})
        for_each_kind([&]<class Load>(std::type_identity<Load>, int load_index) {
          if ((save_index + n + m + load_index) % std::tuple_size_v<Kinds> != 0) return;
          auto& want = straight[{load_index, m}];
          if (want.empty()) want = run<Load>(m, sgd, 0, 4);
          const Params resumed = run<Load>(m, sgd, 2, 4, dir);
          std::string where;
          const double d = max_rel_diff(resumed, want, &where);
          BOOST_TEST(d <= 1e-5,
                     Save::name << " at " << n << " -> " << Load::name << " at " << m << ": " << d << " at " << where);
        });
    }
  });
}

namespace {

// Saves a 2-step FSDP AdamW checkpoint at 2 ranks into `dir` (consolidated or not).
void save_two_steps(const fs::path& dir, bool consolidated = false) {
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net<FSDP<FullShard>, AdamW> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 5});
    for (int s = 0; s < 2; ++s) t.step(step_batches(s, w.rank(), 2, 1));
    t.save(dir, {.consolidated = consolidated});
  });
}

// Loads `dir` at 2 ranks; returns the first error's text ("" when it
// loaded) and checks that a failed load left the parameters untouched.
std::string load_error(const fs::path& dir) {
  std::string message;
  std::mutex mu;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net<FSDP<FullShard>, AdamW> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 5});
    const auto before = t.parameters();
    try {
      t.load(dir);
    } catch (const error& e) {
      require(t.parameters() == before, "a failed load changed parameters");
      std::lock_guard lock(mu);
      if (message.empty()) message = e.what();
    }
  });
  return message;
}

fs::path copy_of(const fs::path& dir, const std::string& name) {
  const auto out = scratch(name);
  fs::copy(dir, out, fs::copy_options::recursive);
  return out;
}

void flip_byte(const fs::path& file, std::uintmax_t from_end) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-static_cast<std::streamoff>(from_end), std::ios::end);
  char c = 0;
  f.read(&c, 1);
  f.seekp(-static_cast<std::streamoff>(from_end), std::ios::end);
  c = static_cast<char>(c ^ 0x10);
  f.write(&c, 1);
}

}  // namespace

// A bit flip, a truncation, a missing file or a damaged index is reported
// naming the file (and the piece), and nothing is loaded.
BOOST_AUTO_TEST_CASE(damaged_checkpoints_are_rejected_naming_the_file) {
  const auto good = scratch("good");
  save_two_steps(good);
  BOOST_TEST(load_error(good).empty());
  const std::string shard = "shard-00001-of-00002.safetensors";

  const auto flipped = copy_of(good, "flipped");
  flip_byte(flipped / shard, 5);  // inside the data section
  auto e = load_error(flipped);
  BOOST_TEST_INFO(e);
  BOOST_TEST(e.find(shard) != std::string::npos);
  BOOST_TEST(e.find("fails its checksum") != std::string::npos);
  BOOST_TEST(e.find("piece '") != std::string::npos);

  const auto truncated = copy_of(good, "truncated");
  fs::resize_file(truncated / shard, fs::file_size(truncated / shard) - 7);
  e = load_error(truncated);
  BOOST_TEST_INFO(e);
  BOOST_TEST(e.find(shard) != std::string::npos);
  BOOST_TEST(e.find("(truncated)") != std::string::npos);

  const auto missing = copy_of(good, "missing");
  fs::remove(missing / shard);
  e = load_error(missing);
  BOOST_TEST_INFO(e);
  BOOST_TEST(e.find(shard + "' is missing") != std::string::npos);

  const auto bad_index = copy_of(good, "bad_index");
  fs::resize_file(bad_index / "index.json", 100);
  e = load_error(bad_index);
  BOOST_TEST_INFO(e);
  BOOST_TEST(e.find("index.json' is not a valid dtrain checkpoint index") != std::string::npos);

  e = load_error(scratch("never_saved"));
  BOOST_TEST_INFO(e);
  BOOST_TEST(e.find("is not a checkpoint") != std::string::npos);
}

// A checkpoint of another model fails before anything is touched, naming the
// first tensor that differs.
BOOST_AUTO_TEST_CASE(a_checkpoint_of_another_model_is_refused_naming_the_tensor) {
  const auto dir = scratch("other_model");
  save_two_steps(dir);
  struct Wider {
    nn::Linear l1{features, 15};
    nn::LayerNorm ln{15};
    nn::GELU act;
    nn::Linear frozen{15, 16, {.bias = true, .trainable = false}};
    nn::ReLU relu;
    nn::Linear l2{16, 18};
    nn::GELU act2;
    nn::Linear head{18, classes};
    nn::SoftmaxCrossEntropy loss;
    auto units() { return std::tie(l1, ln, act, frozen, relu, l2, act2, head); }
  };
  std::string message;
  run_ranks(1, [&](World& w) {
    Wider net;
    Trainer<Wider, Device<Host>, Strategy<DDP>> t(w, net, AdamW{.lr = 1e-2f});
    const auto before = t.parameters();
    try {
      t.load(dir);
    } catch (const config_error& e) {
      message = e.what();
    }
    require(t.parameters() == before, "a refused load changed parameters");
  });
  BOOST_TEST_INFO(message);
  BOOST_TEST(message.find("saved for a different model: tensor '5.weight' is [17, 16] in the checkpoint and [18, 16] "
                          "in this model") != std::string::npos);
}

// The optimizer state must match, unless the caller keeps its own.
BOOST_AUTO_TEST_CASE(another_optimizers_state_is_refused_unless_skipped) {
  const auto dir = scratch("adam_state");
  save_two_steps(dir);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net<ZeRO1, SGD> t(w, net, SGD{.lr = 0.1f, .momentum = 0.9f}, {.seed = 5});
    try {
      t.load(dir);
      require(false, "an AdamW checkpoint loaded into SGD");
    } catch (const config_error& e) {
      require(std::string(e.what()).find("holds adamw state (exp_avg, exp_avg_sq) but this trainer's optimizer "
                                         "keeps (momentum_buffer)") != std::string::npos,
              e.what());
    }
    const auto info = t.load(dir, {.optimizer_state = false});
    require(info.step == 2 && t.steps_taken() == 2, "parameters and step load without the optimizer state");
  });
}

// Every integer of the index is range-checked: a float where an integer
// belongs, or a value its type cannot hold, is a checkpoint_error naming the
// field, never a silent conversion (a float such as 7e90 was undefined
// behaviour before; found by fuzzing).
BOOST_AUTO_TEST_CASE(an_index_integer_out_of_range_is_an_error_naming_the_field) {
  const auto good = scratch("index_integers");
  save_two_steps(good);
  std::stringstream text;
  text << std::ifstream(good / "index.json").rdbuf();
  const std::pair<const char*, const char*> cases[] = {
      {R"("format_version": \d+)", R"("format_version": 7e90)"},
      {R"("step": \d+)", R"("step": 1.5)"},
      {R"("world_size": \d+)", R"("world_size": 4294967296)"},
      {R"("count": \d+)", R"("count": -1)"},
  };
  for (const auto& [pattern, bad] : cases) {
    const std::string damaged =
        std::regex_replace(text.str(), std::regex(pattern), bad, std::regex_constants::format_first_only);
    BOOST_REQUIRE(damaged != text.str());
    const auto dir = scratch("index_integers_bad");
    fs::create_directories(dir);
    std::ofstream(dir / "index.json") << damaged;
    const std::string field = std::string(bad).substr(0, std::string(bad).find(':'));
    std::string message;
    try {
      (void)checkpoint_info(dir);
    } catch (const checkpoint_error& e) {
      message = e.what();
    }
    BOOST_TEST_INFO(bad << " -> " << message);
    BOOST_TEST(message.find(field + " is ") != std::string::npos);
    BOOST_TEST(message.find("where an integer from") != std::string::npos);
  }
  // So is a learning rate beyond float's range (undefined behaviour before).
  const std::string damaged = std::regex_replace(text.str(), std::regex(R"("lr": [^,]+)"), R"("lr": 1e300)",
                                                 std::regex_constants::format_first_only);
  BOOST_REQUIRE(damaged != text.str());
  const auto dir = scratch("index_numbers_bad");
  fs::create_directories(dir);
  std::ofstream(dir / "index.json") << damaged;
  BOOST_CHECK_EXCEPTION((void)checkpoint_info(dir), checkpoint_error, [](const checkpoint_error& e) {
    return std::string(e.what()).find("\"lr\" is 1e+300") != std::string::npos &&
           std::string(e.what()).find("where a finite number belongs") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(a_directory_holding_a_checkpoint_is_never_overwritten) {
  const auto dir = scratch("twice");
  save_two_steps(dir);
  const auto index = fs::last_write_time(dir / "index.json");
  std::string message;
  try {
    save_two_steps(dir);
  } catch (const checkpoint_error& e) {
    message = e.what();
  }
  BOOST_TEST_INFO(message);
  BOOST_TEST(message.find("already holds a checkpoint (step 2)") != std::string::npos);
  BOOST_TEST((fs::last_write_time(dir / "index.json") == index));
  // A directory a save died in (no index) is reused, its leftovers cleared.
  const auto died = scratch("died");
  fs::create_directories(died);
  std::ofstream(died / "shard-00007-of-00009.safetensors.tmp") << "partial";
  std::ofstream(died / "notes.txt") << "the user's";
  save_two_steps(died);
  BOOST_TEST(!fs::exists(died / "shard-00007-of-00009.safetensors.tmp"));
  BOOST_TEST(fs::exists(died / "notes.txt"));
  BOOST_TEST(load_error(died).empty());
}

// A consolidated save writes model.safetensors: every parameter in F32 under
// its name and shape, equal to the trainer's parameters; it resumes too.
BOOST_AUTO_TEST_CASE(consolidated_save_writes_a_plain_model_file) {
  const auto dir = scratch("consolidated");
  Params want;
  run_ranks(3, [&](World& w) {
    UnevenNet net;
    Net<FSDP<FullShard>, AdamW, Precision<bf16>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 5});
    for (int s = 0; s < 2; ++s) t.step(step_batches(s, w.rank(), 3, 1));
    t.save(dir, {.consolidated = true});
    auto p = t.parameters();
    if (w.rank() == 0) want = std::move(p);
  });
  const auto file = SafetensorsFile::open(dir / "model.safetensors");
  BOOST_TEST(file.names().size() == want.size());
  for (const auto& [name, values] : want) {
    const auto t = file.tensor(name);
    BOOST_TEST_INFO(name);
    BOOST_TEST((t.dtype == element_type::f32));
    BOOST_TEST((file.read_f32(name) == values));
  }
  BOOST_TEST((file.tensor("5.weight").shape == std::vector<std::int64_t>{17, 16}));
  const auto shard = SafetensorsFile::open(dir / "shard-00001-of-00003.safetensors");
  for (const auto& n : shard.names())
    BOOST_TEST(!n.starts_with("param/"), n << ": parameters belong in model.safetensors");
  Params loaded;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net<DDP, AdamW, Precision<bf16>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 99});
    t.load(dir);
    auto p = t.parameters();
    if (w.rank() == 0) loaded = std::move(p);
  });
  BOOST_TEST((loaded == want));
}

// fp16's loss scale and good-step count come back with the checkpoint.
BOOST_AUTO_TEST_CASE(loss_scale_and_step_are_restored) {
  const auto dir = scratch("fp16");
  float scale = 0;
  std::int64_t steps = 0;  // skipped steps (fp16 overflow) do not count
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    TrainerOptions o{.seed = 5};
    o.loss_scale = {.initial = 1e12f, .growth = 2.f, .backoff = 0.5f, .window = 3};
    Net<FSDP<ShardGradOp>, AdamW, Precision<fp16>> t(w, net, AdamW{.lr = 1e-2f}, o);
    StepStats st;
    for (int s = 0; s < 60 && t.steps_taken() < 2; ++s) st = t.step(step_batches(s, w.rank(), 2, 1));
    t.save(dir);
    if (w.rank() == 0) scale = st.loss_scale, steps = t.steps_taken();
  });
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Net<DDP, AdamW, Precision<fp16>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 5});
    const auto info = t.load(dir);
    require(steps > 0 && info.step == steps && t.steps_taken() == steps, "step " + std::to_string(info.step));
    require(static_cast<float>(info.loss_scale) == scale, "loss scale " + std::to_string(info.loss_scale));
  });
}

namespace {

// A pretrained file: the backbone of UnevenNet (units 0-3) in `dtype`, its
// names optionally prefixed, plus a tensor the model lacks.
fs::path pretrained_file(const std::string& name, element_type dtype, const std::string& prefix, Params& values) {
  Params all;
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Net<DDP, SGD> t(w, net, SGD{.lr = 0.1f}, {.seed = 1234});
    all = t.parameters();
  });
  const auto path = scratch(name + ".safetensors");
  SafetensorsWriter writer;
  std::vector<std::vector<std::uint16_t>> halves;
  halves.reserve(16);
  for (const char* n : {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"}) {
    auto& v = all.at(n);
    std::vector<std::int64_t> shape = std::string(n).ends_with("bias") || std::string(n).starts_with("1.")
                                          ? std::vector<std::int64_t>{static_cast<std::int64_t>(v.size())}
                                          : std::vector<std::int64_t>{n[0] == '0' ? 15 : 16, n[0] == '0' ? 7 : 15};
    if (dtype == element_type::f32) {
      writer.add(prefix + n, shape, v);
    } else {
      auto& h = halves.emplace_back(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        h[i] = dtype == element_type::bf16 ? bf16(v[i]).bits : fp16(v[i]).bits;
        v[i] = dtype == element_type::bf16 ? static_cast<float>(bf16(v[i])) : static_cast<float>(fp16(v[i]));
      }
      writer.add(prefix + n, dtype, shape, std::as_bytes(std::span(h)));
    }
    values[n] = v;
  }
  static const std::vector<float> extra(3, 1.f);
  writer.add(prefix + "9.weight", {3}, extra);
  writer.write(path);
  return path;
}

}  // namespace

// Strict loading lists every missing, unexpected and mis-shaped tensor at
// once; non-strict loads what matches (a pretrained backbone, a fresh head),
// at any world size and strategy, from F32, BF16 or F16, through a name map.
BOOST_AUTO_TEST_CASE(load_params_strict_and_non_strict) {
  Params backbone;
  const auto f32 = pretrained_file("backbone", element_type::f32, "", backbone);
  std::string strict_error;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net<FSDP<FullShard>, AdamW> t(w, net, AdamW{}, {.seed = 7});
    try {
      t.load_params(f32);
    } catch (const config_error& e) {
      if (w.rank() == 0) strict_error = e.what();
    }
  });
  BOOST_TEST_INFO(strict_error);
  BOOST_TEST(strict_error.find("missing 5.weight, 5.bias, 7.weight, 7.bias;") != std::string::npos);
  BOOST_TEST(strict_error.find("unexpected 9.weight;") != std::string::npos);

  for (const auto dtype : {element_type::f32, element_type::bf16, element_type::f16}) {
    Params want;
    const auto file = pretrained_file("prefixed", dtype, "backbone.", want);
    LoadParamsOptions o{.strict = false};
    for (const auto& [name, v] : want) o.rename["backbone." + name] = name;
    run_ranks(3, [&](World& w) {
      UnevenNet net;
      Net<ZeRO1, AdamW> t(w, net, AdamW{}, {.seed = 7});
      const auto before = t.parameters();
      const auto report = t.load_params(file, o);
      require(report.loaded.size() == 6 && report.missing.size() == 4 && report.unexpected.size() == 1 &&
                  report.mismatched.empty(),
              "report sizes");
      const auto after = t.parameters();
      for (const auto& [name, v] : want) require(after.at(name) == v, name + " was not loaded");
      require(after.at("7.weight") == before.at("7.weight"), "the fresh head changed");
    });
  }
}

BOOST_AUTO_TEST_CASE(load_params_reports_mis_shaped_tensors) {
  const auto path = scratch("misshaped.safetensors");
  const std::vector<float> v(17 * 15, 0.5f);
  SafetensorsWriter writer;
  writer.add("5.weight", {15, 17}, v);
  writer.write(path);
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Net<DDP, AdamW> t(w, net, AdamW{});
    const auto report = t.load_params(path, {.strict = false});
    require(report.mismatched.size() == 1 &&
                report.mismatched[0] == "5.weight: [15, 17] F32 in the file, [17, 16] in the model",
            report.mismatched.empty() ? "none" : report.mismatched[0]);
  });
}

// The sampler's global order does not depend on the world size: the ranks'
// samples interleaved (rank r takes every W-th) are one sequence, so a
// position saved at 2 ranks continues the same sequence at 3.
BOOST_AUTO_TEST_CASE(sampler_order_is_independent_of_the_world_size) {
  const std::int64_t n = 60;
  auto global_order = [&](int world) {
    std::vector<std::int64_t> out(static_cast<std::size_t>(n));
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(n, r, world, {.shuffle = true, .seed = 3});
      const auto idx = s.indices();
      for (std::size_t i = 0; i < idx.size(); ++i)
        out[i * static_cast<std::size_t>(world) + static_cast<std::size_t>(r)] = idx[i];
    }
    return out;
  };
  BOOST_TEST((global_order(2) == global_order(3)));
  BOOST_TEST((global_order(1) == global_order(4)));

  std::vector<DistributedSampler> two, three;
  for (int r = 0; r < 2; ++r) two.emplace_back(n, r, 2, SamplerOptions{.shuffle = true, .seed = 3});
  for (auto& s : two) s.next(9);  // 18 samples consumed over both ranks
  const auto progress = SamplerProgress::of(two[0]);
  BOOST_TEST(progress.global_position == 18);
  std::vector<std::int64_t> next2, next3;
  for (auto& s : two) {
    const auto v = s.next(6);
    next2.insert(next2.end(), v.begin(), v.end());
  }
  for (int r = 0; r < 3; ++r) {
    DistributedSampler s(n, r, 3, {.shuffle = true, .seed = 3});
    s.load_state(progress.state_for(s));
    const auto v = s.next(4);
    next3.insert(next3.end(), v.begin(), v.end());
  }
  std::ranges::sort(next2);
  std::ranges::sort(next3);
  BOOST_TEST((next2 == next3));  // the same 12 samples next, whichever world size
  DistributedSampler four(n, 0, 4, {.shuffle = true, .seed = 3});
  const SamplerProgress at18{.epoch = 0, .global_position = 18, .dataset_size = n, .seed = 3};
  BOOST_CHECK_THROW(at18.state_for(four), config_error);  // 18 samples do not split over 4 ranks
}

// latest_checkpoint skips saves that died (no index); prune_checkpoints keeps
// the newest K complete ones and removes dead saves older than the newest.
BOOST_AUTO_TEST_CASE(latest_and_keep_last) {
  const auto parent = scratch("series");
  for (int step : {1, 2, 3}) {
    const auto dir = checkpoint_path(parent, step);
    run_ranks(1, [&](World& w) {
      UnevenNet net;
      Net<DDP, SGD> t(w, net, SGD{.lr = 0.1f});
      for (int s = 0; s < step; ++s) t.step(step_batches(s, 0, 1, 1));
      t.save(dir);
    });
  }
  fs::create_directories(checkpoint_path(parent, 0));  // died long ago
  fs::create_directories(checkpoint_path(parent, 4));  // dying now
  BOOST_TEST(latest_checkpoint(parent).value() == checkpoint_path(parent, 3));
  BOOST_TEST(list_checkpoints(parent).size() == 3u);
  prune_checkpoints(parent, 2);
  BOOST_TEST(!fs::exists(checkpoint_path(parent, 1)));
  BOOST_TEST(fs::exists(checkpoint_path(parent, 2)));
  BOOST_TEST(fs::exists(checkpoint_path(parent, 3)));
  BOOST_TEST(!fs::exists(checkpoint_path(parent, 0)));
  BOOST_TEST(fs::exists(checkpoint_path(parent, 4)));
  BOOST_TEST(!latest_checkpoint(scratch("empty")).has_value());
}

// A process saving checkpoints is killed with SIGKILL at 20 or more random moments:
// every time, the newest complete checkpoint loads and verifies, and some
// kills land inside a save (a step directory without an index, or a .tmp).
// The moment is drawn within one period of the loop (step + save), measured
// between its first two commits, so the kills cover the whole period however
// fast the build runs (a sanitizer build runs the loop many times slower).
BOOST_AUTO_TEST_CASE(kill_9_at_any_moment_of_a_save_leaves_a_loadable_checkpoint) {
  std::mt19937 rng(20261123);
  int mid_save = 0, i = 0;
  // 20 kills, and up to 40 more until one lands inside a save.
  for (; i < 60 && (i < 20 || mid_save == 0); ++i) {
    const auto dir = scratch("killed_" + std::to_string(i));
    dtrain::test::Process child({SAVE_LOOP_PATH, dir.string()});
    BOOST_REQUIRE_MESSAGE(dtrain::test::wait_until([&] { return latest_checkpoint(dir).has_value(); }, 60),
                          "the save loop never committed a checkpoint: " << child.stderr_so_far());
    const auto first = latest_checkpoint(dir);
    const auto committed = std::chrono::steady_clock::now();
    BOOST_REQUIRE_MESSAGE(dtrain::test::wait_until([&] { return latest_checkpoint(dir) != first; }, 60),
                          "the save loop never committed a second checkpoint: " << child.stderr_so_far());
    const auto period =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - committed);
    std::this_thread::sleep_for(std::chrono::microseconds(
        std::uniform_int_distribution<std::int64_t>(0, std::max<std::int64_t>(period.count(), 1))(rng)));
    ::kill(child.pid(), SIGKILL);
    const auto finished = child.wait(30);
    BOOST_REQUIRE(finished.killed_by(SIGKILL));
    bool partial = false;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      partial |= e.path().extension() == ".tmp" || (e.is_directory() && !is_checkpoint(e.path()));
    mid_save += partial ? 1 : 0;
    const auto latest = latest_checkpoint(dir);
    BOOST_REQUIRE_MESSAGE(latest.has_value(), "kill " << i << " left no complete checkpoint");
    run_ranks(1, [&](World& w) {
      SaveLoopNet net;
      Trainer<SaveLoopNet, Device<Host>, Strategy<ZeRO1>> t(w, net, AdamW{.lr = 1e-3f}, {.seed = 1});
      const auto info = t.load(*latest);
      require(info.step >= 1, "loaded step " + std::to_string(info.step));
    });
  }
  BOOST_TEST_MESSAGE(mid_save << " of " << i << " kills landed inside a save");
  BOOST_TEST(mid_save >= 1);
}

// Saved in bf16 (frozen parameters stored as BF16), loaded in fp32 and in
// fp16: master weights are fp32 either way; frozen values convert.
BOOST_AUTO_TEST_CASE(a_checkpoint_loads_under_another_precision) {
  const auto dir = scratch("bf16_saved");
  Params saved;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net<FSDP<FullShard>, AdamW, Precision<bf16>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 8});
    for (int s = 0; s < 2; ++s) t.step(step_batches(s, w.rank(), 2, 1));
    t.save(dir);
    auto p = t.parameters();
    if (w.rank() == 0) saved = std::move(p);
  });
  run_ranks(3, [&](World& w) {
    UnevenNet net;
    Net<ZeRO1, AdamW, Precision<fp32>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 1});
    t.load(dir);
    require(t.parameters() == saved, "fp32 after a bf16 checkpoint: parameters differ");
  });
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Net<DDP, AdamW, Precision<fp16>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 1});
    t.load(dir);
    const auto p = t.parameters();
    for (const auto& [name, v] : saved)
      for (std::size_t i = 0; i < v.size(); ++i)
        require(name.starts_with("3.") ? std::abs(p.at(name)[i] - v[i]) <= 1e-3f * std::max(1.f, std::abs(v[i]))
                                       : p.at(name)[i] == v[i],
                name + " after loading into fp16");
  });
}
