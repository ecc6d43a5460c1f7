// Host collectives across real processes: shared memory on one node at 2, 3
// and 4 ranks, the hierarchical path on two simulated nodes (two dtrain-run
// --nnodes 2 on this machine), Gloo when forced, and the failure paths: a
// peer killed with SIGKILL, a peer that throws, mismatched calls, and
// /dev/shm left clean after normal exits, exceptions and kill -9.
#define BOOST_TEST_MODULE comm_host_processes
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <dtrain/comm/store.hpp>

namespace fs = std::filesystem;
using namespace dtrain;

namespace {

// A port for a rendezvous, free when probed: below Linux's ephemeral range
// (32768-60999 by default), from which the kernel picks the local ports of
// outgoing connections (the Gloo pairs of tests running beside this one, one
// of which took a port 0 had handed out here once), and at random so that
// concurrent tests rarely pick the same one.
int free_port() {
  std::mt19937 pick(std::random_device{}());
  std::uniform_int_distribution<int> below_ephemeral(20000, 32000);
  for (int tries = 0; tries < 64; ++tries) {
    try {
      TcpStoreServer probe(below_ephemeral(pick), "127.0.0.1");
      return probe.port();
    } catch (const std::exception&) {  // taken: another
    }
  }
  TcpStoreServer probe(0, "127.0.0.1");
  return probe.port();
}

// Names in /dev/shm that start with `prefix`.
std::vector<std::string> segments(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Ranks started by this test (not by a launcher, which would kill the
// survivors as soon as one rank dies): each gets the launch variables and
// DTRAIN_JOB_ID, writes its output to <dir>/rank<r>.log.
struct Ranks {
  std::vector<pid_t> pids;
  fs::path dir;
  std::string job;

  // transport: DTRAIN_HOST_TRANSPORT for every rank ("" leaves it unset: auto).
  Ranks(int n, const std::string& mode, const std::string& tag, const std::string& transport = "") {
    job = std::to_string(::getpid());
    job.insert(job.begin(), 't');  // not `"t" + ...`: GCC 12 warns falsely (-Wrestrict) there
    job += tag;
    dir = fs::path(DTRAIN_TEST_BINARY_DIR) / ("host_processes_" + tag);
    fs::remove_all(dir);
    fs::create_directories(dir);
    const int port = free_port();
    std::fflush(nullptr);  // or the children write this process's buffered output again
    for (int r = 0; r < n; ++r) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        const std::string log = (dir / ("rank" + std::to_string(r) + ".log")).string();
        std::freopen(log.c_str(), "w", stdout);
        std::freopen(log.c_str(), "a", stderr);
        ::setenv("RANK", std::to_string(r).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
        ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
        ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        ::setenv("DTRAIN_COMM_TIMEOUT_S", "60", 1);
        ::setenv("DTRAIN_JOB_ID", job.c_str(), 1);
        ::setenv("DTRAIN_JOB_TOKEN", "host-processes-test-token-0123456789abcdef", 1);
        if (!transport.empty()) ::setenv("DTRAIN_HOST_TRANSPORT", transport.c_str(), 1);
        ::execl(COMM_CHILD_PATH, COMM_CHILD_PATH, "--mode", mode.c_str(), static_cast<char*>(nullptr));
        std::_Exit(127);
      }
      pids.push_back(pid);
    }
  }
  // Exit codes by rank; ranks still running after `limit` are killed (137).
  std::vector<int> wait(std::chrono::seconds limit = std::chrono::seconds(60)) {
    std::vector<int> codes(pids.size(), -1);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (std::size_t left = pids.size(); left > 0;) {
      for (std::size_t r = 0; r < pids.size(); ++r) {
        if (codes[r] != -1) continue;
        int status = 0;
        if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
          codes[r] = exit_code(status);
          --left;
        } else if (std::chrono::steady_clock::now() > deadline) {
          ::kill(pids[r], SIGKILL);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return codes;
  }
  std::string log(int r) const { return slurp(dir / ("rank" + std::to_string(r) + ".log")); }
};

int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return exit_code(status);
}

std::string launcher(int nproc, int port) {
  // Appended, not a chain of +: on the chain GCC 12 at -O1, with the tests'
  // precompiled header, reports a false -Warray-bounds in std::string.
  std::string cmd = "timeout 120 ";
  cmd += DTRAIN_RUN_PATH;
  cmd += " --nproc-per-node " + std::to_string(nproc) + " --master-port " + std::to_string(port) + " ";
  return cmd;
}

}  // namespace

BOOST_AUTO_TEST_CASE(shared_memory_collectives_at_2_3_and_4_processes) {
  for (int n : {2, 3, 4}) {
    BOOST_TEST_INFO("world of " << n << " processes");
    BOOST_TEST(run(launcher(n, free_port()) + COMM_CHILD_PATH + " --expect shm") == 0);
  }
}

BOOST_AUTO_TEST_CASE(gloo_when_forced) {
  for (int n : {2, 3}) {
    BOOST_TEST_INFO("world of " << n << " processes");
    BOOST_TEST(run("DTRAIN_HOST_TRANSPORT=gloo " + launcher(n, free_port()) + COMM_CHILD_PATH + " --expect gloo") == 0);
  }
}

// Two dtrain-run with --nnodes 2 on this machine are two nodes (GROUP_RANK
// differs): shared memory within each, Gloo between them. One rank per node
// has nothing to share and uses Gloo alone.
BOOST_AUTO_TEST_CASE(two_simulated_nodes_use_the_hierarchical_path) {
  for (auto [per_node, expect] : {std::pair{2, "shm+gloo"}, std::pair{1, "gloo"}}) {
    const int port = free_port();
    auto node = [&, per_node = per_node, expect = expect](int rank) {
      // Both nodes' launchers get the job's token, as a job script exports it.
      return std::string("DTRAIN_JOB_TOKEN=host-processes-test-token-0123456789abcdef timeout 120 ") + DTRAIN_RUN_PATH +
             " --nnodes 2 --node-rank " + std::to_string(rank) + " --master-addr 127.0.0.1 --master-port " +
             std::to_string(port) + " --nproc-per-node " + std::to_string(per_node) + " " + COMM_CHILD_PATH +
             " --expect " + expect;
    };
    const std::string cmd = "( " + node(1) + " & " + node(0) + "; a=$?; wait $!; b=$?; exit $((a|b)) )";
    BOOST_TEST_INFO(per_node << " rank(s) per node, expecting " << expect);
    BOOST_TEST(run(cmd) == 0);
  }
}

BOOST_AUTO_TEST_CASE(a_peer_killed_with_sigkill_fails_the_others_fast_and_leaves_no_segment) {
  Ranks ranks(3, "die", "die");
  const auto start = std::chrono::steady_clock::now();
  const auto codes = ranks.wait();
  const auto took = std::chrono::steady_clock::now() - start;
  BOOST_TEST(codes[1] == 128 + SIGKILL);
  for (int r : {0, 2}) {
    BOOST_TEST_INFO("rank " << r << ": " << ranks.log(r));
    BOOST_TEST(codes[static_cast<std::size_t>(r)] == 3);
    BOOST_TEST(ranks.log(r).find("exited or was killed") != std::string::npos);
  }
  BOOST_TEST((took < std::chrono::seconds(20)));  // the timeout is 60 s
  BOOST_TEST(segments("dtrain-" + ranks.job).empty());
}

// Over Gloo the survivor learns of the death from the dropped connection: it
// says so, and does not blame ranks for "never reaching" the collective from
// heartbeat numbers that are stale by then.
BOOST_AUTO_TEST_CASE(a_peer_killed_over_gloo_is_reported_as_a_failed_connection) {
  Ranks ranks(2, "die", "die_gloo", "gloo");
  const auto codes = ranks.wait();
  BOOST_TEST_INFO("rank 0: " << ranks.log(0));
  BOOST_TEST(codes[1] == 128 + SIGKILL);
  BOOST_TEST(codes[0] == 3);
  BOOST_TEST(ranks.log(0).find("a peer's connection failed") != std::string::npos);
  BOOST_TEST(ranks.log(0).find("never reached it") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_peer_that_throws_fails_the_others_fast) {
  Ranks ranks(2, "throw", "throw");
  const auto codes = ranks.wait();
  BOOST_TEST_INFO(ranks.log(0) << ranks.log(1));
  BOOST_TEST(codes[1] == 1);
  BOOST_TEST(codes[0] == 3);
  BOOST_TEST(segments("dtrain-" + ranks.job).empty());
}

BOOST_AUTO_TEST_CASE(mismatched_calls_are_named_on_every_rank) {
  Ranks ranks(2, "mismatch", "mismatch");
  const auto codes = ranks.wait();
  for (int r : {0, 1}) {
    BOOST_TEST_INFO("rank " << r << ": " << ranks.log(r));
    BOOST_TEST(codes[static_cast<std::size_t>(r)] == 3);
    BOOST_TEST(ranks.log(r).find("all_reduce of 12 fp32") != std::string::npos);
    BOOST_TEST(ranks.log(r).find("all_reduce of 10 fp32") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(dev_shm_is_clean_after_normal_exit_and_kill_minus_9) {
  {
    Ranks ranks(3, "check", "clean");
    const auto codes = ranks.wait();
    for (int c : codes) BOOST_TEST(c == 0);
    BOOST_TEST(segments("dtrain-" + ranks.job).empty());
  }
  {
    Ranks ranks(3, "hold", "hold");
    for (int r = 0; r < 3; ++r)  // every rank attached and past its first collective
      for (int i = 0; i < 6000 && ranks.log(r).find("ready") == std::string::npos; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (pid_t p : ranks.pids) ::kill(p, SIGKILL);
    const auto codes = ranks.wait();
    for (int c : codes) BOOST_TEST(c == 128 + SIGKILL);
    BOOST_TEST(segments("dtrain-" + ranks.job).empty());
  }
}

// A name left by a rank killed during set-up, before every rank attached and
// the name was unlinked, is removed by dtrain-run when the job ends.
BOOST_AUTO_TEST_CASE(dtrain_run_removes_segments_a_killed_rank_left_behind) {
  BOOST_TEST(run(launcher(1, free_port()) + COMM_CHILD_PATH + " --mode leak") == 128 + SIGKILL);
  for (const auto& name : segments("dtrain-r")) BOOST_TEST(!name.ends_with("-leak"), name << " was left in /dev/shm");
}
