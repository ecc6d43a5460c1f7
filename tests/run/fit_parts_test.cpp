// dtrain::fit's parts (run/fit_*.hpp), each alone: early stop's decisions,
// the rows each rank evaluates, what follows an evaluation, the resume
// candidates and their fallback past a damaged checkpoint, the checkpointer's
// saves (a step saved already, keep_going, pruning), the rollback guard's
// skip list, the batches a rewind replays, the progress point (stragglers,
// stop requests agreed by the ranks, preemption) and the end of a run.
#define BOOST_TEST_MODULE fit_parts
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "strategy/common.hpp"
#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/run/fit_batches.hpp>
#include <dtrain/run/fit_checkpointer.hpp>
#include <dtrain/run/fit_evaluation.hpp>
#include <dtrain/run/fit_finish.hpp>
#include <dtrain/run/fit_progress.hpp>
#include <dtrain/run/fit_resume.hpp>
#include <dtrain/run/fit_rollback.hpp>
#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;
using detail::EarlyStop;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("dtrain_fit_parts_" + std::to_string(::getpid()));
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

using Rows = std::vector<std::vector<std::int64_t>>;

// A reporter that writes nothing (only rank 0's writes).
detail::FitReporter quiet(const FitOptions& o) { return detail::FitReporter(o, false, false, 0); }

StepStats stats_at(std::int64_t step) {
  StepStats st;
  st.step = step;
  return st;
}

// A run from step `first` to `steps`.
FitResult run_of(std::int64_t first, std::int64_t steps) {
  FitResult r;
  r.first_step = first;
  r.steps = steps;
  return r;
}

EvalResult loss_of(double v) { return EvalResult{.loss = v, .count = 1, .metrics = {}}; }
EvalResult accuracy_of(double v) { return EvalResult{.loss = 1, .count = 1, .metrics = {{"accuracy", v}}}; }

// Saves a checkpoint after each of `steps` (a one-rank UnevenNet trained on
// batches of 4 rows) into checkpoint_path(dir, step).
void make_checkpoints(const fs::path& dir, const std::vector<std::int64_t>& steps) {
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet> t(w, net, AdamW{.lr = 1e-2f});
    for (const std::int64_t s : steps) {
      while (t.steps_taken() < s) t.step(micro_batches(static_cast<int>(t.steps_taken()), 0, {4}));
      t.save(checkpoint_path(dir, s));
    }
  });
}

// Overwrites the last bytes of a checkpoint's first shard file (tensor data),
// so that a checksum fails when it loads (the index still parses: it is listed).
void damage(const fs::path& checkpoint) {
  for (const auto& e : fs::directory_iterator(checkpoint)) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(e.path()) - 8));
    f.write("\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f", 8);
    return;
  }
  BOOST_FAIL("no shard file in " << checkpoint);
}

// The rows rank `rank` owns, batch_size at a time, the first max_batches
// batches (0: all): a reference written another way than eval_rows.
Rows expected_rows(std::int64_t rows, int rank, int world, std::int64_t batch_size, std::int64_t max_batches) {
  std::vector<std::int64_t> mine;
  for (std::int64_t r = 0; r < rows; ++r)
    if (r % world == rank) mine.push_back(r);
  Rows out;
  for (std::size_t first = 0; first < mine.size(); first += static_cast<std::size_t>(batch_size)) {
    if (max_batches > 0 && static_cast<std::int64_t>(out.size()) == max_batches) break;
    const std::size_t end = std::min(mine.size(), first + static_cast<std::size_t>(batch_size));
    const auto at = [&](std::size_t i) { return mine.begin() + static_cast<std::ptrdiff_t>(i); };
    out.emplace_back(at(first), at(end));
  }
  return out;
}

// An eval source that records the rows asked of it.
struct RecordingSource {
  std::int64_t rows = 0;
  mutable Rows gathered{};
  std::int64_t size() const { return rows; }
  Batch gather(std::span<const std::int64_t> idx) const {
    gathered.emplace_back(idx.begin(), idx.end());
    return {};
  }
};

