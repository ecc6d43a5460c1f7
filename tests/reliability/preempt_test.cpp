// Preemption with real processes: train_mlp at 2 CPU ranks under dtrain-run
// gets a scheduler's notice at a random moment, either one rank (SIGUSR1 or
// SIGTERM sent to itself at a random point: in forward, in backward, inside a
// collective, while a checkpoint is saved; the library's DTRAIN_FAULT_INJECT
// hook) or the launcher (SIGUSR1 or SIGTERM after a random delay, as Slurm or
// Kubernetes send it). Every rank must finish its step, save a checkpoint
// and exit with 75, and dtrain-run with 75 too, naming the preemption; a
// second launch with resume=latest must resume from that checkpoint, at the
// step the first run reported, and end with parameters bit-identical to an
// uninterrupted run. A notice that arrives after the last step leaves a
// finished run (exit 0, the same parameters).
//
// Runs per scenario: DTRAIN_FAULT_RUNS (default 3: the CI pass;
// tests/reliability/run_faults.sh uses 20). Seed: DTRAIN_FAULT_SEED.

#define BOOST_TEST_MODULE reliability_preempt
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "launch/process.hpp"
#include "reliability/jobs.hpp"
#include "support/mlp_job.hpp"
#include <boost/test/unit_test.hpp>

namespace {

using namespace dtrain::test;
using dtrain::testing::launched;
using dtrain::testing::small_mlp_job;
namespace fs = std::filesystem;

constexpr int steps = 400, save_every = 100;

int draw(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng()); }

std::vector<std::string> job(const fs::path& dir, bool resume) {
  std::vector<std::string> args =
      launched({DTRAIN_RUN_PATH, "--nproc-per-node", "2", "--grace-period", "30"},
               small_mlp_job(TRAIN_MLP_PATH, steps, 1000,
                             {"save_every=" + std::to_string(save_every), "keep_last=2",
                              "checkpoint_dir=" + (dir / "ck").string(),
                              "metrics=" + (dir / (resume ? "m2.jsonl" : "m1.jsonl")).string(),
                              "save_params=" + (dir / "final.safetensors").string(), "timeout_s=20"}));
  if (resume) args.emplace_back("resume=latest");
  return args;
}

const Params& reference() {
  static const Params ref = [] {
    TempDir dir;
    const Finished f = Process(job(dir.path(), false)).wait(300);
    BOOST_REQUIRE_MESSAGE(f.exited_with(0), "the uninterrupted run failed:\n" << f.err);
    return read_params(dir.path() / "final.safetensors");
  }();
  return ref;
}

std::optional<long> number_after(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex(pattern))) return std::stol(m[1]);
  return std::nullopt;
}

// The first run ended (`first`); checks its exit and the resumed run.
bool check_outcome(const Finished& first, const fs::path& dir) {
  const Params& ref = reference();
  // The notice came after the last step: the run finished. dtrain-run then
  // exits 0 for SIGUSR1 (which it only passes on) and, told to terminate,
  // ends by SIGTERM once its ranks have exited 0, the final parameters saved.
  if (first.exited_with(0) || (first.killed_by(SIGTERM) && fs::exists(dir / "final.safetensors"))) {
    BOOST_TEST_MESSAGE("the notice arrived after the last step: finished run");
    const bool same = read_params(dir / "final.safetensors") == ref;
    BOOST_TEST(same, "a finished run's parameters differ from the uninterrupted run's");
    return same;
  }
  BOOST_TEST(first.exited_with(75), "the preempted job did not exit with 75 (" << first.describe() << "):\n"
                                                                               << first.err);
  BOOST_TEST(first.err.find("saved a checkpoint on a preemption notice; exiting with code 75") != std::string::npos,
             "dtrain-run did not name the preemption:\n"
                 << first.err);
  const auto stopped = number_after(first.out, R"(preempted(?: \(SIG[A-Z0-9]+\))? after step (\d+))");
  BOOST_TEST(stopped.has_value(), "rank 0 did not report the preemption:\n" << first.out);
  const Finished second = Process(job(dir, true)).wait(300);
  BOOST_TEST(second.exited_with(0), "the resumed run failed:\n" << second.err);
  const auto resumed = number_after(second.out, R"(resumed from \S+ at step (\d+))");
  BOOST_TEST((resumed && stopped && *resumed == *stopped), "resumed at step " << (resumed ? *resumed : -1)
                                                                              << ", preempted after "
                                                                              << (stopped ? *stopped : -1) << ":\n"
                                                                              << second.out);
  const bool same = fs::exists(dir / "final.safetensors") && read_params(dir / "final.safetensors") == ref;
  BOOST_TEST(same, "parameters after the resumed run differ from the uninterrupted run's");
  return first.exited_with(75) && second.exited_with(0) && same && resumed && stopped && *resumed == *stopped;
}

