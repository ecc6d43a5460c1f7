// What long runs meet, at 2 ranks: a NaN in one rank's batch at a chosen
// step (on_nonfinite = stop names the step and the first unit with a
// non-finite gradient; skip leaves the parameters as they were; fit's
// rollback goes back to the last checkpoint and skips the batches), a
// checkpoint that would hold a NaN (refused), and a save that hits a
// file-size limit (ulimit -f: every rank fails with one message naming the
// file, the bytes and the free space; the partial files go, the previous
// checkpoint stays loadable; fit's on_save_error = continue trains on).
#define BOOST_TEST_MODULE robust
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
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

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("dtrain_robust_" + std::to_string(::getpid()));
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

// Rank `rank`'s micro-batch of `step`, with x[0] = NaN on rank `bad_rank` at `bad_step`.
Batch batch_of(int step, int rank, int bad_step, int bad_rank) {
  Batch b = micro_batches(step, rank, {6})[0];
  if (step == bad_step && rank == bad_rank) {
    auto& x = b.at("x");
    float* v = reinterpret_cast<float*>(x.bytes.data());
    v[0] = std::numeric_limits<float>::quiet_NaN();
  }
  return b;
}

TrainerOptions with(nonfinite_policy p) {
  TrainerOptions o{.seed = 3};
  o.on_nonfinite = p;
  return o;
}

}  // namespace

// stop: every rank throws at the step with the NaN, naming it and the first
// unit whose gradient is not finite (the first Linear's weight: x feeds it).
BOOST_AUTO_TEST_CASE(nonfinite_stop_names_the_step_and_the_unit) {
  std::mutex mu;
  std::vector<std::string> messages;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<FSDP<FullShard>>> t(w, net, AdamW{.lr = 1e-2f}, with(nonfinite_policy::stop));
    try {
      for (int s = 0; s < 5; ++s) t.step(std::vector<Batch>{batch_of(s, w.rank(), 3, 1)});
    } catch (const nonfinite_error& e) {
      std::lock_guard lock(mu);
      messages.push_back(e.what());
    }
  });
  BOOST_REQUIRE_EQUAL(messages.size(), 2u);
  for (const auto& m : messages) {
    BOOST_TEST(m.find("step 4 has a non-finite") != std::string::npos, m);  // 0-based batch 3 is step 4
    BOOST_TEST(m.find("the first non-finite gradient is in 0.weight") != std::string::npos, m);
    BOOST_TEST(m.find("on_nonfinite = skip") != std::string::npos, m);
  }
}

// skip: the step with the NaN changes nothing (StepStats::skipped on every
// rank), the others train; the parameters equal a run that never saw that
// step's batches... except for the step counter, so compare step by step.
BOOST_AUTO_TEST_CASE(nonfinite_skip_leaves_the_parameters) {
  std::mutex mu;
  std::string failure;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<DDP>> t(w, net, AdamW{.lr = 1e-2f}, with(nonfinite_policy::skip));
    Params before;
    for (int s = 0; s < 5; ++s) {
      if (s == 3) before = t.parameters();
      const StepStats st = t.step(std::vector<Batch>{batch_of(s, w.rank(), 3, 0)});
      std::lock_guard lock(mu);
      if ((s == 3) != st.skipped)
        failure += "step " + std::to_string(s) + " skipped=" + std::to_string(st.skipped) + "; ";
      if (s == 3 && t.parameters() != before) failure += "the skipped step changed the parameters; ";
    }
    for (const auto& [name, v] : t.parameters())
      for (float x : v)
        if (!std::isfinite(x)) {
          std::lock_guard lock(mu);
          failure += name + " is not finite; ";
          break;
        }
  });
  BOOST_TEST(failure.empty(), failure);
}