// What EvalDriver::evaluate and ProgressPoint::pass_notice use of a Trainer.
struct FakeTrainer {
  World* w = nullptr;
  std::int64_t step = 0;
  double loss = 0;
  std::size_t batches_seen = 0;
  std::vector<bool> stop_requests{};
  World& world() { return *w; }
  std::int64_t steps_taken() const { return step; }
  EvalResult evaluate(std::span<const Batch> batches, std::span<const Metric>) {
    batches_seen = batches.size();
    return loss_of(loss);
  }
  void request_stop(bool stop) { stop_requests.push_back(stop); }
};

}  // namespace

// --- early stop ---------------------------------------------------------------

// A loss that falls by min_delta or less is no improvement; `patience` such
// evaluations in a row stop (and every later one that does not improve);
// a real improvement resets the count.
BOOST_AUTO_TEST_CASE(early_stop_on_the_loss_needs_more_than_min_delta) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  for (int trial = 0; trial < 20; ++trial) {
    const double base = u(rng), delta = 0.01 * u(rng);
    EarlyStop stop(FitOptions{.patience = 3, .min_delta = delta});
    BOOST_TEST(!stop.stops_after(loss_of(base)));
    BOOST_TEST(*stop.best() == base);
    BOOST_TEST(!stop.stops_after(loss_of(base - 0.5 * delta)));  // within min_delta
    BOOST_TEST(!stop.stops_after(loss_of(base + delta)));
    BOOST_TEST(stop.bad_evals() == 2);
    BOOST_TEST(!stop.stops_after(loss_of(base - 2 * delta)));  // an improvement: the count starts again
    BOOST_TEST(*stop.best() == base - 2 * delta);
    BOOST_TEST(stop.bad_evals() == 0);
    BOOST_TEST(!stop.stops_after(loss_of(base - 2.5 * delta)));
    BOOST_TEST(!stop.stops_after(loss_of(base)));
    BOOST_TEST(stop.stops_after(loss_of(base - 2 * delta)));  // the third in a row
    BOOST_TEST(stop.stops_after(loss_of(base)));
    BOOST_TEST(stop.bad_evals() == 4);
    BOOST_TEST(*stop.best() == base - 2 * delta);
  }
}

// maximize: a metric must rise by more than min_delta; a fall never counts.
BOOST_AUTO_TEST_CASE(early_stop_on_accuracy_maximises) {
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<double> u(0.1, 0.5);
  for (int trial = 0; trial < 20; ++trial) {
    const double base = u(rng), delta = 0.1 * u(rng);
    EarlyStop stop(FitOptions{.monitor = "accuracy", .maximize = true, .patience = 2, .min_delta = delta});
    BOOST_TEST(!stop.stops_after(accuracy_of(base)));
    BOOST_TEST(!stop.stops_after(accuracy_of(base + 1.5 * delta)));
    BOOST_TEST(*stop.best() == base + 1.5 * delta);
    BOOST_TEST(!stop.stops_after(accuracy_of(base + 2 * delta)));  // up by less than min_delta
    BOOST_TEST(stop.stops_after(accuracy_of(base)));
    BOOST_TEST(*stop.best() == base + 1.5 * delta);
  }
  // The same values minimised: the first is the best, the rises are not.
  EarlyStop down(FitOptions{.monitor = "accuracy", .patience = 2, .min_delta = 0.01});
  BOOST_TEST(!down.stops_after(accuracy_of(0.3)));
  BOOST_TEST(!down.stops_after(accuracy_of(0.6)));
  BOOST_TEST(down.stops_after(accuracy_of(0.7)));
}

// patience 0 never stops and never looks the monitor up; otherwise an
// unknown monitor is a config_error naming it.
BOOST_AUTO_TEST_CASE(early_stop_off_and_an_unknown_monitor) {
  EarlyStop off(FitOptions{.monitor = "f1"});
  for (int i = 0; i < 5; ++i) BOOST_TEST(!off.stops_after(loss_of(1.0 + i)));
  BOOST_TEST(!off.best());
  EarlyStop on(FitOptions{.monitor = "f1", .patience = 1});
  BOOST_CHECK_EXCEPTION(on.stops_after(accuracy_of(0.5)), config_error, [](const config_error& e) {
    return std::string(e.what()).find("FitOptions.monitor = 'f1' is not among the evaluation's values") !=
           std::string::npos;
  });
}