struct Tally {
  std::string scenario;
  int runs = 0, passed = 0;
  ~Tally() {
    std::printf("%-34s runs %2d  passed %2d\n", scenario.c_str(), runs, passed);
    if (const char* path = std::getenv("DTRAIN_FAULT_JSON"); path && *path)
      std::ofstream(path, std::ios::app) << "{\"scenario\": \"" << scenario << "\", \"runs\": " << runs
                                         << ", \"passed\": " << passed << "}\n";
  }
};

// One rank sends itself `sig` at the nth time it reaches `point`.
void rank_notice(const std::string& sig) {
  Tally tally{"notice " + sig + " to one rank"};
  const std::vector<std::string> points{"forward", "backward", "collective", "save"};
  for (int i = 0; i < env_int("DTRAIN_FAULT_RUNS", 3); ++i) {
    const std::string point = points[static_cast<std::size_t>(draw(0, 3))];
    const int nth = point == "save" ? draw(1, steps / save_every - 1) : draw(1, steps);
    const std::string plan = point + ":" + std::to_string(draw(0, 1)) + ":" + std::to_string(nth) + ":" + sig;
    BOOST_TEST_CONTEXT("DTRAIN_FAULT_INJECT=" << plan) {
      ++tally.runs;
      TempDir dir;
      const Finished f = Process(job(dir.path(), false), {{"DTRAIN_FAULT_INJECT", plan}}).wait(300);
      if (check_outcome(f, dir.path())) ++tally.passed;
    }
  }
}

