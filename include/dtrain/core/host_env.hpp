#pragma once
// The host facts a process sizes its threads from: the environment lookup,
// the launchers' rank variables (only as far as this node's rank count needs
// them), the usable cores and the address-space limit OpenBLAS's pool must
// fit in. In core/ because the host device (BLAS and kernel threads) and the
// host communicator (progress threads) size themselves from it;
// launch/env.hpp builds the whole launch environment on top of it.

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/parse.hpp"

namespace dtrain {

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

namespace detail {

// Reads an integer variable that must be >= 0 and fit an int.
inline std::optional<int> env_count(const EnvLookup& env, const std::string& name,
                                    const std::string& fix) {
  auto text = env(name);
  if (!text) return std::nullopt;
  auto value = parse_integer(*text);
  if (!value) throw env_error(name + "='" + *text + "' is not an integer", fix);
  if (*value < 0) throw env_error(name + "=" + *text + " is negative", fix);
  if (*value > std::numeric_limits<int>::max())
    throw env_error(name + "=" + *text + " is too large", fix);
  return static_cast<int>(*value);
}

// Slurm compresses per-node task counts: "4(x2),3" means nodes with 4, 4 and 3.
inline std::vector<int> expand_slurm_counts(const std::string& name, const std::string& text) {
  const std::string fix = "this variable is set by Slurm; unset it or run the program with srun";
  std::vector<int> counts;
  std::string_view rest = text;
  while (true) {
    auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    int repeat = 1;
    if (auto open = item.find("(x"); open != std::string_view::npos) {
      auto times = item.back() == ')' ? parse_integer(item.substr(open + 2, item.size() - open - 3))
                                      : std::nullopt;
      // Bounded: the list is expanded, and no cluster has a million nodes.
      if (!times || *times < 1 || *times > 1'000'000)
        throw env_error(name + "='" + text + "' has a malformed repeat count", fix);
      repeat = static_cast<int>(*times);
      item = item.substr(0, open);
    }
    auto count = parse_integer(item);
    if (!count || *count < 1 || *count > std::numeric_limits<int>::max())
      throw env_error(name + "='" + text + "' is not a list of task counts like 4(x2),3", fix);
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), static_cast<int>(*count));
    if (comma == std::string_view::npos) return counts;
    rest.remove_prefix(comma + 1);
  }
}

// One launcher's four rank variables, and how to fix them when they are wrong.
struct RankVars {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: derived (Slurm)
  const char* fix;
  const char* addr_fix;
};

inline constexpr RankVars torchrun_vars{
    "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "launch with dtrain-run or torchrun, which set RANK, WORLD_SIZE, LOCAL_RANK and "
    "LOCAL_WORLD_SIZE together; or unset all four to run as a single process",
    "set MASTER_ADDR to the host that runs rank 0 (dtrain-run and torchrun set it)"};
inline constexpr RankVars openmpi_vars{
    "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "these variables are set by Open MPI's mpirun; launch with mpirun or unset them",
    "pass the address of rank 0's host to every rank: mpirun -x MASTER_ADDR=<host> ..."};
inline constexpr RankVars slurm_vars{
    "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr,
    "these variables are set by Slurm for each task; launch with srun",
    "export MASTER_ADDR, or start the tasks with srun, which sets SLURM_STEP_NODELIST"};

// Any one of torchrun's or mpirun's variables marks a process they started.
// Slurm sets SLURM_NTASKS in a whole allocation, also in an salloc shell that
// runs no task, so only SLURM_PROCID marks a task that srun started.
inline bool launched_by(const EnvLookup& env, const RankVars& v) {
  if (&v == &slurm_vars) return env(v.rank).has_value();
  for (const char* name : {v.rank, v.size, v.local_rank, v.local_size})
    if (env(name)) return true;
  return false;
}