// --- evaluation batches -------------------------------------------------------

BOOST_AUTO_TEST_CASE(eval_rows_by_hand) {
  BOOST_TEST((detail::eval_rows(10, 0, 3, 2, 0) == Rows{{0, 3}, {6, 9}}));
  BOOST_TEST((detail::eval_rows(10, 1, 3, 2, 0) == Rows{{1, 4}, {7}}));
  BOOST_TEST((detail::eval_rows(10, 2, 3, 2, 0) == Rows{{2, 5}, {8}}));
  BOOST_TEST((detail::eval_rows(10, 1, 3, 2, 1) == Rows{{1, 4}}));
  BOOST_TEST((detail::eval_rows(10, 1, 3, 2, 2) == Rows{{1, 4}, {7}}));
  BOOST_TEST((detail::eval_rows(10, 1, 3, 2, 5) == Rows{{1, 4}, {7}}));
  BOOST_TEST((detail::eval_rows(7, 0, 1, 3, 0) == Rows{{0, 1, 2}, {3, 4, 5}, {6}}));
  BOOST_TEST(detail::eval_rows(2, 2, 3, 4, 0).empty());  // more ranks than rows
}

// Random sizes: each rank's batches against the reference, and without a
// batch limit every row evaluated once over all ranks.
BOOST_AUTO_TEST_CASE(eval_rows_cover_every_row_once) {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 200);
    const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 9);
    const int world = 1 + static_cast<int>(rng() % 5);
    const std::int64_t limit = static_cast<std::int64_t>(rng() % 4);
    std::vector<int> seen(static_cast<std::size_t>(rows));
    for (int rank = 0; rank < world; ++rank) {
      const Rows got = detail::eval_rows(rows, rank, world, batch, limit);
      BOOST_TEST((got == expected_rows(rows, rank, world, batch, limit)),
                 "rows " << rows << " rank " << rank << "/" << world << " batch " << batch << " limit " << limit);
      for (const auto& b : detail::eval_rows(rows, rank, world, batch, 0))
        for (const std::int64_t r : b) ++seen[static_cast<std::size_t>(r)];
    }
    BOOST_TEST(std::ranges::count(seen, 1) == rows);
  }
}

// The driver gathers exactly this rank's rows and hands them to evaluate;
// no source, or an empty one, evaluates nothing.
BOOST_AUTO_TEST_CASE(the_driver_evaluates_this_rank_s_rows) {
  const FitOptions o{.batch_size = 3, .eval_batches = 2};
  std::mutex mu;
  std::vector<Rows> gathered(2);
  std::vector<std::optional<EvalResult>> last(2);
  run_ranks(2, [&](World& w) {
    FitResult result;
    FitControl control;
    auto report = quiet(o);
    detail::EvalDriver driver(o, {}, report, result, control);
    FakeTrainer t{.w = &w, .step = 5, .loss = 0.25 + w.rank()};
    const RecordingSource source{.rows = 17}, empty{};
    driver.evaluate(t, static_cast<const RecordingSource*>(nullptr));
    driver.evaluate(t, &empty);
    require(!result.last_eval && empty.gathered.empty(), "an evaluation without rows");
    driver.evaluate(t, &source);
    require(t.batches_seen == 2, "eval_batches = 2");
    std::lock_guard lock(mu);
    gathered[static_cast<std::size_t>(w.rank())] = source.gathered;
    last[static_cast<std::size_t>(w.rank())] = result.last_eval;
  });
  BOOST_TEST((gathered[0] == Rows{{0, 2, 4}, {6, 8, 10}}));
  BOOST_TEST((gathered[1] == Rows{{1, 3, 5}, {7, 9, 11}}));
  BOOST_TEST(last[0]->loss == 0.25);
  BOOST_TEST(last[1]->loss == 1.25);
}

