#define BOOST_TEST_MODULE launch
#include "dtrain/launch/env.hpp"

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include <boost/test/unit_test.hpp>

namespace {

using Vars = std::map<std::string, std::string>;

dtrain::LaunchEnv discover(const Vars& vars) {
  return dtrain::discover_env([&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

// The launch_error's problem names `needle` and the error says how to fix it.
void check_rejected(const Vars& vars, const std::string& needle) {
  BOOST_TEST_CONTEXT("needle: " << needle) {
    BOOST_CHECK_EXCEPTION(discover(vars), dtrain::launch_error, [&](const dtrain::launch_error& e) {
      BOOST_TEST_MESSAGE(e.what());
      return e.problem().find(needle) != std::string::npos && !e.fix().empty();
    });
  }
}

const Vars torchrun{{"RANK", "3"},
                    {"WORLD_SIZE", "8"},
                    {"LOCAL_RANK", "1"},
                    {"LOCAL_WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "node0"},
                    {"MASTER_PORT", "1234"}};
const Vars slurm{{"SLURM_PROCID", "5"},
                 {"SLURM_NTASKS", "11"},
                 {"SLURM_LOCALID", "1"},
                 {"SLURM_NODEID", "1"},
                 {"SLURM_STEP_ID", "0"},
                 {"SLURM_TASKS_PER_NODE", "4(x2),3"},
                 {"SLURM_JOB_NODELIST", "gpu[01-04,07],cpu3"}};
const Vars openmpi{{"OMPI_COMM_WORLD_RANK", "2"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"MASTER_ADDR", "10.0.0.1"}};

Vars with(Vars base, const Vars& changes) {
  for (const auto& [k, v] : changes) base[k] = v;
  return base;
}

Vars without(Vars base, const std::string& name) {
  base.erase(name);
  return base;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(env_discovery)

BOOST_AUTO_TEST_CASE(no_launcher_is_a_world_of_one) {
  auto e = discover({});
  BOOST_TEST(e.source == "none");
  BOOST_TEST(e.rank == 0);
  BOOST_TEST(e.world_size == 1);
  BOOST_TEST(e.local_rank == 0);
  BOOST_TEST(e.local_world_size == 1);
  BOOST_TEST(e.master_addr.empty());
  BOOST_TEST(e.master_port == 0);
  BOOST_TEST(!e.comm_timeout_s.has_value());

  auto given = discover({{"MASTER_ADDR", "hostA"}});
  BOOST_TEST(given.master_addr == "hostA");
  BOOST_TEST(given.master_port == dtrain::default_master_port);
}

BOOST_AUTO_TEST_CASE(torchrun_variables) {
  auto e = discover(torchrun);
  BOOST_TEST(e.source == "torchrun");
  BOOST_TEST(e.rank == 3);
  BOOST_TEST(e.world_size == 8);
  BOOST_TEST(e.local_rank == 1);
  BOOST_TEST(e.local_world_size == 2);
  BOOST_TEST(e.master_addr == "node0");
  BOOST_TEST(e.master_port == 1234);
  BOOST_TEST(discover(without(torchrun, "MASTER_PORT")).master_port == 29500);
}

// torchrun's static rendezvous holds MASTER_PORT itself: dtrain takes the next.
BOOST_AUTO_TEST_CASE(torchrun_agent_store_port) {
  const Vars agent = with(torchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  BOOST_TEST(discover(agent).master_port == 1235);
  BOOST_TEST(discover(with(torchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "False"}})).master_port == 1234);
  check_rejected(with(agent, {{"MASTER_PORT", "65535"}}), "MASTER_PORT=65535 is held by torchrun");
  // Only torchrun's own workers: a process that mpirun or srun started keeps the port.
  BOOST_TEST(discover(with(openmpi, {{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"MASTER_PORT", "1234"}})).master_port ==
             1234);
}

BOOST_AUTO_TEST_CASE(slurm_variables) {
  auto e = discover(slurm);
  BOOST_TEST(e.source == "slurm");
  BOOST_TEST(e.rank == 5);
  BOOST_TEST(e.world_size == 11);
  BOOST_TEST(e.local_rank == 1);
  BOOST_TEST(e.local_world_size == 4);  // node 1 of "4(x2),3"
  BOOST_TEST(e.master_addr == "gpu01");
  BOOST_TEST(e.master_port == 29500);

  auto third_node = discover(with(slurm, {{"SLURM_NODEID", "2"}, {"SLURM_PROCID", "9"}}));
  BOOST_TEST(third_node.local_world_size == 3);
  // The step's layout wins over the allocation's, which wins over the option.
  BOOST_TEST(discover(with(slurm, {{"SLURM_STEP_TASKS_PER_NODE", "2(x3)"}})).local_world_size == 2);
  auto only_option = with(without(slurm, "SLURM_TASKS_PER_NODE"), {{"SLURM_NTASKS_PER_NODE", "6"}});
  BOOST_TEST(discover(only_option).local_world_size == 6);

  auto addr = discover(with(slurm, {{"MASTER_ADDR", "login7"}, {"MASTER_PORT", "4000"}}));
  BOOST_TEST(addr.master_addr == "login7");
  BOOST_TEST(addr.master_port == 4000);
  auto old_name = with(without(slurm, "SLURM_JOB_NODELIST"), {{"SLURM_NODELIST", "cn[007-009]"}});
  BOOST_TEST(discover(old_name).master_addr == "cn007");
  // A step on part of the allocation: rank 0 is on the step's first node.
  auto step = with(slurm, {{"SLURM_STEP_NODELIST", "gpu[03-04,07]"}, {"SLURM_NODELIST", "gpu[01-04,07]"}});
  BOOST_TEST(discover(step).master_addr == "gpu03");
  BOOST_TEST(discover(with(step, {{"MASTER_ADDR", "login7"}})).master_addr == "login7");
}

BOOST_AUTO_TEST_CASE(slurm_allocation_without_a_task_is_not_a_launch) {
  // An salloc shell has SLURM_NTASKS but no SLURM_PROCID: a plain process.
  auto e = discover({{"SLURM_NTASKS", "8"}, {"SLURM_JOB_NODELIST", "a[1-2]"}});
  BOOST_TEST(e.source == "none");
  BOOST_TEST(e.world_size == 1);
}

BOOST_AUTO_TEST_CASE(a_program_run_in_the_batch_script_is_refused) {
  // What the batch script of `sbatch -n2` sees (no srun step): rank 0 of 2,
  // whose rank 1 would never start.
  const Vars batch{{"SLURM_JOB_ID", "7"},       {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                   {"SLURM_LOCALID", "0"},      {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "2"},
                   {"SLURM_JOB_NODELIST", "vm"}};
  check_rejected(batch, "runs in the Slurm job's batch script, not as a task of srun");
  // One task, or a task of a step (either spelling of the step id), starts.
  BOOST_TEST(discover(with(batch, {{"SLURM_NTASKS", "1"}, {"SLURM_TASKS_PER_NODE", "1"}})).world_size == 1);
  BOOST_TEST(discover(with(batch, {{"SLURM_STEP_ID", "0"}})).world_size == 2);
  BOOST_TEST(discover(with(batch, {{"SLURM_STEPID", "3"}})).world_size == 2);
}

BOOST_AUTO_TEST_CASE(openmpi_variables) {
  auto e = discover(openmpi);
  BOOST_TEST(e.source == "openmpi");
  BOOST_TEST(e.rank == 2);
  BOOST_TEST(e.world_size == 4);
  BOOST_TEST(e.local_rank == 0);
  BOOST_TEST(e.local_world_size == 2);
  BOOST_TEST(e.master_addr == "10.0.0.1");
  BOOST_TEST(e.master_port == 29500);
}

BOOST_AUTO_TEST_CASE(precedence) {
  Vars all = torchrun;
  all.insert(slurm.begin(), slurm.end());
  all.insert(openmpi.begin(), openmpi.end());
  BOOST_TEST(discover(all).source == "torchrun");
  Vars mpirun_in_slurm = openmpi;
  mpirun_in_slurm.insert(slurm.begin(), slurm.end());
  BOOST_TEST(discover(mpirun_in_slurm).source == "openmpi");
  BOOST_TEST(discover(mpirun_in_slurm).rank == 2);
}

BOOST_AUTO_TEST_CASE(comm_timeout) {
  BOOST_TEST(*discover({{"DTRAIN_COMM_TIMEOUT_S", "2.5"}}).comm_timeout_s == 2.5);
  BOOST_TEST(*discover(with(torchrun, {{"DTRAIN_COMM_TIMEOUT_S", "600"}})).comm_timeout_s == 600.0);
  for (const char* bad : {"0", "-1", "abc", "5s", "inf", "nan", ""})
    check_rejected({{"DTRAIN_COMM_TIMEOUT_S", bad}}, "DTRAIN_COMM_TIMEOUT_S");
}

// The job token and its companions (docs/security.md).
BOOST_AUTO_TEST_CASE(job_token_variables) {
  const std::string token(40, 't');
  const auto e = discover(with(torchrun, {{"DTRAIN_JOB_TOKEN", token}, {"DTRAIN_STORE_BIND", "0.0.0.0"}}));
  BOOST_TEST(e.job_token == token);
  BOOST_TEST(e.store_bind == "0.0.0.0");
  BOOST_TEST(!e.insecure_no_token);
  BOOST_TEST(discover(with(torchrun, {{"DTRAIN_INSECURE_NO_TOKEN", "1"}})).insecure_no_token);
  BOOST_TEST(discover(torchrun).job_token.empty());  // World refuses a world of 8 without one
  check_rejected(with(torchrun, {{"DTRAIN_INSECURE_NO_TOKEN", "yes"}}), "DTRAIN_INSECURE_NO_TOKEN");
  BOOST_CHECK_EXCEPTION(discover(with(torchrun, {{"DTRAIN_JOB_TOKEN", "0123456789"}})), dtrain::config_error,
                        [](const dtrain::error& e) {
                          return std::string(e.what()).find("DTRAIN_JOB_TOKEN has 10 characters") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(non_integer_values) {
  for (const char* bad : {"abc", "1x", " 1", "+1", "", "1.0", "99999999999"})
    check_rejected(with(torchrun, {{"RANK", bad}}), "RANK");
  check_rejected(with(slurm, {{"SLURM_NTASKS", "many"}}), "SLURM_NTASKS");
  check_rejected(with(openmpi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "two"}}), "OMPI_COMM_WORLD_LOCAL_SIZE");
}

BOOST_AUTO_TEST_CASE(negative_values) {
  check_rejected(with(torchrun, {{"RANK", "-1"}}), "negative");
  check_rejected(with(torchrun, {{"LOCAL_RANK", "-2"}}), "LOCAL_RANK=-2 is negative");
  check_rejected(with(slurm, {{"SLURM_LOCALID", "-1"}}), "SLURM_LOCALID");
}

BOOST_AUTO_TEST_CASE(rank_outside_world) {
  check_rejected(with(torchrun, {{"RANK", "8"}}), "RANK=8 is not below WORLD_SIZE=8");
  check_rejected(with(torchrun, {{"WORLD_SIZE", "0"}, {"RANK", "0"}}), "WORLD_SIZE=0");
  check_rejected(with(slurm, {{"SLURM_PROCID", "11"}}), "SLURM_PROCID=11");
  check_rejected(with(openmpi, {{"OMPI_COMM_WORLD_RANK", "4"}}), "OMPI_COMM_WORLD_RANK=4");
}

BOOST_AUTO_TEST_CASE(local_rank_outside_node) {
  check_rejected(with(torchrun, {{"LOCAL_RANK", "2"}}), "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
  check_rejected(with(torchrun, {{"LOCAL_WORLD_SIZE", "9"}}), "LOCAL_WORLD_SIZE=9");
  check_rejected(with(slurm, {{"SLURM_LOCALID", "4"}}), "SLURM_LOCALID=4");
  check_rejected(with(openmpi, {{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}), "OMPI_COMM_WORLD_LOCAL_RANK=2");
}

BOOST_AUTO_TEST_CASE(missing_master_address) {
  check_rejected(without(torchrun, "MASTER_ADDR"), "MASTER_ADDR");
  check_rejected(without(openmpi, "MASTER_ADDR"), "MASTER_ADDR");
  check_rejected(without(slurm, "SLURM_JOB_NODELIST"), "MASTER_ADDR");
  // A single process needs no rendezvous.
  auto single = discover({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}});
  BOOST_TEST(single.master_addr.empty());
  BOOST_TEST(single.master_port == 0);
}

BOOST_AUTO_TEST_CASE(bad_ports) {
  for (const char* bad : {"0", "65536", "-5", "http", "80a"})
    check_rejected(with(torchrun, {{"MASTER_PORT", bad}}), "MASTER_PORT");
  BOOST_TEST(discover(with(torchrun, {{"MASTER_PORT", "65535"}})).master_port == 65535);
  BOOST_TEST(discover(with(torchrun, {{"MASTER_PORT", "1"}})).master_port == 1);
}

BOOST_AUTO_TEST_CASE(partial_launch_environments) {
  check_rejected({{"RANK", "0"}}, "WORLD_SIZE is not set");
  check_rejected(without(torchrun, "LOCAL_WORLD_SIZE"), "LOCAL_WORLD_SIZE is not set");
  check_rejected({{"LOCAL_RANK", "0"}}, "RANK is not set");
  check_rejected(without(openmpi, "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE is not set");
  check_rejected(without(slurm, "SLURM_LOCALID"), "SLURM_LOCALID is not set");
  check_rejected(without(slurm, "SLURM_TASKS_PER_NODE"), "SLURM_TASKS_PER_NODE");
}

BOOST_AUTO_TEST_CASE(malformed_slurm_lists) {
  for (const char* bad : {"4(x", "4(x0)", "x", "4,,3", "4(x2)3"})
    check_rejected(with(slurm, {{"SLURM_TASKS_PER_NODE", bad}}), "SLURM_TASKS_PER_NODE");
  check_rejected(with(slurm, {{"SLURM_NODEID", "3"}}), "SLURM_NODEID=3");
  for (const char* bad : {"gpu[01-", "gpu[]", "gpu[a-b]", ""}) {
    check_rejected(with(slurm, {{"SLURM_JOB_NODELIST", bad}}), "SLURM_JOB_NODELIST");
    check_rejected(with(slurm, {{"SLURM_STEP_NODELIST", bad}}), "SLURM_STEP_NODELIST");
  }
}

BOOST_AUTO_TEST_CASE(slurm_hostlist_first_host) {
  using dtrain::detail::first_slurm_host;
  BOOST_TEST(first_slurm_host("L", "node7") == "node7");
  BOOST_TEST(first_slurm_host("L", "node7,node8") == "node7");
  BOOST_TEST(first_slurm_host("L", "gpu[01-04,07],cpu3") == "gpu01");
  BOOST_TEST(first_slurm_host("L", "rack-[009-010]") == "rack-009");
  BOOST_TEST(first_slurm_host("L", "a[3,1]b[5-6]-ib") == "a3b5-ib");
}

BOOST_AUTO_TEST_CASE(slurm_task_counts) {
  using dtrain::detail::expand_slurm_counts;
  BOOST_TEST(expand_slurm_counts("L", "4(x2),3") == (std::vector<int>{4, 4, 3}));
  BOOST_TEST(expand_slurm_counts("L", "2") == (std::vector<int>{2}));
  BOOST_TEST(expand_slurm_counts("L", "1,2(x3)") == (std::vector<int>{1, 2, 2, 2}));
}

// OpenBLAS's pool threads at 136 MiB of address space each may take a
// quarter of an address-space limit; never fewer than one thread.
BOOST_AUTO_TEST_CASE(blas_threads_under_an_address_space_limit) {
  constexpr std::uint64_t mib = std::uint64_t{1} << 20;
  BOOST_TEST(dtrain::blas_thread_address_space == 136 * mib);
  BOOST_TEST(dtrain::blas_threads_within(3000000ull * 1024) == 5);  // ulimit -v 3000000: 2929 MiB / 4 / 136
  BOOST_TEST(dtrain::blas_threads_within(4 * 136 * mib) == 1);
  BOOST_TEST(dtrain::blas_threads_within(4 * 136 * mib - 1) == 1);  // no room at all still runs one
  BOOST_TEST(dtrain::blas_threads_within(64 * 4 * 136 * mib) == 64);
  BOOST_TEST(dtrain::blas_threads_within(~std::uint64_t{0}) == std::numeric_limits<int>::max());
  // A count capped by the limit; no limit leaves it alone.
  BOOST_TEST(dtrain::blas_threads_capped(8, std::nullopt) == 8);
  BOOST_TEST(dtrain::blas_threads_capped(8, 4 * 136 * mib) == 1);
  BOOST_TEST(dtrain::blas_threads_capped(8, 3000000ull * 1024) == 5);
  BOOST_TEST(dtrain::blas_threads_capped(8, 64 * 4 * 136 * mib) == 8);
}

// Two devices that differ only where check_launch_device looks.
struct HostLike {
  static constexpr const char* name = "host";
  static constexpr bool host_accessible = true;
};
struct GpuLike {
  static constexpr const char* name = "cuda";
  static constexpr bool host_accessible = false;
};

// Only a host trainer in a rank that dtrain-run started for a GPU is refused.
BOOST_AUTO_TEST_CASE(launch_device_check) {
  const auto lookup = [](const Vars& vars) {
    return [vars](const std::string& name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    };
  };
  const Vars gpu{{"DTRAIN_LAUNCH_DEVICE", "gpu"}};
  BOOST_CHECK_EXCEPTION(dtrain::check_launch_device<HostLike>(lookup(gpu)), dtrain::config_error,
                        [](const dtrain::config_error& e) {
                          return e.problem().find("--nproc-per-node gpu") != std::string::npos &&
                                 e.problem().find("runs on the CPU") != std::string::npos &&
                                 e.fix().find("--nproc-per-node N") != std::string::npos &&
                                 e.fix().find("device=cuda") != std::string::npos;
                        });
  BOOST_CHECK_NO_THROW(dtrain::check_launch_device<GpuLike>(lookup(gpu)));
  BOOST_CHECK_NO_THROW(dtrain::check_launch_device<HostLike>(lookup({})));
  BOOST_CHECK_NO_THROW(dtrain::check_launch_device<HostLike>(lookup({{"DTRAIN_LAUNCH_DEVICE", "cpu"}})));
}

BOOST_AUTO_TEST_SUITE_END()