// Tasks on this node: Slurm gives per-node counts; the step's own layout
// (srun) is preferred over the allocation's, which a step may use only part of.
inline int slurm_local_size(const EnvLookup& env) {
  auto node = env_count(env, "SLURM_NODEID", slurm_vars.fix).value_or(0);
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                           "SLURM_NTASKS_PER_NODE"}) {
    auto text = env(name);
    if (!text) continue;
    auto counts = expand_slurm_counts(name, *text);
    if (counts.size() == 1) return counts.front();
    if (static_cast<std::size_t>(node) >= counts.size())
      throw env_error("SLURM_NODEID=" + std::to_string(node) + " has no entry in " + name +
                          "='" + *text + "'",
                      slurm_vars.fix);
    return counts[static_cast<std::size_t>(node)];
  }
  throw env_error("SLURM_PROCID is set but none of SLURM_STEP_TASKS_PER_NODE, "
                  "SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE is",
                  slurm_vars.fix);
}

}  // namespace detail

// The process environment as an EnvLookup. getenv is not thread-safe
// against setenv; dtrain reads the environment once at init, before it
// starts threads.
inline std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (!value) return std::nullopt;
  return std::string(value);
}

// How many ranks share this node, from whichever launcher started the
// process, with discover_env's precedence: LOCAL_WORLD_SIZE (dtrain-run,
// torchrun), OMPI_COMM_WORLD_LOCAL_SIZE (mpirun), this node's task count
// (srun); 1 when no launcher's variables are present. Only the local count
// is read and checked, so a device can size its threads before the rest of
// the launch environment is validated.
inline int local_world_size(const EnvLookup& env) {
  for (const auto* v : {&detail::torchrun_vars, &detail::openmpi_vars, &detail::slurm_vars}) {
    if (!detail::launched_by(env, *v)) continue;
    const int n = v->local_size ? detail::env_count(env, v->local_size, v->fix).value_or(1)
                                : detail::slurm_local_size(env);
    if (n < 1)
      throw env_error(std::string(v->local_size ? v->local_size : "this node's Slurm task count") + "=" +
                          std::to_string(n) + ": a node runs at least one rank",
                      v->fix);
    return n;
  }
  return 1;
}

// Cores this process may run on: the affinity mask (taskset, Slurm and
// container cpusets restrict it), not the machine's total.
inline int usable_cpu_count() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// Each rank's share of the usable cores when all of this node's ranks run on
// them.
inline int cores_per_local_rank(const EnvLookup& env) {
  return std::max(1, usable_cpu_count() / local_world_size(env));
}

// The address space each thread of OpenBLAS's pool reserves: its 128 MiB work
// buffer (Debian's OpenBLAS 0.3.21 on x86-64, measured) and an 8 MiB stack.
// Under an address-space limit (ulimit -v, RLIMIT_AS) this is what counts,
// and a pool thread that finds no room for its buffer retries forever: the
// process then hangs when it exits and joins the pool.
inline constexpr std::uint64_t blas_thread_address_space = std::uint64_t{136} << 20;

// The process's address-space limit in bytes; nullopt when unlimited.
inline std::optional<std::uint64_t> address_space_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<std::uint64_t>(limit.rlim_cur);
}

// The most BLAS threads an address-space limit has room for, when their pool
// may take a quarter of it and the program the rest.
inline int blas_threads_within(std::uint64_t limit_bytes) {
  const std::uint64_t n = limit_bytes / 4 / blas_thread_address_space;
  return static_cast<int>(std::clamp<std::uint64_t>(n, 1, std::numeric_limits<int>::max()));
}

// `threads` BLAS threads, no more than the address-space limit has room for.
inline int blas_threads_capped(int threads, std::optional<std::uint64_t> limit_bytes = address_space_limit()) {
  return limit_bytes ? std::min(threads, blas_threads_within(*limit_bytes)) : threads;
}

// A rank's BLAS threads when OPENBLAS_NUM_THREADS does not say: its share of
// the usable cores, capped as above. What a Host device takes; dtrain-run
// passes the same cap of its ranks' share as OPENBLAS_NUM_THREADS.
inline int blas_threads_per_rank(const EnvLookup& env) { return blas_threads_capped(cores_per_local_rank(env)); }

}  // namespace dtrain
