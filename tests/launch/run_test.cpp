// dtrain-run end to end: the real launcher starting real rank processes
// (launch_child.cpp), checked from outside.

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "launch/process.hpp"
#include "launcher/launcher.hpp"
#include <boost/test/unit_test.hpp>

namespace {

namespace fs = std::filesystem;
using dtrain::test::EnvChanges;
using dtrain::test::Finished;
using dtrain::test::TempDir;

const std::string launcher = DTRAIN_RUN_PATH;
const std::string child = DTRAIN_LAUNCH_CHILD_PATH;

// Thread variables unset, so the launcher's own choice is what ranks see.
const EnvChanges no_thread_vars{{"OMP_NUM_THREADS", std::nullopt}, {"OPENBLAS_NUM_THREADS", std::nullopt}};

Finished run(std::vector<std::string> flags, std::vector<std::string> child_args,
             const EnvChanges& env = no_thread_vars, int cpu_limit = 0) {
  std::vector<std::string> args{launcher};
  args.insert(args.end(), flags.begin(), flags.end());
  args.push_back(child);
  args.insert(args.end(), child_args.begin(), child_args.end());
  return dtrain::test::run(args, env, cpu_limit);
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool has_line(const std::string& text, const std::string& line) {
  auto all = lines(text);
  return std::find(all.begin(), all.end(), line) != all.end();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string report(const Finished& f) {
  return "status " + std::to_string(f.status) + "\nstdout:\n" + f.out + "\nstderr:\n" + f.err;
}

// The port a rank reported, checking the rest of its line on the way.
int check_rank_line(const Finished& f, int rank, int world, int local, int local_world, const std::string& addr) {
  std::string head = "[rank " + std::to_string(rank) + "] rank=" + std::to_string(rank) +
                     " world=" + std::to_string(world) + " local=" + std::to_string(local) +
                     " local_world=" + std::to_string(local_world) + " addr=" + addr + " port=";
  for (const auto& line : lines(f.out)) {
    if (line.rfind(head, 0) != 0) continue;
    BOOST_TEST(contains(line, " source=torchrun"), line);
    return std::stoi(line.substr(head.size()));
  }
  BOOST_ERROR("no line starting '" << head << "'\n" << report(f));
  return -1;
}

void check_no_survivors(const TempDir& dir, std::size_t expected_ranks) {
  BOOST_TEST(dtrain::test::recorded_pids(dir).size() == expected_ranks);
  BOOST_TEST(dtrain::test::survivors(dir).empty(), "rank processes outlived dtrain-run");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dtrain_run)

BOOST_AUTO_TEST_CASE(two_ranks_see_their_environment) {
  TempDir dir;
  auto f = run({"--nproc-per-node", "2"}, {"env", dir.path()});
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  std::set<int> ports;
  for (int r = 0; r < 2; ++r) ports.insert(check_rank_line(f, r, 2, r, 2, "127.0.0.1"));
  BOOST_TEST(ports.size() == 1u, "ranks disagree on MASTER_PORT");
  BOOST_TEST(*ports.begin() >= 1);
  BOOST_TEST(*ports.begin() <= 65535);
  std::string threads = std::to_string(std::max(1, dtrain::usable_cpu_count() / 2));
  for (int r = 0; r < 2; ++r) {
    auto prefix = "[rank " + std::to_string(r) + "] ";
    BOOST_TEST(has_line(f.out, prefix +
                                   "GROUP_RANK=0 DTRAIN_RUN=1 DTRAIN_RESTART_COUNT=0 "
                                   "OMP_NUM_THREADS=" +
                                   threads + " OPENBLAS_NUM_THREADS=" + threads),
               report(f));
    // stdout and stderr stay apart; an unfinished last line is still flushed.
    BOOST_TEST(has_line(f.err, prefix + "to stderr from " + std::to_string(r)), report(f));
    BOOST_TEST(has_line(f.out, prefix + "unfinished line from " + std::to_string(r)), report(f));
  }
  check_no_survivors(dir, 2);
}

// Under `ulimit -v` OpenBLAS's threads, 136 MiB of address space each, get a
// quarter of the limit: on 16 cores (many_cores.cpp) 2 ranks' share is 8,
// and 3000000 KiB holds 5. OpenMP's threads reserve no buffer and keep 8.
BOOST_AUTO_TEST_CASE(blas_threads_fit_the_address_space_limit) {
  if (dtrain::test::sanitizer_shadow) {
    BOOST_TEST_MESSAGE("not run in a sanitizer build: ulimit -v leaves no room for its shadow memory");
    return;
  }
  TempDir dir;
  auto f = dtrain::test::run({"/bin/sh", "-c",
                              "ulimit -v 3000000 && LD_PRELOAD=" + std::string(MANY_CORES_PATH) + " exec " + launcher +
                                  " --nproc-per-node 2 " + child + " env " + dir.path().string()},
                             no_thread_vars);
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  for (int r = 0; r < 2; ++r)
    BOOST_TEST(has_line(f.out, "[rank " + std::to_string(r) +
                                   "] GROUP_RANK=0 DTRAIN_RUN=1 DTRAIN_RESTART_COUNT=0 "
                                   "OMP_NUM_THREADS=8 OPENBLAS_NUM_THREADS=5"),
               report(f));
  check_no_survivors(dir, 2);
}

// The launcher itself loads neither OpenBLAS (whose pool, started as it
// loads, took 16 x 136 MiB on 16 cores and whose fork handler waited for a
// pool thread that found no room) nor the CUDA libraries: it starts ranks
// under a limit that holds none of them.
BOOST_AUTO_TEST_CASE(the_launcher_fits_a_small_address_space) {
  auto f = dtrain::test::run({"/bin/sh", "-c",
                              "ulimit -v 120000 && LD_PRELOAD=" + std::string(MANY_CORES_PATH) + " exec " + launcher +
                                  " --nproc-per-node 2 /bin/sh -c 'echo started'"},
                             no_thread_vars);
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  for (int r = 0; r < 2; ++r) BOOST_TEST(has_line(f.out, "[rank " + std::to_string(r) + "] started"), report(f));
}

BOOST_AUTO_TEST_CASE(three_ranks_on_the_second_node) {
  TempDir dir;
  auto f = run({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "3", "--master-addr", "10.0.0.7",
                "--master-port", "23456"},
               {"env", dir.path()},
               {{"OMP_NUM_THREADS", "7"},
                {"OPENBLAS_NUM_THREADS", "3"},
                {"DTRAIN_JOB_TOKEN", "run-test-job-token-0123456789abcdef0123"}});
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  for (int local = 0; local < 3; ++local) {
    BOOST_TEST(check_rank_line(f, 3 + local, 6, local, 3, "10.0.0.7") == 23456);
    BOOST_TEST(has_line(f.out, "[rank " + std::to_string(3 + local) +
                                   "] GROUP_RANK=1 DTRAIN_RUN=1 DTRAIN_RESTART_COUNT=0 "
                                   "OMP_NUM_THREADS=7 OPENBLAS_NUM_THREADS=3"),
               report(f));
  }
  check_no_survivors(dir, 3);
}

BOOST_AUTO_TEST_CASE(no_prefix_passes_output_through) {
  TempDir dir;
  auto f = run({"--nproc-per-node", "2", "--no-prefix"}, {"env", dir.path()});
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  BOOST_TEST(!contains(f.out, "[rank"), report(f));
  BOOST_TEST(has_line(f.err, "to stderr from 1"), report(f));
  BOOST_TEST(contains(f.out, "rank=1 world=2 local=1 local_world=2"), report(f));
}

BOOST_AUTO_TEST_CASE(nproc_gpu_and_auto) {
  TempDir dir;
  int gpus = dtrain::cuda_device_count();
  auto gpu = run({"--nproc-per-node", "gpu"}, {"env", dir.path()});
  if (gpus == 0) {
    BOOST_TEST(gpu.exited_with(2), report(gpu));
    BOOST_TEST(contains(gpu.err, "no CUDA device"), report(gpu));
    BOOST_TEST(dtrain::test::recorded_pids(dir).empty());
  } else {
    BOOST_TEST(gpu.exited_with(0), report(gpu));
    check_rank_line(gpu, gpus - 1, gpus, gpus - 1, gpus, "127.0.0.1");
  }
  // Two CPUs at most, so "auto" without a GPU starts two ranks, not one per
  // core of a big machine.
  int expected = gpus > 0 ? gpus : std::min(2, dtrain::usable_cpu_count());
  auto automatic = run({"--nproc-per-node", "auto"}, {"env", dir.path()}, no_thread_vars, 2);
  BOOST_TEST(automatic.exited_with(0), report(automatic));
  check_rank_line(automatic, expected - 1, expected, expected - 1, expected, "127.0.0.1");
}

BOOST_AUTO_TEST_CASE(a_failing_rank_stops_the_others_quickly) {
  TempDir dir;
  // Ranks 0 and 2 would sleep 60 s; rank 1 exits 3 at once.
  auto f = run({"--nproc-per-node", "3"}, {"fail", dir.path(), "1", "3"});
  BOOST_TEST(f.exited_with(3), report(f));
  BOOST_TEST(f.seconds < 20);
  BOOST_TEST(contains(f.err, "rank 1 (pid"), report(f));
  BOOST_TEST(contains(f.err, "exited with code 3"), report(f));
  check_no_survivors(dir, 3);
}

BOOST_AUTO_TEST_CASE(a_rank_killed_by_a_signal_gives_128_plus_signal) {
  TempDir dir;
  auto f = run({"--nproc-per-node", "2"}, {"fail", dir.path(), "0", "sigkill"});
  BOOST_TEST(f.exited_with(128 + SIGKILL), report(f));
  BOOST_TEST(contains(f.err, "rank 0"), report(f));
  BOOST_TEST(contains(f.err, "killed by SIGKILL"), report(f));
  check_no_survivors(dir, 2);
}

BOOST_AUTO_TEST_CASE(ranks_ignoring_sigterm_are_killed_after_the_grace_period) {
  TempDir dir;
  auto f = run({"--nproc-per-node", "2", "--grace-period", "0.5"}, {"fail", dir.path(), "1", "4", "ignore"});
  BOOST_TEST(f.exited_with(4), report(f));
  BOOST_TEST(f.seconds >= 0.5);
  BOOST_TEST(f.seconds < 20);
  BOOST_TEST(contains(f.err, "sending SIGKILL"), report(f));
  check_no_survivors(dir, 2);
}

BOOST_AUTO_TEST_CASE(sigterm_is_forwarded_to_every_rank) {
  TempDir dir;
  dtrain::test::Process p({launcher, "--nproc-per-node", "2", child, "trap-term", dir.path()});
  BOOST_REQUIRE(dtrain::test::wait_for_files({dir / "ready.0", dir / "ready.1"}));
  ::kill(p.pid(), SIGTERM);
  auto f = p.wait();
  BOOST_TEST(f.killed_by(SIGTERM), report(f));
  BOOST_TEST(std::filesystem::exists(dir / "term.0"));
  BOOST_TEST(std::filesystem::exists(dir / "term.1"));
  check_no_survivors(dir, 2);
}

BOOST_AUTO_TEST_CASE(a_second_signal_kills_at_once) {
  TempDir dir;
  dtrain::test::Process p(
      {launcher, "--nproc-per-node", "2", "--grace-period", "60", child, "ignore-signals", dir.path()});
  BOOST_REQUIRE(dtrain::test::wait_for_files({dir / "ready.0", dir / "ready.1"}));
  ::kill(p.pid(), SIGINT);
  // Signals of one kind do not queue: send the second once the first is seen.
  BOOST_REQUIRE(dtrain::test::wait_until([&] { return contains(p.stderr_so_far(), "forwarding"); }));
  ::kill(p.pid(), SIGINT);
  auto f = p.wait();
  BOOST_TEST(f.killed_by(SIGINT), report(f));
  BOOST_TEST(f.seconds < 20);  // far below the 60 s grace period
  BOOST_TEST(contains(f.err, "again"), report(f));
  check_no_survivors(dir, 2);
}

#ifdef __linux__
BOOST_AUTO_TEST_CASE(ranks_die_with_a_killed_launcher) {
  TempDir dir;
  dtrain::test::Process p({launcher, "--nproc-per-node", "2", child, "ignore-signals", dir.path()});
  BOOST_REQUIRE(dtrain::test::wait_for_files({dir / "ready.0", dir / "ready.1"}));
  ::kill(p.pid(), SIGKILL);  // cannot be forwarded: PR_SET_PDEATHSIG must act
  auto f = p.wait();
  BOOST_TEST(f.killed_by(SIGKILL));
  BOOST_TEST(dtrain::test::recorded_pids(dir).size() == 2u);
  BOOST_TEST(dtrain::test::wait_until([&] { return dtrain::test::survivors(dir).empty(); }, 10));
}
#endif

BOOST_AUTO_TEST_CASE(max_restarts_reruns_the_group) {
  TempDir dir;
  auto f = run({"--nproc-per-node", "2", "--max-restarts", "1"}, {"fail-once", dir.path(), "5"});
  BOOST_TEST(f.exited_with(0), report(f));
  BOOST_TEST(contains(f.err, "restart 1 of 1"), report(f));
  BOOST_TEST(has_line(f.out, "[rank 0] restart=1"), report(f));
  BOOST_TEST(has_line(f.out, "[rank 1] restart=1"), report(f));
  // First start: 2 ranks; second start: 2 more.
  BOOST_TEST(dtrain::test::recorded_pids(dir).size() == 4u);
  BOOST_TEST(dtrain::test::survivors(dir).empty());
}

BOOST_AUTO_TEST_CASE(without_restarts_the_failure_is_final) {
  TempDir dir;
  auto f = run({"--nproc-per-node", "2"}, {"fail-once", dir.path(), "5"});
  BOOST_TEST(f.exited_with(5), report(f));
  BOOST_TEST(!contains(f.out, "restart=1"), report(f));
}

BOOST_AUTO_TEST_CASE(bad_flags_exit_2_without_starting_anything) {
  TempDir dir;
  const std::vector<std::vector<std::string>> bad = {
      {"--bogus"},
      {"--nproc-per-node", "0"},
      {"--nproc-per-node", "x"},
      {"--nnodes", "2", "--node-rank", "2", "--master-addr", "h"},
      {"--master-port", "70000"},
      {"--grace-period", "-1"},
      {"--max-restarts"},
  };
  for (const auto& flags : bad) {
    auto f = run(flags, {"env", dir.path()});
    BOOST_TEST(f.exited_with(2), flags.front() << ": " << report(f));
    BOOST_TEST(contains(f.err, "dtrain-run: error: "), report(f));
    BOOST_TEST(contains(f.err, "fix: "), report(f));
  }
  auto none = dtrain::test::run({launcher, "--nproc-per-node", "2"});
  BOOST_TEST(none.exited_with(2), report(none));
  BOOST_TEST(dtrain::test::recorded_pids(dir).empty());
}

BOOST_AUTO_TEST_CASE(missing_program_exits_127) {
  auto f = dtrain::test::run({launcher, "/nonexistent/dtrain-program"});
  BOOST_TEST(f.exited_with(127), report(f));
  BOOST_TEST(contains(f.err, "/nonexistent/dtrain-program"), report(f));
}

// The README's and docs/launcher.md's torchrun command lines, with dtrain-run
// in torchrun's place and every flag in torchrun's own spelling.
BOOST_AUTO_TEST_CASE(torchrun_spellings_standalone) {
  TempDir dir;
  auto f = run({"--standalone", "--nproc_per_node", "2", "--no_python"}, {"env", dir.path()});
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  std::set<int> ports;
  for (int r = 0; r < 2; ++r) ports.insert(check_rank_line(f, r, 2, r, 2, "127.0.0.1"));
  BOOST_TEST(ports.size() == 1u, "ranks disagree on MASTER_PORT");
  // A run id of its own, as torchrun's --standalone makes one.
  std::string id;
  for (const auto& line : lines(f.out))
    if (line.rfind("[rank 1] TORCHELASTIC_RUN_ID=", 0) == 0) id = line.substr(29, line.find(' ', 29) - 29);
  BOOST_TEST(id.size() == 32u, report(f));
  BOOST_TEST(has_line(f.out, "[rank 0] TORCHELASTIC_RUN_ID=" + id + " DTRAIN_LAUNCH_DEVICE=<unset>"), report(f));
  check_no_survivors(dir, 2);
}

BOOST_AUTO_TEST_CASE(torchrun_spellings_c10d_and_master_flags) {
  const std::string port = std::to_string(dtrain::free_tcp_port());
  const std::vector<std::vector<std::string>> launches = {
      {"--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:" + port, "--rdzv_id", "job1", "--nnodes", "1",
       "--nproc_per_node", "2", "--no_python"},
      {"--master_addr", "127.0.0.1", "--master_port", port, "--node_rank", "0", "--nnodes", "1:1", "--nproc_per_node",
       "2", "--max_restarts", "0", "--monitor_interval", "1", "--start_method", "spawn", "--no_python"}};
  for (const auto& flags : launches) {
    TempDir dir;
    auto f = run(flags, {"env", dir.path()});
    BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
    for (int r = 0; r < 2; ++r) BOOST_TEST(check_rank_line(f, r, 2, r, 2, "127.0.0.1") == std::stoi(port));
    const std::string id = flags.front() == "--rdzv_backend" ? "job1" : "none";
    BOOST_TEST(has_line(f.out, "[rank 1] TORCHELASTIC_RUN_ID=" + id + " DTRAIN_LAUNCH_DEVICE=<unset>"), report(f));
    check_no_survivors(dir, 2);
  }
}

// This run's log folder under `root`: exactly one, RDZVID_XXXXXX.
fs::path only_run_dir(const fs::path& root, const std::string& rdzv_id) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().rfind(rdzv_id + "_", 0) == 0) found.push_back(e.path());
  BOOST_REQUIRE_EQUAL(found.size(), 1u);
  return found.front();
}

// --redirects 3: both streams go to each rank's files, none to the console.
BOOST_AUTO_TEST_CASE(torchrun_spellings_log_dir_and_redirects) {
  TempDir dir;
  const std::string logs = dir / "logs";
  auto f = run({"--log_dir", logs, "--redirects", "3", "--rdzv_id", "job2", "--nproc_per_node", "2", "--no_python"},
               {"env", dir.path()});
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  BOOST_TEST(!contains(f.out, "[rank"), report(f));
  BOOST_TEST(!contains(f.err, "[rank"), report(f));
  const fs::path run_dir = only_run_dir(logs, "job2");
  BOOST_TEST(contains(f.err, "dtrain-run: rank logs (--redirects/--tee) go to " + run_dir.string()), report(f));
  for (int r = 0; r < 2; ++r) {
    const std::string R = std::to_string(r);
    const std::string out = dtrain::test::read_text(run_dir / "attempt_0" / R / "stdout.log");
    const std::string err = dtrain::test::read_text(run_dir / "attempt_0" / R / "stderr.log");
    BOOST_TEST(contains(out, "rank=" + R + " world=2 local=" + R + " local_world=2 addr=127.0.0.1"), out);
    BOOST_TEST(contains(out, "TORCHELASTIC_RUN_ID=job2"), out);
    BOOST_TEST(contains(out, "unfinished line from " + R), out);  // raw: no prefix in the file
    BOOST_TEST(err == "to stderr from " + R + "\n");
  }
  check_no_survivors(dir, 2);
}

// --tee 3 (no --log-dir: a folder under TMPDIR) keeps the console's lines
// and copies them; a per-rank map sends rank 1's stderr to its file only.
BOOST_AUTO_TEST_CASE(torchrun_spellings_tee) {
  TempDir dir;
  EnvChanges env = no_thread_vars;
  env.emplace_back("TMPDIR", dir.path().string());
  auto f = run({"--tee", "3", "--nproc_per_node", "2", "--no_python"}, {"env", dir.path()}, env);
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  const fs::path run_dir = only_run_dir(dir.path() / "dtrain-run", "none");
  for (int r = 0; r < 2; ++r) {
    const std::string R = std::to_string(r);
    check_rank_line(f, r, 2, r, 2, "127.0.0.1");
    BOOST_TEST(has_line(f.err, "[rank " + R + "] to stderr from " + R), report(f));
    BOOST_TEST(contains(dtrain::test::read_text(run_dir / "attempt_0" / R / "stdout.log"), "rank=" + R + " world=2"));
    BOOST_TEST(dtrain::test::read_text(run_dir / "attempt_0" / R / "stderr.log") == "to stderr from " + R + "\n");
  }

  TempDir logs;
  auto mapped = run({"--log-dir", logs.path().string(), "-r", "1:2", "--nproc-per-node", "2"}, {"env", dir.path()});
  BOOST_REQUIRE_MESSAGE(mapped.exited_with(0), report(mapped));
  BOOST_TEST(has_line(mapped.err, "[rank 0] to stderr from 0"), report(mapped));
  BOOST_TEST(!contains(mapped.err, "to stderr from 1"), report(mapped));
  BOOST_TEST(has_line(mapped.out, "[rank 1] unfinished line from 1"), report(mapped));
  const fs::path mapped_dir = only_run_dir(logs.path(), "none");
  BOOST_TEST(dtrain::test::read_text(mapped_dir / "attempt_0/1/stderr.log") == "to stderr from 1\n");
  BOOST_TEST(!fs::exists(mapped_dir / "attempt_0/0/stdout.log"));  // (the folder holds its error record's place)
  BOOST_TEST(!fs::exists(mapped_dir / "attempt_0/0/stderr.log"));
}

// Each restart logs to a folder of its own, as torchrun's attempt_N; a log
// folder that cannot be made stops dtrain-run before any rank starts.
BOOST_AUTO_TEST_CASE(log_folders_per_restart) {
  TempDir dir;
  auto f = run({"--log-dir", dir / "logs", "--redirects", "1", "--nproc-per-node", "2", "--max-restarts", "1"},
               {"fail-once", dir.path(), "5"});
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  const fs::path run_dir = only_run_dir(dir / "logs", "none");
  BOOST_TEST(fs::exists(run_dir / "attempt_0/0/stdout.log"));
  BOOST_TEST(dtrain::test::read_text(run_dir / "attempt_1/1/stdout.log") == "restart=1\n");
  BOOST_TEST(!contains(f.out, "restart=1"), report(f));  // redirected, not on the console

  auto bad = run({"--log-dir", "/proc/dtrain-no-such-dir", "--tee", "3"}, {"env", dir.path()});
  BOOST_TEST(bad.exited_with(2), report(bad));
  BOOST_TEST(contains(bad.err, "dtrain-run: error: cannot make a log folder in /proc/dtrain-no-such-dir"), report(bad));
  BOOST_TEST(dtrain::test::recorded_pids(dir).size() == 4u);  // the 2 + 2 of the first run only
}

// Rank 1 exits first, but only echoing rank 0's error, which rank 0 recorded
// earlier (dtrain::record_failure) and is slow to exit on: rank 0's error is
// the cause and its code (2) the exit status, with or without a log folder
// (its record then stays there, in the form torchrun reads too).
BOOST_AUTO_TEST_CASE(the_earliest_recorded_error_is_the_cause) {
  TempDir dir;
  auto f = run({"--nproc-per-node", "3"}, {"echo-failure", dir.path()});
  BOOST_TEST(f.exited_with(2), report(f));
  BOOST_TEST(contains(f.err, "rank 0 failed first (its error was raised "), report(f));
  BOOST_TEST(contains(f.err, "ended): rank 0's own bad setting\n"), report(f));
  BOOST_TEST(contains(f.err, "rank 0 failed; exiting with code 2"), report(f));
  BOOST_TEST(f.seconds < 20);
  check_no_survivors(dir, 3);

  TempDir logged;
  auto g =
      run({"--log-dir", logged / "logs", "--redirects", "3", "--nproc-per-node", "2"}, {"echo-failure", logged.path()});
  BOOST_TEST(g.exited_with(2), report(g));
  const fs::path run_dir = only_run_dir(logged / "logs", "none");
  const std::string record = dtrain::test::read_text(run_dir / "attempt_0/0/error.json");
  BOOST_TEST(contains(record, "{\"message\": \"rank 0's own bad setting\\n  fix: give a good one\\n  at: "), record);
  BOOST_TEST(contains(record, "\"timestamp\": \""), record);
  BOOST_TEST(contains(record, "\"exit_code\": 2"), record);
  BOOST_TEST(contains(dtrain::test::read_text(run_dir / "attempt_0/1/error.json"), "\"exit_code\": 1"));
}

// Each flag torchrun has but dtrain-run cannot honour: exit 2 before any
// rank starts, with the problem on one line and the fix on the next.
BOOST_AUTO_TEST_CASE(torchrun_flags_without_a_meaning_here) {
  TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--nnodes", "1:2", "--nproc_per_node", "2"},
       "--nnodes 1:2: elastic MIN:MAX node counts are not supported\n"
       "  fix: pass a fixed --nnodes N, and restart the job (or use --max-restarts K) when a node fails"},
      {{"-m", "train"},
       "-m runs a Python module, but dtrain-run runs programs, not Python modules\n"
       "  fix: name the program: dtrain-run [options] python3 -m MODULE [ARGS...]"},
      {{"--rdzv_backend", "etcd", "--rdzv_endpoint", "127.0.0.1:2379"},
       "--rdzv-backend etcd is not supported: dtrain's ranks meet at rank 0's TCP store\n"
       "  fix: use --rdzv-backend c10d --rdzv-endpoint HOST:PORT"},
      {{"--rdzv_conf", "join_timeout=5"}, "torchrun's --rdzv-conf is not supported by dtrain-run"},
  };
  for (const auto& [flags, message] : refused) {
    auto f = run(flags, {"env", dir.path()});
    BOOST_TEST(f.exited_with(2), flags.front() << ": " << report(f));
    BOOST_TEST(contains(f.err, "dtrain-run: error: " + message), report(f));
  }
  // Without a GPU, `gpu` names the CPU alternative.
  if (dtrain::cuda_device_count() == 0) {
    auto f = run({"--nproc_per_node", "gpu", "--no_python"}, {"env", dir.path()});
    BOOST_TEST(f.exited_with(2), report(f));
    BOOST_TEST(contains(f.err,
                        "dtrain-run: error: --nproc-per-node gpu, but no CUDA device is visible\n"
                        "  fix: pass --nproc-per-node N to run N ranks on the CPU"),
               report(f));
  }
  BOOST_TEST(dtrain::test::recorded_pids(dir).empty());
}