// After an evaluation: on_eval sees it with the step, the result keeps it,
// and an early stop asks the control to stop and marks the result.
BOOST_AUTO_TEST_CASE(recording_an_evaluation) {
  const FitOptions o{.patience = 2, .min_delta = 0.05};
  FitResult result;
  FitControl control;
  auto report = quiet(o);
  std::vector<std::int64_t> steps;
  FitCallbacks cb;
  cb.on_eval = [&](std::int64_t step, const EvalResult& r, FitControl& c) {
    steps.push_back(step);
    BOOST_TEST(&c == &control);
    BOOST_TEST(r.loss == (step == 10 ? 0.75 : 0.74));
  };
  detail::EvalDriver driver(o, cb, report, result, control);
  BOOST_TEST(!driver.due(10, false));  // eval_every = 0: at the end only
  driver.record(10, loss_of(0.75));
  BOOST_TEST(*result.best == 0.75);
  driver.record(20, loss_of(0.74));
  BOOST_TEST(!result.stopped_early);
  BOOST_TEST(!control.stop_requested());
  driver.record(30, loss_of(0.74));
  BOOST_TEST(result.stopped_early);
  BOOST_TEST(control.stop_requested());
  BOOST_TEST(result.last_eval->loss == 0.74);
  BOOST_TEST(*result.best == 0.75);
  BOOST_TEST((steps == std::vector<std::int64_t>{10, 20, 30}));
  const FitOptions every{.eval_every = 10};
  detail::EvalDriver periodic(every, cb, report, result, control);
  BOOST_TEST(periodic.due(20, false));
  BOOST_TEST(!periodic.due(20, true));  // the last step evaluates at the end
  BOOST_TEST(!periodic.due(25, false));
}

// --- resume -------------------------------------------------------------------

// "latest": every checkpoint, newest first; a named one alone; "" none.
BOOST_AUTO_TEST_CASE(resume_candidates_newest_first) {
  TempDir tmp;
  make_checkpoints(tmp.path, {2, 4, 6});
  fs::create_directories(tmp.path / "step-00000009");  // a save that died: no index
  const FitOptions latest{.checkpoint_dir = tmp.path, .resume = "latest"};
  BOOST_TEST((detail::Resumer(latest, false).candidates() == std::vector<fs::path>{checkpoint_path(tmp.path, 6),
                                                                                   checkpoint_path(tmp.path, 4),
                                                                                   checkpoint_path(tmp.path, 2)}));
  const FitOptions named{.checkpoint_dir = tmp.path, .resume = checkpoint_path(tmp.path, 4).string()};
  BOOST_TEST((detail::Resumer(named, false).candidates() == std::vector<fs::path>{checkpoint_path(tmp.path, 4)}));
  BOOST_TEST(detail::Resumer(FitOptions{.checkpoint_dir = tmp.path}, false).candidates().empty());
  // Nothing to resume from: no load, no checkpoint.
  const FitOptions nothing{.checkpoint_dir = tmp.path / "none", .resume = "latest", .progress = false};
  int loads = 0;
  BOOST_TEST(!detail::Resumer(nothing, true).resume([&](const fs::path&) {
    ++loads;
    return CheckpointInfo{};
  }));
  BOOST_TEST(loads == 0);
}