// A NaN that reached the parameters (here loaded from a file) is never saved.
BOOST_AUTO_TEST_CASE(a_checkpoint_never_holds_nan) {
  TempDir tmp;
  fs::create_directories(tmp.path);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<FSDP<FullShard>>> t(w, net, AdamW{.lr = 1e-2f});
    t.step(std::vector<Batch>{batch_of(0, w.rank(), -1, -1)});
    t.save_params(tmp.path / "p.safetensors");
    if (w.rank() == 0) {
      auto f = SafetensorsFile::open(tmp.path / "p.safetensors");
      SafetensorsWriter out;
      std::vector<std::vector<float>> kept;  // the writer reads them when it writes
      kept.reserve(f.names().size());
      for (const auto& name : f.names()) {
        const auto tensor = f.tensor(name);
        std::vector<float>& v = kept.emplace_back(tensor.bytes.size() / sizeof(float));
        std::memcpy(v.data(), tensor.bytes.data(), tensor.bytes.size());
        if (name == "5.weight") v[7] = std::numeric_limits<float>::infinity();
        out.add(name, tensor.shape, v);
      }
      out.write(tmp.path / "bad.safetensors");
    }
    w.barrier("bad-file");
    t.load_params(tmp.path / "bad.safetensors");
    const Params loaded = t.parameters();
    require(std::isinf(loaded.at("5.weight")[7]), "the inf was loaded");
    try {
      t.save(tmp.path / "ck");
    } catch (const checkpoint_error& e) {
      errors[static_cast<std::size_t>(w.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    BOOST_TEST(e.find("refusing to save: the parameter of 5.weight holds inf") != std::string::npos, e);
  }
  BOOST_TEST(!fs::exists(tmp.path / "ck"), "the refused save left files behind");
}

// A file-size limit (ulimit -f) during a save: every rank fails with one
// message naming the file, the bytes and the free space; the partial save is
// removed; the previous checkpoint loads; fit with on_save_error = continue
// reports the failed saves and finishes.
BOOST_AUTO_TEST_CASE(a_save_that_hits_a_file_size_limit) {
  TempDir tmp;
  rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  const auto previous = ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
  std::vector<std::string> errors(2);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<FSDP<FullShard>>> t(w, net, AdamW{.lr = 1e-2f});
    t.step(std::vector<Batch>{batch_of(0, w.rank(), -1, -1)});
    t.save(tmp.path / "good");
    t.step(std::vector<Batch>{batch_of(1, w.rank(), -1, -1)});
    w.barrier("limit");
    if (w.rank() == 0) {
      rlimit small = old;
      small.rlim_cur = 2048;  // bytes: less than a shard file
      ::setrlimit(RLIMIT_FSIZE, &small);
    }
    w.barrier("limited");
    try {
      t.save(tmp.path / "full");
    } catch (const checkpoint_error& e) {
      errors[static_cast<std::size_t>(w.rank())] = e.what();
    }
    w.barrier("saved");
    if (w.rank() == 0) ::setrlimit(RLIMIT_FSIZE, &old);
    w.barrier("restored");
    const CheckpointInfo info = t.load(tmp.path / "good");
    require(info.step == 1, "the previous checkpoint loads");
  });
  for (const auto& e : errors) {
    BOOST_TEST(e.find("could not write its part of checkpoint") != std::string::npos, e);
    BOOST_TEST(e.find("File too large") != std::string::npos, e);
    BOOST_TEST(e.find("bytes are free in") != std::string::npos, e);
    BOOST_TEST(e.find("the partial files were removed") != std::string::npos, e);
  }
  BOOST_TEST(!fs::exists(tmp.path / "full"), "the failed save left files behind");

  // fit: every save fails under the limit; with continue the run finishes.
  const Dataset data = random_dataset(32, 1);
  std::vector<FitResult> results(2);
  rlimit small = old;
  small.rlim_cur = 2048;
  ::setrlimit(RLIMIT_FSIZE, &small);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<DDP>> t(w, net, AdamW{.lr = 1e-2f});
    results[static_cast<std::size_t>(w.rank())] = fit(t, data,
                                                      FitOptions{.steps = 4,
                                                                 .batch_size = 4,
                                                                 .checkpoint_dir = tmp.path / "fit",
                                                                 .save_every = 2,
                                                                 .on_save_error = dtrain::save_error_policy::keep_going,
                                                                 .progress = false});
  });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, previous);
  for (const FitResult& r : results) {
    BOOST_TEST(r.steps == 4);
    BOOST_TEST(r.failed_saves == 2, "saves at steps 2 and 4 fail: " << r.failed_saves);
  }
  BOOST_TEST(list_checkpoints(tmp.path / "fit").empty());
}