// With GPUs, every rank hears that it was started for one.
BOOST_AUTO_TEST_CASE(nproc_gpu_marks_the_ranks) {
  const int gpus = dtrain::cuda_device_count();
  if (gpus == 0) {
    BOOST_TEST_MESSAGE("no CUDA device: --nproc-per-node gpu is refused (checked above)");
    return;
  }
  TempDir dir;
  auto f = run({"--nproc_per_node", "gpu"}, {"env", dir.path()});
  BOOST_REQUIRE_MESSAGE(f.exited_with(0), report(f));
  BOOST_TEST(has_line(f.out, "[rank 0] TORCHELASTIC_RUN_ID=none DTRAIN_LAUNCH_DEVICE=gpu"), report(f));
}

BOOST_AUTO_TEST_CASE(help_and_version) {
  auto help = dtrain::test::run({launcher, "--help"});
  BOOST_TEST(help.exited_with(0));
  BOOST_TEST(help.out == dtrain::run_usage());
  auto version = dtrain::test::run({launcher, "--version"});
  BOOST_TEST(version.exited_with(0));
  BOOST_TEST(version.out.rfind("dtrain-run ", 0) == 0u, version.out);
  auto token = dtrain::test::run({launcher, "--new-token"});
  BOOST_TEST(token.exited_with(0));
  BOOST_TEST(token.out.size() == 65u, token.out);  // 64 hex digits and a newline
  BOOST_TEST(token.out.find_first_not_of("0123456789abcdef\n") == std::string::npos, token.out);
}

// Several nodes need the token given; dtrain-run says how, and starts nothing.
BOOST_AUTO_TEST_CASE(several_nodes_without_a_token_stop_at_start) {
  TempDir dir;
  auto f = run({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--master-addr", "10.0.0.7",
                "--master-port", "23456"},
               {"env", dir.path()}, {{"DTRAIN_JOB_TOKEN", std::nullopt}, {"DTRAIN_INSECURE_NO_TOKEN", std::nullopt}});
  BOOST_TEST(f.exited_with(1), report(f));
  BOOST_TEST(f.err.find("needs one job token on every node") != std::string::npos, report(f));
  check_no_survivors(dir, 0);
}

BOOST_AUTO_TEST_SUITE_END()