// A checkpoint_error moves on to the next candidate; the last one's is rethrown.
BOOST_AUTO_TEST_CASE(resume_falls_back_past_a_failing_load) {
  TempDir tmp;
  make_checkpoints(tmp.path, {2, 4, 6});
  const FitOptions o{.checkpoint_dir = tmp.path, .resume = "latest", .progress = false};
  const detail::Resumer resumer(o, false);
  std::vector<fs::path> tried;
  const auto failing = [&](int below) {
    return [&tried, below](const fs::path& dir) {
      tried.push_back(dir);
      const CheckpointInfo info = checkpoint_info(dir);
      if (info.step > below) throw checkpoint_error("damaged step " + std::to_string(info.step));
      return info;
    };
  };
  BOOST_TEST((resumer.resume(failing(4)) == checkpoint_path(tmp.path, 4)));
  BOOST_TEST((tried == std::vector<fs::path>{checkpoint_path(tmp.path, 6), checkpoint_path(tmp.path, 4)}));
  tried.clear();
  BOOST_CHECK_EXCEPTION(resumer.resume(failing(0)), checkpoint_error, [](const checkpoint_error& e) {
    return std::string(e.what()).find("damaged step 2") != std::string::npos;
  });
  BOOST_TEST(tried.size() == 3u);
}

// For real: the newest checkpoint's shard damaged, a Trainer resumes from
// the one before it, with the sampler where that one left it.
BOOST_AUTO_TEST_CASE(resume_skips_a_damaged_checkpoint) {
  TempDir tmp;
  make_checkpoints(tmp.path, {3, 5});
  damage(checkpoint_path(tmp.path, 5));
  const FitOptions o{.batch_size = 4, .checkpoint_dir = tmp.path, .resume = "latest", .progress = false};
  const Dataset data = random_dataset(40, 5);
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet> t(w, net, AdamW{.lr = 1e-2f});
    detail::TrainBatches batches(data, w, o);
    const auto from = detail::Resumer(o, false).resume([&](const fs::path& dir) { return batches.restore(t, dir); });
    require(from == checkpoint_path(tmp.path, 3), "resumed from step 3");
    require(t.steps_taken() == 3, "the trainer is at step 3: " + std::to_string(t.steps_taken()));
  });
}

// --- checkpoints ----------------------------------------------------------------

// A step saved already (a run before a restart) is left alone; keep_going
// counts a failed save and trains on, stop rethrows it.
BOOST_AUTO_TEST_CASE(checkpointer_skips_a_saved_step_and_counts_failures) {
  TempDir tmp;
  make_checkpoints(tmp.path, {4});
  const FitOptions o{.checkpoint_dir = tmp.path, .on_save_error = save_error_policy::keep_going, .progress = false};
  FitResult result;
  auto report = quiet(o);
  int writes = 0, saved = 0;
  FitCallbacks cb;
  cb.on_save = [&](const fs::path&) { ++saved; };
  detail::Checkpointer keep_going(o, cb, report, result, true, [&](const fs::path& dir) {
    ++writes;
    throw checkpoint_error("no space left writing " + dir.string());
  });
  keep_going.save(4);
  BOOST_TEST(writes == 0);
  keep_going.save(5);
  keep_going.save(6);
  BOOST_TEST(writes == 2);
  BOOST_TEST(result.failed_saves == 2);
  BOOST_TEST(!result.last_checkpoint);
  BOOST_TEST(saved == 0);
  FitOptions stop_o = o;
  stop_o.on_save_error = save_error_policy::stop;
  detail::Checkpointer stop(stop_o, cb, report, result, true, [&](const fs::path&) { throw checkpoint_error("full"); });
  BOOST_CHECK_THROW(stop.save(7), checkpoint_error);
  BOOST_TEST(result.failed_saves == 2);
}

