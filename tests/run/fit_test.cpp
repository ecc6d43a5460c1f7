// dtrain::fit (run/fit.hpp) at 2 ranks: a run with periodic checkpoints,
// pruning, evaluation with a metric and a metrics file; the same program
// run again (resume = latest, nothing left to train); a run stopped and
// resumed equal bit for bit to one that was not; early stop; stop requests
// from one rank only; and bad options.
#define BOOST_TEST_MODULE fit
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "strategy/common.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/run/fit.hpp>
#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;
namespace fs = std::filesystem;

namespace {

// 96 rows of random non-zero features, labels from a fixed linear rule (so
// accuracy can rise).
Dataset make_data(std::uint64_t seed, std::int64_t rows = 96) {
  Dataset d;
  d.rows = rows;
  d.features = features;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.1f, 1.f);
  for (std::int64_t r = 0; r < rows; ++r) {
    float score = 0;
    for (std::int64_t f = 0; f < features; ++f) {
      const float v = (rng() & 1 ? 1.f : -1.f) * u(rng);
      d.x.push_back(v);
      score += v * static_cast<float>(f % 3 - 1);
    }
    d.y.push_back(static_cast<std::int32_t>(score > 0 ? 1 : 0) + (r % 2 ? 2 : 0));
  }
  return d;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("dtrain_fit_" + std::to_string(::getpid()));
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

using Net = Trainer<UnevenNet, Strategy<FSDP<FullShard>>>;

}  // namespace

BOOST_AUTO_TEST_CASE(checkpoints_evaluation_metrics_and_a_second_run) {
  TempDir tmp;
  const Dataset train = make_data(1), held_out = make_data(2, 40);
  FitOptions o{.steps = 7,
               .batch_size = 8,
               .checkpoint_dir = tmp.path / "ckpt",
               .save_every = 3,
               .keep_last = 2,
               .resume = "latest",
               .eval_every = 3,
               .metrics = {metrics::accuracy()},
               .metrics_file = tmp.path / "logs" / "metrics.jsonl",
               .save_params = tmp.path / "final.safetensors"};
  std::vector<std::int64_t> evals, saves;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net t(w, net, AdamW{.lr = 1e-2f});
    FitCallbacks cb;
    cb.on_eval = [&](std::int64_t step, const EvalResult& r, FitControl&) {
      require(r.metrics.count("accuracy") == 1 && r.count == 40, "the whole held-out set, with accuracy");
      if (w.rank() == 0) evals.push_back(step);
    };
    cb.on_save = [&](const fs::path& dir) {
      if (w.rank() == 0) saves.push_back(checkpoint_info(dir).step);
    };
    const FitResult r = fit(t, train, &held_out, o, cb);
    require(r.first_step == 0 && r.steps == 7 && !r.stopped_early && !r.resumed_from, "a fresh run of 7 steps");
    require(r.last_checkpoint == checkpoint_path(o.checkpoint_dir, 7), "the last checkpoint is step-7");
  });
  BOOST_TEST((evals == std::vector<std::int64_t>{3, 6, 7}));
  BOOST_TEST((saves == std::vector<std::int64_t>{3, 6, 7}));
  BOOST_TEST((list_checkpoints(o.checkpoint_dir) ==
              std::vector<fs::path>{checkpoint_path(o.checkpoint_dir, 6), checkpoint_path(o.checkpoint_dir, 7)}));
  BOOST_TEST(fs::exists(o.save_params));
  const auto records = lines_of(o.metrics_file);
  BOOST_TEST(records.size() == 10u);  // 7 steps, 3 evaluations
  BOOST_TEST(records[0].starts_with("{\"step\": 1, \"loss\": "));
  BOOST_TEST(records[3].starts_with("{\"step\": 3, \"eval/loss\": "));
  BOOST_TEST(records[3].find("\"eval/accuracy\": ") != std::string::npos);

  // The same program again: it resumes at step 7, trains nothing, saves
  // nothing new and does not fail (the README's program runs twice).
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net t(w, net, AdamW{.lr = 1e-2f});
    const FitResult r = fit(t, train, &held_out, o);
    require(r.first_step == 7 && r.steps == 7, "nothing left to train");
    require(r.resumed_from == checkpoint_path(o.checkpoint_dir, 7), "resumed from the newest");
    require(!r.last_checkpoint && r.last_eval, "no new checkpoint, one evaluation");
  });
  BOOST_TEST(lines_of(o.metrics_file).size() == 11u);  // appended: the evaluation
}

