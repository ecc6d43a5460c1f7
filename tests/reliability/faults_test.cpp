// Failure injection and elastic restart, with real processes: train_mlp at 2
// CPU ranks under dtrain-run, one rank killed with SIGKILL (the library's
// DTRAIN_FAULT_INJECT hook, core/fault.hpp) at a random point of the run:
// in forward, in backward, inside a collective, or while a checkpoint is
// being saved; the rank and the occurrence are drawn at random.
//
// "fail" runs (no restarts) must end within the collective timeout + 5 s
// of the kill, the launcher naming the killed rank and SIGKILL, with no
// process and no /dev/shm segment of the job left behind; a second launch
// with resume=latest must then load the last completed checkpoint and
// finish with parameters bit-identical to an uninterrupted run.
// "elastic" runs (dtrain-run --max-restarts 1, resume=latest) must complete
// by themselves with bit-identical parameters.
//
// Runs per point and mode: DTRAIN_FAULT_RUNS (default 3: the CI pass;
// tests/reliability/run_faults.sh uses 20). Seed: DTRAIN_FAULT_SEED (default
// drawn and printed). DTRAIN_FAULT_JSON=PATH appends one JSON object per
// scenario (runs, passed, worst time to exit).

#define BOOST_TEST_MODULE reliability_faults
#include <dirent.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "launch/process.hpp"
#include "reliability/jobs.hpp"
#include "support/mlp_job.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/comm/store.hpp>

namespace {

using namespace dtrain::test;
using dtrain::testing::small_mlp_job;
namespace fs = std::filesystem;

constexpr double timeout_s = 10;  // the collective timeout the runs are given (timeout_s=)
constexpr int steps = 8, save_every = 2;

// train_mlp at 2 ranks; `node` (0 or 1) makes it one of two simulated
// nodes of one rank each (two dtrain-run --nnodes 2 on this machine, Gloo
// between them) rendezvousing on `port`.
std::vector<std::string> job(const fs::path& dir, bool elastic, bool resume, int node = -1, int port = 0) {
  std::vector<std::string> args{DTRAIN_RUN_PATH, "--nproc-per-node", node < 0 ? "2" : "1"};
  // Two nodes share the job's token (one node's dtrain-run makes its own).
  if (node >= 0) args.insert(args.begin(), {"/usr/bin/env", "DTRAIN_JOB_TOKEN=faults-test-job-token-0123456789abcdef"});
  if (node >= 0)
    args.insert(args.end(), {"--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr", "127.0.0.1",
                             "--master-port", std::to_string(port)});
  if (elastic) args.insert(args.end(), {"--max-restarts", "1"});
  const auto mlp = small_mlp_job(TRAIN_MLP_PATH, steps, 100,
                                 {"save_every=" + std::to_string(save_every), "checkpoint_dir=" + (dir / "ck").string(),
                                  "save_params=" + (dir / "final.safetensors").string(),
                                  "timeout_s=" + std::to_string(static_cast<int>(timeout_s))});
  args.insert(args.end(), mlp.begin(), mlp.end());
  if (resume) args.emplace_back("resume=latest");
  return args;
}

// The uninterrupted run every faulted run must reproduce to the bit.
const Params& reference() {
  static const Params ref = [] {
    TempDir dir;
    const Finished f = Process(job(dir.path(), false, false)).wait(120);
    BOOST_REQUIRE_MESSAGE(f.exited_with(0), "the uninterrupted run failed:\n" << f.err);
    return read_params(dir.path() / "final.safetensors");
  }();
  return ref;
}

// Anything of the job that outlived it: a process whose command line names
// the run's directory, or a shared-memory segment of its launcher's job id.
std::vector<std::string> leftovers(const fs::path& dir, pid_t launcher) {
  std::vector<std::string> found;
  const std::string needle = dir.string();
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = read_text(e.path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos && running(std::stoi(name)))
      found.push_back("process " + name + ": " + cmd);
  }
  const std::string prefix = "dtrain-r" + std::to_string(launcher) + "x";
  for (const auto& e : fs::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back("segment " + e.path().string());
  return found;
}

// The newest complete checkpoint (one with an index) the killed run left.
std::optional<fs::path> newest_complete(const fs::path& dir) {
  std::optional<fs::path> best;
  long best_step = -1;
  if (!fs::exists(dir / "ck")) return best;
  for (const auto& e : fs::directory_iterator(dir / "ck")) {
    const std::string name = e.path().filename();
    if (name.rfind("step-", 0) != 0 || !fs::exists(e.path() / "index.json")) continue;
    const long step = std::stol(name.substr(5));
    if (step > best_step) best_step = step, best = e.path();
  }
  return best;
}

// The wall-clock time the victim printed just before SIGKILL.
double fault_time(const std::string& err, int rank) {
  const std::string marker = "fault injection: SIGKILL on rank " + std::to_string(rank);
  const auto at = err.find(marker);
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, "the injected fault never fired:\n" << err);
  const auto t = err.find("(t=", at);
  BOOST_REQUIRE(t != std::string::npos);
  return std::stod(err.substr(t + 3));
}

