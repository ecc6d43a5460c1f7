// The same train_mlp job under every launcher users already have: dtrain-run,
// torchrun (its default static rendezvous and the c10d one), Open MPI's
// mpirun, and Slurm's srun, simulated by starting the two tasks here with the
// variables srun gives each task. Every run must see two ranks and end with
// parameters bit-identical to dtrain-run's: the program, the data and the
// order of every floating-point sum are the same, only who started the
// processes differs. That includes each rank's OpenBLAS thread count, which
// changes how a GEMM splits its sums: dtrain-run passes it, and under the
// other launchers dtrain works out the same share from their variables
// (nobody sets OPENBLAS_NUM_THREADS here).
// A launcher that is not installed is reported as skipped; one that is
// installed must work.
#define BOOST_TEST_MODULE launchers
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <launch/process.hpp>
#include <launcher/launcher.hpp>

#include <dtrain/comm/store.hpp>
#include <dtrain/io/safetensors.hpp>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using dtrain::test::EnvChanges;
using dtrain::test::Finished;
using dtrain::test::Group;
using dtrain::test::Process;
using dtrain::test::TempDir;

constexpr int steps = 15;
// A run that hangs (a rendezvous nobody joins, a launcher that never exits)
// is stopped after this and fails the test; a healthy one takes seconds.
constexpr double run_limit_s = 90;

// Scratch files of the whole test program; removed at exit.
TempDir& scratch() {
  static TempDir dir;
  return dir;
}

// Where launcher `name` is installed: Debian's in /usr/bin first (an earlier `torchrun` on
// PATH may belong to a Python without torch), then PATH; "" if there is none.
std::string find_program(const std::string& name) {
  std::string dirs = "/usr/bin";
  if (const char* path = std::getenv("PATH")) dirs += std::string(":") + path;
  std::stringstream list(dirs);
  for (std::string dir; std::getline(list, dir, ':');) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return {};
}

// Runs a test case only where its launcher is installed, and says so in the
// test's output when it is not.
struct Installed {
  std::string name;
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    if (!find_program(name).empty()) return true;
    std::printf("launchers_test: %s is not installed (neither /usr/bin/%s nor on PATH): its runs are skipped\n",
                name.c_str(), name.c_str());
    boost::test_tools::assertion_result skip(false);
    skip.message() << name << " is not installed";
    return skip;
  }
};

// Every variable a launcher gives its processes, unset, then `extra`: each run
// sees only what its own launcher sets, whoever started this test.
EnvChanges clean_env(const EnvChanges& extra = {}) {
  static const std::array<std::string, 17> exact{"RANK",
                                                 "WORLD_SIZE",
                                                 "LOCAL_RANK",
                                                 "LOCAL_WORLD_SIZE",
                                                 "GROUP_RANK",
                                                 "GROUP_WORLD_SIZE",
                                                 "ROLE_RANK",
                                                 "ROLE_NAME",
                                                 "ROLE_WORLD_SIZE",
                                                 "MASTER_ADDR",
                                                 "MASTER_PORT",
                                                 "DTRAIN_RUN",
                                                 "DTRAIN_JOB_ID",
                                                 "DTRAIN_JOB_TOKEN",
                                                 "DTRAIN_RESTART_COUNT",
                                                 "OMP_NUM_THREADS",
                                                 "OPENBLAS_NUM_THREADS"};
  static const std::array<std::string, 5> prefixes{"OMPI_", "PMIX_", "SLURM_", "TORCHELASTIC_", "PET_"};
  EnvChanges env;
  for (char** e = environ; *e; ++e) {
    const std::string name(*e, std::string_view(*e).find('='));
    bool launcher = std::find(exact.begin(), exact.end(), name) != exact.end();
    for (const auto& p : prefixes) launcher = launcher || name.rfind(p, 0) == 0;
    if (launcher) env.emplace_back(name, std::nullopt);
  }
  // The job's secret, exported to every rank as a job script does
  // (dtrain-run would make its own; torchrun, mpirun and srun pass this on).
  env.emplace_back("DTRAIN_JOB_TOKEN", "launchers-test-job-token-0123456789abcdef");
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

bool port_free(int port) {
  try {
    dtrain::TcpStoreServer probe(port);
    return true;
  } catch (const dtrain::launch_error&) {
    return false;
  }
}

// A port that is free now, and so is the next one: under torchrun's static
// rendezvous torchrun holds MASTER_PORT and dtrain's rendezvous takes the next.
int free_port_pair() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = dtrain::TcpStoreServer(0).port();
    if (port < 65535 && port_free(port + 1)) return port;
  }
  BOOST_FAIL("found no two free consecutive TCP ports in 100 attempts");
  return 0;
}

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return {};
  return name.data();
}