// 4 steps, stop, resume to 9 (at 3 ranks under ZeRO-1: another world size
// and strategy) against 9 steps at once: the same data order and the same
// parameters. Bit-identical is not promised across strategies; 1e-6
// relative is fp32 reordering.
BOOST_AUTO_TEST_CASE(a_resumed_run_trains_as_an_uninterrupted_one) {
  TempDir tmp;
  const Dataset train = make_data(3);
  FitOptions o{.steps = 4, .batch_size = 4, .checkpoint_dir = tmp.path / "a", .resume = "latest", .progress = false};
  Params resumed, straight;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net t(w, net, AdamW{.lr = 1e-2f});
    fit(t, train, o);
  });
  o.steps = 9;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<ZeRO1>> t(w, net, AdamW{.lr = 1e-2f});
    const FitResult r = fit(t, train, o);
    require(r.first_step == 4 && r.steps == 9, "resumed at 4");
    const Params p = t.parameters();
    if (w.rank() == 0) resumed = p;
  });
  o.checkpoint_dir = tmp.path / "b";
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net t(w, net, AdamW{.lr = 1e-2f});
    fit(t, train, o);
    const Params p = t.parameters();
    if (w.rank() == 0) straight = p;
  });
  std::string where;
  BOOST_TEST(max_rel_diff(resumed, straight, &where) < 1e-6, where);
}

BOOST_AUTO_TEST_CASE(early_stop_and_stop_requests_from_one_rank) {
  TempDir tmp;
  const Dataset train = make_data(4), held_out = make_data(5, 16);
  // Accuracy "maximised" with a min_delta no run can reach: the first
  // evaluation sets the best, the next two fail to beat it: stop at step 6.
  FitOptions o{.steps = 50,
               .batch_size = 8,
               .checkpoint_dir = tmp.path / "c",
               .eval_every = 2,
               .metrics = {metrics::accuracy()},
               .monitor = "accuracy",
               .maximize = true,
               .patience = 2,
               .min_delta = 2.0,
               .progress = false};
  std::int64_t stopped_at = 0, asked_at = 0;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net t(w, net, AdamW{.lr = 1e-2f});
    const FitResult r = fit(t, train, &held_out, o);
    if (w.rank() == 0) stopped_at = r.steps;
    require(r.stopped_early && r.steps == 6, "early stop after 3 evaluations: " + std::to_string(r.steps));
    require(r.last_checkpoint == checkpoint_path(o.checkpoint_dir, 6), "the stopped run is saved");
  });
  // Only rank 1 asks, at step 3; the ranks compare at step 4 (log_every 2).
  FitOptions p{.steps = 50,
               .batch_size = 8,
               .checkpoint_dir = tmp.path / "d",
               .save_final = false,
               .log_every = 2,
               .progress = false};
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Net t(w, net, AdamW{.lr = 1e-2f});
    FitCallbacks cb;
    cb.on_step = [&](const StepStats& st, FitControl& c) {
      if (w.rank() == 1 && st.step == 3) c.request_stop();
    };
    const FitResult r = fit(t, train, p, cb);
    if (w.rank() == 0) asked_at = r.steps;
    require(r.stopped_early && r.steps == 4, "both ranks stop at step 4: " + std::to_string(r.steps));
    require(!r.last_checkpoint, "save_final = false");
  });
  BOOST_TEST(stopped_at == 6);
  BOOST_TEST(asked_at == 4);
}

BOOST_AUTO_TEST_CASE(bad_options_are_config_errors) {
  const Dataset train = make_data(6);
  int caught = 0;
  const auto expect = [&](FitOptions o, const std::string& what) {
    run_ranks(1, [&](World& w) {
      UnevenNet net;
      Trainer<UnevenNet> t(w, net, AdamW{});
      try {
        fit(t, train, o);
        require(false, "no error for " + what);
      } catch (const config_error& e) {
        require(std::string(e.what()).find(what) != std::string::npos, std::string("message: ") + e.what());
        ++caught;
      }
    });
  };
  expect({}, "steps = 0");
  expect({.steps = 1, .batch_size = 0}, "batch_size = 0");
  expect({.steps = 1, .resume = "/no/such/checkpoint"}, "resume = '/no/such/checkpoint'");
  expect({.steps = 1, .log_every = 0}, "log_every");
  const Dataset held_out = make_data(7, 8);
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet> t(w, net, AdamW{});
    require_throws<config_error>([&] {
      fit(t, train, &held_out, {.steps = 1, .save_final = false, .monitor = "f1", .patience = 1, .progress = false});
    });
    ++caught;
  });
  BOOST_TEST(caught == 5);
}