struct Tally {
  std::string scenario;
  int runs = 0, passed = 0;
  double worst_s = 0;

  ~Tally() {
    std::printf("%-28s runs %2d  passed %2d  worst time to exit %.2f s\n", scenario.c_str(), runs, passed, worst_s);
    if (const char* path = std::getenv("DTRAIN_FAULT_JSON"); path && *path)
      std::ofstream(path, std::ios::app) << "{\"scenario\": \"" << scenario << "\", \"runs\": " << runs
                                         << ", \"passed\": " << passed << ", \"worst_exit_s\": " << worst_s
                                         << ", \"timeout_s\": " << timeout_s << "}\n";
  }
};

// The occurrence to kill at: within what one run certainly reaches.
int draw_nth(const std::string& point) {
  const int most = point == "save" ? steps / save_every : steps;
  return std::uniform_int_distribution<int>(1, most)(rng());
}

// A random rank and occurrence of `point`: the victim and its
// DTRAIN_FAULT_INJECT value.
std::pair<int, std::string> draw(const std::string& point) {
  const int victim = std::uniform_int_distribution<int>(0, 1)(rng());
  return {victim, point + ":" + std::to_string(victim) + ":" + std::to_string(draw_nth(point))};
}

// DTRAIN_FAULT_RUNS runs of one scenario: each draws its point (`pick`),
// rank and occurrence, and `body(point, victim, plan)` says whether every
// check of the run passed.
template <class Pick, class Body>
void repeat_runs(Tally& tally, Pick pick, Body body) {
  const int runs = env_int("DTRAIN_FAULT_RUNS", 3);
  for (int i = 0; i < runs; ++i) {
    const std::string point = pick();
    const auto drawn = draw(point);
    BOOST_TEST_CONTEXT("DTRAIN_FAULT_INJECT=" << drawn.second) {
      ++tally.runs;
      if (body(point, drawn.first, drawn.second)) ++tally.passed;
    }
  }
}

void fail_runs(const std::string& kind) {
  const Params& ref = reference();
  Tally tally{"kill -9 at " + kind, 0, 0, 0};
  repeat_runs(
      tally, [&] { return kind; },
      [&](const std::string& point, int victim, const std::string& plan) {
        TempDir dir;
        Process p(job(dir.path(), false, false), {{"DTRAIN_FAULT_INJECT", plan}});
        const Finished f = p.wait(timeout_s + 60);
        const double took = wall_now() - fault_time(f.err, victim);
        tally.worst_s = std::max(tally.worst_s, took);
        BOOST_TEST(!f.exited_with(0));
        BOOST_TEST(took <= timeout_s + 5, "the job took " << took << " s to end after the kill");
        const auto at = f.err.find("rank " + std::to_string(victim) + " (pid ");
        const bool named = at != std::string::npos && f.err.find("was killed by SIGKILL", at) != std::string::npos;
        BOOST_TEST(named, "the launcher did not name rank " << victim << " and SIGKILL:\n" << f.err);
        const auto left = leftovers(dir.path(), p.pid());
        BOOST_TEST(left.empty(), "left behind: " << (left.empty() ? "" : left.front()));
        // A save killed before its commit leaves no complete checkpoint: the
        // newest complete one is the save before.
        const auto newest = newest_complete(dir.path());
        bool as_expected = true;
        if (point == "save") {
          const long nth = std::stol(plan.substr(plan.rfind(':') + 1));
          const long newest_step = newest ? std::stol(newest->filename().string().substr(5)) : 0;
          as_expected = newest_step == (nth - 1) * save_every;
          BOOST_TEST(as_expected, "newest complete checkpoint: step " << newest_step << ", expected step "
                                                                      << (nth - 1) * save_every);
        }
        // The last completed checkpoint loads, and the run ends as if never killed.
        const Finished again = Process(job(dir.path(), false, true)).wait(120);
        BOOST_TEST_REQUIRE(again.exited_with(0), "resume=latest failed:\n" << again.err << again.out);
        const std::string loaded = newest ? "resumed from " + newest->string() + " at step" : "no checkpoint in";
        const bool resumed = again.out.find(loaded) != std::string::npos;
        BOOST_TEST(resumed, "expected '" << loaded << "' in:\n" << again.out);
        const bool same = read_params(dir.path() / "final.safetensors") == ref;
        BOOST_TEST(same, "resumed parameters differ from the uninterrupted run's:\n" << again.out);
        return !f.exited_with(0) && took <= timeout_s + 5 && named && left.empty() && as_expected && resumed && same;
      });
}