// fit's on_nonfinite = "rollback": a NaN in one training row stops the step
// it lands in; fit loads the newest checkpoint, replays the steps since it on
// the same batches, skips that step's batches and finishes, every parameter
// finite; the metrics record the rollback. With "stop" the error ends fit.
BOOST_AUTO_TEST_CASE(fit_rolls_back_past_a_nonfinite_step) {
  TempDir tmp;
  Dataset data = random_dataset(96, 11);
  data.x[70 * features + 2] = std::numeric_limits<float>::quiet_NaN();  // row 70, drawn within the first epoch
  const FitOptions base{.steps = 10,
                        .batch_size = 4,
                        .shuffle = false,
                        .checkpoint_dir = tmp.path / "ck",
                        .save_every = 2,
                        .progress = false};
  std::vector<std::string> stopped(2);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<FSDP<FullShard>>> t(w, net, AdamW{.lr = 1e-2f});
    try {
      fit(t, data, base);
    } catch (const nonfinite_error& e) {
      stopped[static_cast<std::size_t>(w.rank())] = e.what();
    }
  });
  for (const auto& e : stopped) BOOST_TEST(e.find("non-finite") != std::string::npos, "fit did not stop: " << e);
  fs::remove_all(tmp.path);

  FitOptions o = base;
  o.on_nonfinite = dtrain::nonfinite_policy::rollback;
  o.metrics_file = tmp.path / "m.jsonl";
  std::vector<FitResult> results(2);
  std::string failure;
  std::mutex mu;
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<FSDP<FullShard>>> t(w, net, AdamW{.lr = 1e-2f});
    results[static_cast<std::size_t>(w.rank())] = fit(t, data, o);
    for (const auto& [name, v] : t.parameters())
      for (float x : v)
        if (!std::isfinite(x)) {
          std::lock_guard lock(mu);
          failure = name + " is not finite";
        }
  });
  BOOST_TEST(failure.empty(), failure);
  for (const FitResult& r : results) {
    BOOST_TEST(r.steps == 10);
    BOOST_TEST(r.skipped_steps.size() == 1u);
  }
  std::ifstream in(tmp.path / "m.jsonl");
  bool recorded = false;
  for (std::string line; std::getline(in, line);)
    recorded = recorded || line.find("\"rollback_to\"") != std::string::npos;
  BOOST_TEST(recorded, "the metrics file records the rollback");
}

// Watches held together handle the signals of all of them: a second watch
// with another signal adds it (the first one's set does not hide it), and
// the handlers in place before the first come back after the last. Signal
// names read as preempt_signals= reads them; an unknown one is refused.
BOOST_AUTO_TEST_CASE(watches_together_handle_every_watch_s_signals) {
  struct sigaction before {};
  ::sigaction(SIGUSR2, nullptr, &before);
  BOOST_TEST((before.sa_handler == SIG_DFL));
  {
    const PreemptionWatch first({SIGTERM, SIGUSR1});
    const PreemptionWatch second(preemption_signal_numbers({"sigterm", "USR2"}));
    ::raise(SIGUSR2);  // the default action would end this test program
    BOOST_TEST(second.signalled() == SIGUSR2);
    BOOST_TEST(first.signalled() == SIGUSR2);
  }
  struct sigaction after {};
  ::sigaction(SIGUSR2, nullptr, &after);
  BOOST_TEST((after.sa_handler == SIG_DFL));
  BOOST_TEST((preemption_signal_names({SIGTERM, SIGUSR2}) == std::vector<std::string>{"TERM", "USR2"}));
  BOOST_CHECK_EXCEPTION(preemption_signal_numbers({"TERM", "KILL"}), config_error, [](const config_error& e) {
    return std::string(e.what()).find("'KILL' is not a signal a preemption watch takes") != std::string::npos;
  });
}

// A preemption notice that arrives before fit (while the program starts up)
// and is kept by a watch held from the top of main: fit finds it, trains one
// step, saves and returns preempted; without that watch fit's own watch
// starts clean. A second fit resumes from the saved step.
BOOST_AUTO_TEST_CASE(a_notice_kept_from_start_up_stops_fit_after_one_step) {
  TempDir tmp;
  const Dataset data = random_dataset(32, 3);
  const FitOptions o{
      .steps = 6, .batch_size = 4, .checkpoint_dir = tmp.path / "ck", .resume = "latest", .progress = false};
  std::vector<FitResult> results(2);
  {
    const PreemptionWatch start_up({SIGTERM, SIGUSR1});
    ::raise(SIGUSR1);
    require(start_up.signalled() == SIGUSR1, "the watch kept the notice");
    run_ranks(2, [&](World& w) {
      UnevenNet net;
      Trainer<UnevenNet, Strategy<DDP>> t(w, net, AdamW{.lr = 1e-2f});
      results[static_cast<std::size_t>(w.rank())] = fit(t, data, o);
    });
  }
  for (const FitResult& r : results) {
    BOOST_TEST(r.preempted);
    BOOST_TEST(r.steps == 1);
    BOOST_TEST(r.exit_code() == preempted_exit_code);
  }
  BOOST_TEST(list_checkpoints(o.checkpoint_dir).size() == 1u);
  run_ranks(2, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Strategy<DDP>> t(w, net, AdamW{.lr = 1e-2f});
    results[static_cast<std::size_t>(w.rank())] = fit(t, data, o);
  });
  for (const FitResult& r : results) {
    BOOST_TEST(!r.preempted);
    BOOST_TEST(r.first_step == 1);
    BOOST_TEST(r.steps == 6);
  }
}