// Saves that succeed: on_save and last_checkpoint follow each; rank 0 prunes
// to keep_last, other ranks never do. save_every's schedule.
BOOST_AUTO_TEST_CASE(checkpointer_saves_prunes_and_reports) {
  TempDir tmp;
  for (const bool rank0 : {true, false}) {
    const fs::path dir = tmp.path / (rank0 ? "rank0" : "rank1");
    const FitOptions o{.checkpoint_dir = dir, .save_every = 3, .keep_last = 2, .progress = false};
    std::vector<fs::path> on_save;
    FitCallbacks cb;
    cb.on_save = [&](const fs::path& d) { on_save.push_back(d); };
    FitResult result;
    auto report = quiet(o);
    run_ranks(1, [&](World& w) {
      UnevenNet net;
      Trainer<UnevenNet> t(w, net, AdamW{.lr = 1e-2f});
      detail::Checkpointer checkpointer(o, cb, report, result, rank0, [&](const fs::path& d) { t.save(d); });
      for (int s = 0; s < 4; ++s) {
        t.step(micro_batches(s, 0, {4}));
        checkpointer.save(t.steps_taken());
      }
    });
    BOOST_TEST(on_save.size() == 4u);
    BOOST_TEST((on_save.back() == checkpoint_path(dir, 4)));
    BOOST_TEST((result.last_checkpoint == checkpoint_path(dir, 4)));
    BOOST_TEST(list_checkpoints(dir).size() == (rank0 ? 2u : 4u));
    if (rank0)
      BOOST_TEST((list_checkpoints(dir) == std::vector<fs::path>{checkpoint_path(dir, 3), checkpoint_path(dir, 4)}));
    detail::Checkpointer schedule(o, cb, report, result, rank0, [](const fs::path&) {});
    BOOST_TEST(schedule.due(3, false));
    BOOST_TEST(schedule.due(6, false));
    BOOST_TEST(!schedule.due(6, true));  // the last step saves at the end
    BOOST_TEST(!schedule.due(4, false));
  }
}

// --- rollback ---------------------------------------------------------------------

// Each rollback adds its failed step; every replay skips each listed step's
// batches once; past max_rollbacks, or without a checkpoint or the policy,
// the error ends the run and nothing changes.
BOOST_AUTO_TEST_CASE(rollback_skip_list) {
  TempDir tmp;
  make_checkpoints(tmp.path, {2, 4});
  const FitOptions o{
      .checkpoint_dir = tmp.path, .on_nonfinite = nonfinite_policy::rollback, .max_rollbacks = 2, .progress = false};
  FitResult result;
  auto report = quiet(o);
  detail::RollbackGuard guard(o, report, result);
  std::vector<fs::path> rewound;
  const auto rewind = [&](const fs::path& dir) {
    rewound.push_back(dir);
    return std::int64_t{4};
  };
  const nonfinite_error e("step has a non-finite loss");
  BOOST_TEST(!guard.skips(7));
  BOOST_TEST(guard.roll_back(7, e, rewind));
  BOOST_TEST((rewound == std::vector<fs::path>{checkpoint_path(tmp.path, 4)}));
  BOOST_TEST((result.skipped_steps == std::vector<std::int64_t>{7}));
  BOOST_TEST(!guard.skips(5));
  BOOST_TEST(!guard.skips(6));
  BOOST_TEST(guard.skips(7));
  BOOST_TEST(!guard.skips(7));  // the next draw trains step 7
  BOOST_TEST(guard.roll_back(9, e, rewind));
  BOOST_TEST((result.skipped_steps == std::vector<std::int64_t>{7, 9}));
  BOOST_TEST(guard.skips(7));  // a new replay skips both again
  BOOST_TEST(guard.skips(9));
  BOOST_TEST(!guard.skips(9));
  BOOST_TEST(!guard.roll_back(11, e, rewind));  // max_rollbacks = 2
  BOOST_TEST(rewound.size() == 2u);
  BOOST_TEST(result.skipped_steps.size() == 2u);

  FitOptions stop = o;
  stop.on_nonfinite = nonfinite_policy::stop;
  detail::RollbackGuard stops(stop, report, result);
  BOOST_TEST(!stops.roll_back(3, e, rewind));
  FitOptions empty = o;
  empty.checkpoint_dir = tmp.path / "none";
  detail::RollbackGuard nothing_saved(empty, report, result);
  BOOST_TEST(!nothing_saved.roll_back(3, e, rewind));
  BOOST_TEST(!nothing_saved.skips(3));
  BOOST_TEST(rewound.size() == 2u);
  BOOST_TEST(result.skipped_steps.size() == 2u);
}