void elastic_runs(const std::string& kind) {
  const Params& ref = reference();
  Tally tally{"elastic restart, " + kind, 0, 0, 0};
  repeat_runs(
      tally, [&] { return kind; },
      [&](const std::string&, int victim, const std::string& plan) {
        TempDir dir;
        Process p(job(dir.path(), true, true), {{"DTRAIN_FAULT_INJECT", plan}});
        const Finished f = p.wait(timeout_s + 120);
        tally.worst_s = std::max(tally.worst_s, wall_now() - fault_time(f.err, victim));
        BOOST_TEST_REQUIRE(f.exited_with(0), "the restarted job failed:\n" << f.err);
        const bool restarted = f.err.find("restarting all 2 local rank(s)") != std::string::npos;
        BOOST_TEST(restarted, f.err);
        const bool resumed =
            f.out.find("resumed from ") != std::string::npos || f.out.find("no checkpoint in") != std::string::npos;
        BOOST_TEST(resumed, "the restarted ranks did not go through resume=latest:\n" << f.out);
        const auto left = leftovers(dir.path(), p.pid());
        BOOST_TEST(left.empty(), "left behind: " << (left.empty() ? "" : left.front()));
        const bool same = read_params(dir.path() / "final.safetensors") == ref;
        BOOST_TEST(same, "parameters after the restart differ from the uninterrupted run's:\n" << f.out);
        return restarted && resumed && left.empty() && same;
      });
}

}  // namespace

BOOST_AUTO_TEST_CASE(kill_in_forward) { fail_runs("forward"); }
BOOST_AUTO_TEST_CASE(kill_in_backward) { fail_runs("backward"); }
BOOST_AUTO_TEST_CASE(kill_in_collective) { fail_runs("collective"); }
BOOST_AUTO_TEST_CASE(kill_during_save) { fail_runs("save"); }
BOOST_AUTO_TEST_CASE(elastic_after_kill_in_forward) { elastic_runs("forward"); }
BOOST_AUTO_TEST_CASE(elastic_after_kill_in_backward) { elastic_runs("backward"); }
BOOST_AUTO_TEST_CASE(elastic_after_kill_in_collective) { elastic_runs("collective"); }
BOOST_AUTO_TEST_CASE(elastic_after_kill_during_save) { elastic_runs("save"); }

// Two simulated nodes: the launcher of the surviving node cannot see the
// killed rank; its rank must notice through the transport (Gloo's closed
// connection) or the rendezvous store (the rank listed as departed), at worst
// at the collective timeout, and the job end there too.
// Then a single-node run at the same world size resumes from the last
// complete checkpoint and reproduces the uninterrupted run.
BOOST_AUTO_TEST_CASE(kill_on_another_node) {
  const Params& ref = reference();
  Tally tally{"kill -9, 2 nodes, random point", 0, 0, 0};
  const char* points[] = {"forward", "backward", "collective", "save"};
  const auto pick = [&] { return std::string(points[std::uniform_int_distribution<int>(0, 3)(rng())]); };
  repeat_runs(tally, pick, [&](const std::string&, int victim, const std::string& plan) {
    TempDir dir;
    const int port = [] {
      dtrain::TcpStoreServer probe(0, "127.0.0.1");
      return probe.port();
    }();
    Process n1(job(dir.path(), false, false, 1, port), {{"DTRAIN_FAULT_INJECT", plan}});
    Process n0(job(dir.path(), false, false, 0, port), {{"DTRAIN_FAULT_INJECT", plan}});
    const Finished f0 = n0.wait(timeout_s + 60);
    const double end0 = wall_now();
    const Finished f1 = n1.wait(timeout_s + 60);
    const double end1 = wall_now();
    const std::string err = f0.err + f1.err;
    const double took = std::max(end0, end1) - fault_time(err, victim);
    tally.worst_s = std::max(tally.worst_s, took);
    const bool failed = !f0.exited_with(0) && !f1.exited_with(0);
    BOOST_TEST(failed, "both nodes must fail:\n" << err);
    BOOST_TEST(took <= timeout_s + 5, "the job took " << took << " s to end after the kill");
    const bool named = err.find("was killed by SIGKILL") != std::string::npos;
    BOOST_TEST(named, err);
    const auto left0 = leftovers(dir.path(), n0.pid()), left1 = leftovers(dir.path(), n1.pid());
    BOOST_TEST((left0.empty() && left1.empty()),
               "left behind: " << (left0.empty() ? "" : left0.front()) << (left1.empty() ? "" : left1.front()));
    const Finished again = Process(job(dir.path(), false, true)).wait(120);
    BOOST_TEST_REQUIRE(again.exited_with(0), "resume=latest failed:\n" << again.err << again.out);
    const bool same = read_params(dir.path() / "final.safetensors") == ref;
    BOOST_TEST(same, "resumed parameters differ from the uninterrupted run's:\n" << again.out);
    return failed && took <= timeout_s + 5 && named && left0.empty() && left1.empty() && same;
  });
}

// A malformed plan is a usage error naming the variable, not a silent no-op.
BOOST_AUTO_TEST_CASE(malformed_plan_is_named) {
  TempDir dir;
  const Finished f = Process(job(dir.path(), false, false), {{"DTRAIN_FAULT_INJECT", "backwards:1:2"}}).wait(60);
  BOOST_TEST(!f.exited_with(0));
  BOOST_TEST(f.err.find("DTRAIN_FAULT_INJECT='backwards:1:2' names an unknown point") != std::string::npos, f.err);
}