// srun gives the node's name; a container's name may not resolve, and then
// the test uses localhost, which the code under test treats the same way.
std::string resolvable_host_name() {
  const std::string name = host_name();
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (name.empty() || ::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) return "localhost";
  ::freeaddrinfo(res);
  return name;
}

// One run of the job: where its parameters and metrics went, how it ended.
struct Job {
  std::string label;
  std::string params, metrics;
  Finished end;
  std::string output() const { return end.out + end.err; }
};

// Where a run's parameters or metrics go: the label, spelled for a file name.
std::string scratch_file(const std::string& label, const std::string& extension) {
  std::string stem = label;
  std::replace_if(
      stem.begin(), stem.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return scratch() / (stem + extension);
}

// train_mlp's arguments for a job that saves to `label`'s files: 15 DDP steps
// on CPU ranks, data loaded on the training thread, and a collective timeout
// short enough that a broken rendezvous fails well within run_limit_s.
std::vector<std::string> train_mlp(const std::string& label) {
  return {TRAIN_MLP_PATH,
          "--config",
          std::string(DTRAIN_SOURCE_DIR) + "/examples/configs/ddp_host.yaml",
          "steps=" + std::to_string(steps),
          "num_workers=0",
          "log_every=5",
          "timeout_s=30",
          "save_params=" + scratch_file(label, ".safetensors"),
          "metrics=" + scratch_file(label, ".jsonl")};
}

// `launcher` (its command line) starting the job.
Job launch(const std::string& label, std::vector<std::string> launcher, const EnvChanges& extra = {}) {
  for (auto& a : train_mlp(label)) launcher.push_back(std::move(a));
  Process p(std::move(launcher), clean_env(extra), 0, Group::own);
  return {label, scratch_file(label, ".safetensors"), scratch_file(label, ".jsonl"), p.wait(run_limit_s)};
}

// The variables srun gives task `rank` of a 2-task step on one node, and the
// MASTER_PORT a batch script exports. The step
// runs on part of a 2-node allocation whose first node is another host, so
// the rendezvous works only if the step's node list is the one read.
EnvChanges slurm_task(int rank, int port, const std::string& host) {
  const std::string r = std::to_string(rank);
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", r},
          {"SLURM_LOCALID", r},
          {"SLURM_GTIDS", "0,1"},
          {"SLURM_NODEID", "0"},
          {"SLURM_NTASKS", "2"},
          {"SLURM_NPROCS", "2"},
          {"SLURM_NNODES", "1"},
          {"SLURM_STEP_NUM_NODES", "1"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_STEP_TASKS_PER_NODE", "2"},
          {"SLURM_STEP_NODELIST", host},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_JOB_NODELIST", "dtrain-no-such-node," + host},
          {"SLURM_NODELIST", "dtrain-no-such-node," + host},
          {"SLURMD_NODENAME", host},
          {"MASTER_PORT", std::to_string(port)}};
}

// srun's part done here: both tasks started at once, each waited for.
Job srun_simulated(const std::string& label, const std::string& host, const EnvChanges& change = {}) {
  const int port = free_port_pair();
  std::vector<std::unique_ptr<Process>> tasks;
  for (int rank = 0; rank < 2; ++rank) {
    EnvChanges env = slurm_task(rank, port, host);
    env.insert(env.end(), change.begin(), change.end());
    tasks.push_back(std::make_unique<Process>(train_mlp(label), clean_env(env), 0, Group::own));
  }
  Job job{label, scratch_file(label, ".safetensors"), scratch_file(label, ".jsonl"), tasks[0]->wait(run_limit_s)};
  const Finished other = tasks[1]->wait(run_limit_s);
  // The step failed if any task did (srun's rule); rank 1's output follows rank 0's.
  if (job.end.exited_with(0)) job.end.status = other.status;
  job.end.out += other.out;
  job.end.err += other.err;
  return job;
}

// The job ran on two ranks and trained: status 0, rank 0's line naming two
// ranks, and one metrics record per step from a world of two whose loss fell.
void check_trained(const Job& job) {
  BOOST_TEST_CONTEXT(job.label) {
    BOOST_REQUIRE_MESSAGE(job.end.exited_with(0), job.label << " ended with wait status " << job.end.status
                                                            << "; output:\n"
                                                            << job.output());
    BOOST_TEST(job.end.out.find("train_mlp: 2 rank(s)") != std::string::npos, job.output());
    std::ifstream in(job.metrics);
    std::vector<double> loss;
    for (std::string line; std::getline(in, line);) {
      BOOST_TEST(line.find("\"world_size\": 2") != std::string::npos, line);
      const auto k = line.find("\"loss\": ");
      BOOST_REQUIRE(k != std::string::npos);
      loss.push_back(std::stod(line.substr(k + 8)));
    }
    BOOST_REQUIRE_EQUAL(loss.size(), static_cast<std::size_t>(steps));
    BOOST_TEST(loss.back() < loss.front());
  }
}

// How two parameter files differ: elements whose bits differ, and the
// largest absolute difference.
struct Difference {
  std::size_t elements = 0, differing = 0;
  double max_abs = 0;
};

Difference compare(const std::string& a_path, const std::string& b_path) {
  const auto a = dtrain::SafetensorsFile::open(a_path), b = dtrain::SafetensorsFile::open(b_path);
  BOOST_REQUIRE(a.names() == b.names());
  Difference d;
  for (const auto& name : a.names()) {
    BOOST_REQUIRE(a.tensor(name).shape == b.tensor(name).shape);
    const auto x = a.read_f32(name), y = b.read_f32(name);
    d.elements += x.size();
    for (std::size_t i = 0; i < x.size(); ++i) {
      d.differing += std::bit_cast<std::uint32_t>(x[i]) != std::bit_cast<std::uint32_t>(y[i]);
      d.max_abs = std::max(d.max_abs, std::abs(static_cast<double>(x[i]) - y[i]));
    }
  }
  return d;
}

const Job& reference() {
  static const Job job = [] {
    Job j = launch("dtrain-run",
                   {DTRAIN_RUN_PATH, "--nproc-per-node", "2", "--master-port", std::to_string(free_port_pair())});
    check_trained(j);
    return j;
  }();
  return job;
}

// The job trained on two ranks and its parameters equal dtrain-run's bit for bit.
void check_same_as_dtrain_run(const Job& job) {
  check_trained(job);
  const Difference d = compare(job.params, reference().params);
  std::printf("launchers_test: %-22s 2 ranks, %.1f s, %zu of %zu parameters differ from dtrain-run's (max |diff| %g)\n",
              job.label.c_str(), job.end.seconds, d.differing, d.elements, d.max_abs);
  BOOST_TEST(d.elements > 0u);
  BOOST_TEST(d.differing == 0u, job.label << ": " << d.differing << " parameters differ, max |diff| " << d.max_abs);
}

std::vector<std::string> mpirun(const std::vector<std::string>& options) {
  std::vector<std::string> cmd{find_program("mpirun")};
  // Open MPI refuses to start as root unless told that is intended (containers).
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  // Open MPI binds each of 2 ranks to one core by default, so a rank would
  // size its threads from that core alone; unbound, both see the cores
  // dtrain-run's ranks see and take the same share.
  // Open MPI insists on finding ssh or rsh even when every rank is local; a
  // machine without them (the GPU check's) fails before starting a rank. The
  // agent is never run for local ranks, so name one that exists.
  for (const char* a : {"--mca", "plm_rsh_agent", "false"}) cmd.push_back(a);
  for (const char* a : {"--oversubscribe", "--bind-to", "none", "-np", "2"}) cmd.push_back(a);
  cmd.insert(cmd.end(), options.begin(), options.end());
  return cmd;
}

}  // namespace