// A rewind to a checkpoint draws again the batches drawn after it was saved
// (shuffled, with loader threads), and puts the trainer back at its step.
BOOST_AUTO_TEST_CASE(a_rewind_replays_the_batches_since_the_checkpoint) {
  TempDir tmp;
  std::mt19937_64 rng(14);
  const Dataset data = random_dataset(36, 7);
  const FitOptions o{.batch_size = 4, .num_workers = 2, .seed = rng()};
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet> t(w, net, AdamW{.lr = 1e-2f});
    detail::TrainBatches batches(data, w, o);
    batches.start();
    const auto train = [&] {
      Batch b = batches.next();
      std::vector<std::int64_t> rows = b.indices;
      t.step(std::vector<Batch>{std::move(b)});
      return rows;
    };
    for (int s = 0; s < 2; ++s) train();
    const fs::path dir = checkpoint_path(tmp.path, 2);
    batches.save(t, dir, false);
    std::vector<std::vector<std::int64_t>> after, again;
    for (int s = 0; s < 10; ++s) after.push_back(train());  // past the end of an epoch (9 batches)
    require(batches.rewind(t, dir) == 2, "back at step 2");
    for (int s = 0; s < 10; ++s) again.push_back(train());
    require(after == again, "the replay draws the same rows");
    require(after[0] != after[1] && after[0].size() == 4u, "distinct batches of 4 rows");
  });
}

// --- progress points ----------------------------------------------------------------