// The launcher gets `sig` a random time after the first step; `extra` are
// more of the job's keys.
void launcher_notice(int sig, const std::string& name, const std::vector<std::string>& extra = {}) {
  Tally tally{"notice " + name + " to dtrain-run"};
  for (int i = 0; i < env_int("DTRAIN_FAULT_RUNS", 3); ++i) {
    const int delay_ms = draw(0, 400);
    BOOST_TEST_CONTEXT(name << " " << delay_ms << " ms after the first step") {
      ++tally.runs;
      TempDir dir;
      std::vector<std::string> args = job(dir.path(), false);
      args.insert(args.end(), extra.begin(), extra.end());
      Process p(args);
      const auto metrics = dir.path() / "m1.jsonl";
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while ((!fs::exists(metrics) || fs::file_size(metrics) == 0) && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      ::kill(p.pid(), sig);
      const Finished f = p.wait(300);
      if (f.exited_with(75)) {  // (a notice after the last step finds a finished run)
        BOOST_TEST(f.err.find("received " + name + "; forwarding it to the ranks") != std::string::npos, f.err);
        BOOST_TEST(f.out.find("preempted (" + name + ")") != std::string::npos, "rank 0 did not name " << name << ":\n"
                                                                                                       << f.out);
      }
      if (check_outcome(f, dir.path())) ++tally.passed;
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(usr1_to_one_rank) { rank_notice("USR1"); }
BOOST_AUTO_TEST_CASE(term_to_one_rank) { rank_notice("TERM"); }
BOOST_AUTO_TEST_CASE(usr1_to_the_launcher) { launcher_notice(SIGUSR1, "SIGUSR1"); }
BOOST_AUTO_TEST_CASE(term_to_the_launcher) { launcher_notice(SIGTERM, "SIGTERM"); }
// SIGUSR2 (a notice for jobs that keep SIGUSR1 for something else): dtrain-run
// forwards it, and ranks told to watch it (preempt_signals) save and exit 75.
BOOST_AUTO_TEST_CASE(usr2_to_the_launcher_with_preempt_signals) {
  launcher_notice(SIGUSR2, "SIGUSR2", {"preempt_signals=TERM,usr2"});
}

// A preempt_signals entry that is no such signal stops the job before it starts.
BOOST_AUTO_TEST_CASE(an_unknown_preempt_signal_is_refused) {
  TempDir dir;
  std::vector<std::string> args = job(dir.path(), false);
  args.emplace_back("preempt_signals=TERM,USR3");
  const Finished f = Process(args).wait(120);
  BOOST_TEST(!f.exited_with(0));
  BOOST_TEST(f.err.find("preempt_signals: 'USR3' is not a signal a preemption watch takes") != std::string::npos,
             f.err);
}

// A rank slowed down (DTRAIN_FAULT_DELAY: 30 ms in every forward) is found:
// the metrics records at progress points carry every rank's step and wait
// times, name it as the slowest with its lag, and the progress line names it.
BOOST_AUTO_TEST_CASE(a_slow_rank_is_named) {
  TempDir dir;
  const auto args = launched({DTRAIN_RUN_PATH, "--nproc-per-node", "2"},
                             small_mlp_job(TRAIN_MLP_PATH, 6, 2,
                                           {"metrics=" + (dir.path() / "m.jsonl").string(),
                                            "checkpoint_dir=" + (dir.path() / "ck").string()}));
  const Finished f = Process(args, {{"DTRAIN_FAULT_DELAY", "1:30"}}).wait(120);
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), f.err);
  BOOST_TEST(f.out.find("slow: rank 1 computes") != std::string::npos, f.out);
  std::ifstream in(dir.path() / "m.jsonl");
  int named = 0, records = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"slowest_rank\"") == std::string::npos) continue;
    ++records;
    const auto lag = number_after(line, R"("slowest_lag": ([0-9]+))");
    if (line.find("\"slowest_rank\": 1,") != std::string::npos && lag && *lag >= 2) ++named;
  }
  BOOST_TEST(records == 3, "records at steps 2, 4, 6: " << records);
  BOOST_TEST(named == records,
             "rank 1 named as the slowest, at least 2x the median, in " << named << " of " << records);
}

// straggler_factor decides whether the slow rank is named: 0 turns the
// comparison off (no progress-line name, no slowest_rank in the metrics); a
// factor beyond its lag keeps the metrics records but names it nowhere; a
// factor below 1 is refused.
BOOST_AUTO_TEST_CASE(straggler_factor_decides_when_a_slow_rank_is_named) {
  for (const std::string factor : {"0", "100000"}) {
    BOOST_TEST_CONTEXT("straggler_factor=" << factor) {
      TempDir dir;
      const auto args =
          launched({DTRAIN_RUN_PATH, "--nproc-per-node", "2"},
                   small_mlp_job(TRAIN_MLP_PATH, 6, 2,
                                 {"straggler_factor=" + factor, "metrics=" + (dir.path() / "m.jsonl").string(),
                                  "checkpoint_dir=" + (dir.path() / "ck").string()}));
      const Finished f = Process(args, {{"DTRAIN_FAULT_DELAY", "1:30"}}).wait(120);
      BOOST_REQUIRE_MESSAGE(f.exited_with(0), f.err);
      BOOST_TEST(f.out.find("slow: rank") == std::string::npos, f.out);
      BOOST_TEST(f.out.find("step     6/6") != std::string::npos, "no progress line at step 6:\n" << f.out);
      std::ifstream in(dir.path() / "m.jsonl");
      int named = 0;
      for (std::string line; std::getline(in, line);)
        if (line.find("\"slowest_rank\": 1,") != std::string::npos) ++named;
      BOOST_TEST(named == (factor == "0" ? 0 : 3), "metrics records naming rank 1 the slowest: " << named);
    }
  }
  TempDir dir;
  const Finished f = Process({DTRAIN_RUN_PATH, "--nproc-per-node", "2", TRAIN_MLP_PATH, "steps=2",
                              "straggler_factor=0.5", "checkpoint_dir=" + (dir.path() / "ck").string()})
                         .wait(120);
  BOOST_TEST(!f.exited_with(0));
  BOOST_TEST(f.err.find("straggler_factor = 0.5") != std::string::npos, f.err);
}