BOOST_AUTO_TEST_CASE(dtrain_run_trains_on_two_ranks) {
  const Job& job = reference();
  std::printf("launchers_test: %-22s 2 ranks, %.1f s (the reference)\n", job.label.c_str(), job.end.seconds);
}

// A launch on a port pair that was free when chosen but that another test's
// process took before the launcher bound it (CTest runs tests side by side;
// "Address already in use" in the output): tried again on a fresh pair, at
// most 3 times in all.
template <class Launch>
Job on_free_ports(const Launch& launch_on) {
  for (int attempt = 1;; ++attempt) {
    Job job = launch_on(free_port_pair());
    if (attempt == 3 || job.output().find("Address already in use") == std::string::npos) return job;
  }
}

// torchrun's default rendezvous: its own store holds --master_port, dtrain
// takes the next port. Debian's torchrun (torch 1.13 under Python 3.11) fails
// at start unless --redirects and --tee are 1 or 2: their default, 0, does
// not parse there. --redirects 1 --tee 1 writes each worker's stdout to a
// log file and copies it to the console. --monitor_interval 1: torchrun
// notices the workers have ended within a second instead of five.
BOOST_AUTO_TEST_CASE(torchrun_static_rendezvous, *boost::unit_test::precondition(Installed{"torchrun"})) {
  check_same_as_dtrain_run(on_free_ports([](int port) {
    return launch("torchrun", {find_program("torchrun"), "--nproc_per_node", "2", "--master_port", std::to_string(port),
                               "--redirects", "1", "--tee", "1", "--monitor_interval", "1", "--no_python"});
  }));
}