// Step times are compared at progress points after step 1 (and the last),
// only where shown and with more than one rank; the slowest rank computes longest.
BOOST_AUTO_TEST_CASE(stragglers_are_compared_at_progress_points) {
  const FitOptions o{.steps = 7, .log_every = 3};
  std::mutex mu;
  std::vector<std::int64_t> compared;
  std::vector<detail::Stragglers> at_six(2);
  run_ranks(2, [&](World& w) {
    FitResult result;
    detail::ProgressPoint progress(w, o, result);
    std::mt19937_64 rng(15);  // the same draws on both ranks
    std::uniform_real_distribution<double> u(10, 20);
    for (std::int64_t step = 1; step <= 7; ++step) {
      // Rank 1 computes twice rank 0's time and waits besides.
      const double compute = u(rng), wait = u(rng);
      StepStats st;
      st.step = step;
      st.step_ms = w.rank() == 0 ? compute : 2 * compute + wait;
      st.wait_ms = w.rank() == 0 ? 0.0 : wait;
      const auto lag = progress.stragglers(st, step == 7);
      std::lock_guard lock(mu);
      if (lag && w.rank() == 0) compared.push_back(step);
      if (lag && step == 6) at_six[static_cast<std::size_t>(w.rank())] = *lag;
    }
  });
  BOOST_TEST((compared == std::vector<std::int64_t>{3, 6, 7}));
  for (const auto& s : at_six) {
    BOOST_REQUIRE(s.step_ms.size() == 2u);
    BOOST_TEST(s.slowest == 1);
    BOOST_TEST(s.wait_ms[0] == 0.0);
    BOOST_TEST(s.step_ms[1] == 2 * s.step_ms[0] + s.wait_ms[1], boost::test_tools::tolerance(1e-12));
    BOOST_TEST(s.lag == 2.0, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(s.excess_ms == s.step_ms[0], boost::test_tools::tolerance(1e-9));
  }
  // Not shown (no progress lines, no metrics file), or one rank: never.
  run_ranks(2, [&](World& w) {
    FitResult result;
    detail::ProgressPoint progress(w, FitOptions{.steps = 7, .log_every = 3, .progress = false}, result);
    require(!progress.stragglers(stats_at(3), false), "compared though nothing shows it");
  });
  run_ranks(1, [&](World& w) {
    FitResult result;
    detail::ProgressPoint progress(w, o, result);
    require(!progress.stragglers(stats_at(3), false), "compared at one rank");
  });
}

// A stop request from one rank is compared at progress points and at
// evaluation steps only, and then every rank stops.
BOOST_AUTO_TEST_CASE(a_stop_request_from_one_rank_is_agreed) {
  const FitOptions o{.steps = 20, .log_every = 4};
  std::mutex mu;
  std::vector<std::vector<std::int64_t>> stopped(2);
  std::vector<bool> marked(2);
  run_ranks(2, [&](World& w) {
    FitResult result;
    FitControl control;
    detail::ProgressPoint progress(w, o, result);
    std::vector<std::int64_t> mine;
    require(!progress.stop_agreed(4, false, false, control), "no rank asked");
    if (w.rank() == 1) control.request_stop();
    for (const std::int64_t step : {5, 6})
      require(!progress.stop_agreed(step, false, false, control), "compared off a progress point");
    require(!progress.stop_agreed(20, true, false, control), "compared at the last step");
    if (progress.stop_agreed(7, false, true, control)) mine.push_back(7);   // an evaluation step
    if (progress.stop_agreed(8, false, false, control)) mine.push_back(8);  // a progress point
    std::lock_guard lock(mu);
    stopped[static_cast<std::size_t>(w.rank())] = mine;
    marked[static_cast<std::size_t>(w.rank())] = result.stopped_early;
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST((stopped[static_cast<std::size_t>(r)] == std::vector<std::int64_t>{7, 8}));
    BOOST_TEST(marked[static_cast<std::size_t>(r)]);
  }
}

// The watch's notice goes into the next step's request (none without a
// watch); after the step that carried it the result says preempted and names
// the signal.
BOOST_AUTO_TEST_CASE(a_preemption_notice_reaches_the_step_and_the_result) {
  run_ranks(1, [&](World& w) {
    FitResult result;
    FakeTrainer t{.w = &w};
    {
      detail::ProgressPoint unwatched(w, FitOptions{.preempt_signals = {}}, result);
      unwatched.pass_notice(t);
      require(t.stop_requests.empty(), "a request without a watch");
    }
    const FitOptions o{.progress = false, .preempt_signals = {SIGUSR2}};
    detail::ProgressPoint progress(w, o, result);
    progress.pass_notice(t);
    ::raise(SIGUSR2);  // the watch's: the default action would end this test
    progress.pass_notice(t);
    require((t.stop_requests == std::vector<bool>{false, true}), "the notice went into the second request");
    auto report = quiet(o);
    progress.preempted(stats_at(9), report);
    require(result.preempted && result.preempt_signal == SIGUSR2, "preempted by SIGUSR2");
    require(result.exit_code() == preempted_exit_code, "exit code 75");
  });
}

// --- the end of a run ---------------------------------------------------------------

// What the end does, in order, for runs that trained, had nothing to train,
// saved only at save_every, or were preempted.
BOOST_AUTO_TEST_CASE(the_end_of_a_run) {
  std::vector<std::string> calls;
  const auto finish = [&](const FitOptions& o, const FitResult& r) {
    calls.clear();
    auto report = quiet(o);
    detail::finish_fit(
        o, r, report, false, [&] { calls.push_back("evaluate"); }, [&] { calls.push_back("save"); },
        [&](const fs::path& p) { calls.push_back("params " + p.string()); });
    return calls;
  };
  using Calls = std::vector<std::string>;
  const FitOptions plain{.steps = 9}, params{.steps = 9, .save_params = "p.safetensors"};
  BOOST_TEST((finish(params, run_of(2, 9)) == Calls{"evaluate", "save", "params p.safetensors"}));
  BOOST_TEST((finish(plain, run_of(9, 9)) == Calls{"evaluate"}));
  FitResult evaluated = run_of(9, 9);
  evaluated.last_eval = loss_of(0.5);
  BOOST_TEST((finish(plain, evaluated) == Calls{}));
  const FitOptions unsaved{.steps = 9, .save_final = false}, periodic{.steps = 9, .save_every = 4, .save_final = false};
  BOOST_TEST((finish(unsaved, run_of(0, 9)) == Calls{"evaluate"}));
  BOOST_TEST((finish(periodic, run_of(0, 9)) == Calls{"evaluate", "save"}));
  FitResult preempted = run_of(0, 3);
  preempted.preempted = true;
  BOOST_TEST((finish(params, preempted) == Calls{}));
}