// The c10d rendezvous: torchrun hands the workers a free MASTER_PORT of its own.
BOOST_AUTO_TEST_CASE(torchrun_c10d_rendezvous, *boost::unit_test::precondition(Installed{"torchrun"})) {
  check_same_as_dtrain_run(on_free_ports([](int port) {
    return launch("torchrun c10d", {find_program("torchrun"), "--nproc_per_node", "2", "--rdzv_backend", "c10d",
                                    "--rdzv_endpoint", "127.0.0.1:" + std::to_string(port), "--redirects", "1", "--tee",
                                    "1", "--monitor_interval", "1", "--no_python"});
  }));
}

BOOST_AUTO_TEST_CASE(mpirun_with_master_address, *boost::unit_test::precondition(Installed{"mpirun"})) {
  check_same_as_dtrain_run(on_free_ports([](int port) {
    return launch("mpirun", mpirun({"-x", "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=" + std::to_string(port)}));
  }));
}

// Without -x MASTER_ADDR every rank stops at start, saying what to pass.
BOOST_AUTO_TEST_CASE(mpirun_without_master_address_says_what_to_pass,
                     *boost::unit_test::precondition(Installed{"mpirun"})) {
  const Job job = launch("mpirun no address", mpirun({}));
  BOOST_TEST(!job.end.exited_with(0));
  BOOST_TEST(job.output().find("a world of 2 processes needs a master address, but MASTER_ADDR is not set") !=
                 std::string::npos,
             job.output());
  BOOST_TEST(job.output().find("mpirun -x MASTER_ADDR=<host>") != std::string::npos, job.output());
  BOOST_TEST(!fs::exists(job.params));
}

BOOST_AUTO_TEST_CASE(srun_tasks_find_rank_0_on_the_steps_first_node) {
  const std::string host = resolvable_host_name();
  std::printf("launchers_test: simulated srun step on host '%s'\n", host.c_str());
  check_same_as_dtrain_run(srun_simulated("srun (simulated)", host));
}

// A task with no node list and no MASTER_ADDR stops at start, saying to use srun.
BOOST_AUTO_TEST_CASE(srun_task_without_a_node_list_says_what_to_set) {
  const Job job = srun_simulated(
      "srun no node list", resolvable_host_name(),
      {{"SLURM_STEP_NODELIST", std::nullopt}, {"SLURM_JOB_NODELIST", std::nullopt}, {"SLURM_NODELIST", std::nullopt}});
  BOOST_TEST(job.end.exited_with(2));  // a usage error
  BOOST_TEST(job.output().find("MASTER_ADDR is not set") != std::string::npos, job.output());
  BOOST_TEST(job.output().find("start the tasks with srun, which sets SLURM_STEP_NODELIST") != std::string::npos,
             job.output());
}

// The torchrun command lines above (and README's), with dtrain-run in
// torchrun's place and nothing else changed: dtrain-run takes torchrun's
// flags, so a torchrun user's script only swaps the program name.
BOOST_AUTO_TEST_CASE(dtrain_run_takes_torchruns_command_lines) {
  const EnvChanges tmp{{"TMPDIR", scratch().path().string()}};  // where --tee's logs go without --log_dir
  const Job as_static =
      launch("dtrain-run as torchrun",
             {DTRAIN_RUN_PATH, "--nproc_per_node", "2", "--master_port", std::to_string(free_port_pair()),
              "--redirects", "1", "--tee", "1", "--monitor_interval", "1", "--no_python"},
             tmp);
  check_same_as_dtrain_run(as_static);
  // --tee 1 copied rank 0's stdout to its log file.
  const std::string said = "rank logs (--redirects/--tee) go to ";
  const auto at = as_static.end.err.find(said);
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, as_static.output());
  const std::string run_dir =
      as_static.end.err.substr(at + said.size(), as_static.end.err.find("/attempt_K", at) - at - said.size());
  const std::string log = dtrain::test::read_text(fs::path(run_dir) / "attempt_0" / "0" / "stdout.log");
  BOOST_TEST(log.find("train_mlp: 2 rank(s)") != std::string::npos, run_dir << ":\n" << log);

  check_same_as_dtrain_run(launch("dtrain-run as torchrun c10d",
                                  {DTRAIN_RUN_PATH, "--nproc_per_node", "2", "--rdzv_backend", "c10d",
                                   "--rdzv_endpoint", "127.0.0.1:" + std::to_string(free_port_pair()), "--redirects",
                                   "1", "--tee", "1", "--monitor_interval", "1", "--no_python"},
                                  tmp));
  check_same_as_dtrain_run(
      launch("dtrain-run --standalone", {DTRAIN_RUN_PATH, "--standalone", "--nproc_per_node", "2", "--no_python"}));
}

// A program whose trainer runs on the CPU, started for GPUs: every rank stops
// at start, naming both fixes. Without a GPU dtrain-run refuses `gpu` before
// starting anything (run_test.cpp), so the rank is given dtrain-run's
// variable directly.
BOOST_AUTO_TEST_CASE(a_host_trainer_started_for_gpus_says_what_to_do) {
  const bool gpus = dtrain::cuda_device_count() > 0;
  const std::string label = "host trainer for gpus";
  const Job job = gpus ? launch(label, {DTRAIN_RUN_PATH, "--nproc_per_node", "gpu", "--no_python"})
                       : Job{label, scratch_file(label, ".safetensors"), scratch_file(label, ".jsonl"),
                             Process(train_mlp(label), clean_env({{"DTRAIN_LAUNCH_DEVICE", "gpu"}}), 0, Group::own)
                                 .wait(run_limit_s)};
  BOOST_TEST(job.end.exited_with(2), job.output());  // a configuration error
  BOOST_TEST(job.output().find("train_mlp: error: dtrain-run --nproc-per-node gpu started this rank for a GPU, "
                               "but its trainer runs on the CPU (device host)\n"
                               "  fix: run the program's CUDA variant (in the examples: device=cuda), or launch "
                               "with --nproc-per-node N for N CPU ranks") != std::string::npos,
             job.output());
  BOOST_TEST(!fs::exists(job.params));
}
