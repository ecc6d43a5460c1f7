#pragma once
// Who is this process in the job? Reads the variables that dtrain-run,
// torchrun, Slurm (srun) and Open MPI (mpirun) give each process, validates
// them and returns one LaunchEnv. The lookup is a parameter so the logic is
// testable without touching the process environment.
//
// Precedence, most specific launcher first:
//   1. RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (dtrain-run, torchrun)
//   2. OMPI_COMM_WORLD_*                                   (mpirun)
//   3. SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID         (srun)
//   4. nothing: a world of one
// A launcher run inside a Slurm allocation inherits the allocation's SLURM_*
// variables, which describe the allocation's batch step or mpirun's daemons,
// not the launched process. So mpirun's own variables win over Slurm's, just
// as torchrun's do; only a process that srun started directly reads SLURM_*.

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "dtrain/comm/communicator.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/parse.hpp"

namespace dtrain {

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;  // empty when world_size == 1 and none given
  int master_port = 0;      // 0 only when master_addr is empty
  std::string source;       // "none", "torchrun" (also dtrain-run), "slurm", "openmpi"
  // DTRAIN_COMM_TIMEOUT_S: how long a collective may wait before it fails.
  std::optional<double> comm_timeout_s;
  // This process's node index from the launcher (GROUP_RANK, SLURM_NODEID); "" if none.
  std::string node_tag;
  // DTRAIN_HOST_TRANSPORT, DTRAIN_SHM_WAIT, DTRAIN_SHM_CHUNK_KIB (comm/communicator.hpp).
  std::optional<host_transport> host;
  std::optional<shm_wait> wait;
  std::optional<std::size_t> shm_part_bytes;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The port used when a master address is known but MASTER_PORT is not set;
// torchrun's default, so mixed setups agree.
inline constexpr int default_master_port = 29500;

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

// First host of a Slurm hostlist: "gpu[01-04,07],cpu3" -> "gpu01". Each
// bracket contributes the start of its first range, zero padding kept.
inline std::string first_slurm_host(const std::string& name, const std::string& list) {
  std::string host;
  for (std::size_t i = 0; i < list.size() && list[i] != ','; ++i) {
    if (list[i] != '[') {
      host += list[i];
      continue;
    }
    auto close = list.find(']', i);
    auto first = list.substr(i + 1, close == std::string::npos ? 0 : close - i - 1);
    first = first.substr(0, first.find_first_of(",-"));
    if (close == std::string::npos || first.empty() || !parse_integer(first))
      throw env_error(name + "='" + list + "' is not a Slurm host list like gpu[01-04],cpu3",
                      "set MASTER_ADDR to the host name of the node that runs rank 0");
    host += first;
    i = close;
  }
  if (host.empty())
    throw env_error(name + " is empty",
                    "set MASTER_ADDR to the host name of the node that runs rank 0");
  return host;
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

inline int required_count(const EnvLookup& env, const RankVars& v, const char* name) {
  auto value = env_count(env, name, v.fix);
  if (!value)
    throw env_error(std::string(name) + " is not set, although other " + v.source +
                        " variables are: the launch environment is incomplete",
                    v.fix);
  return *value;
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

inline LaunchEnv read_ranks(const EnvLookup& env, const RankVars& v) {
  LaunchEnv e;
  e.source = v.source;
  e.rank = required_count(env, v, v.rank);
  e.world_size = required_count(env, v, v.size);
  e.local_rank = required_count(env, v, v.local_rank);
  e.local_world_size = v.local_size ? required_count(env, v, v.local_size) : slurm_local_size(env);
  return e;
}

inline void check_ranks(const LaunchEnv& e, const RankVars& v) {
  auto show = [](const char* name, int value) {
    return std::string(name) + "=" + std::to_string(value);
  };
  if (e.world_size < 1)
    throw env_error(show(v.size, e.world_size) + ": a job needs at least one process", v.fix);
  if (e.rank >= e.world_size)
    throw env_error(show(v.rank, e.rank) + " is not below " + show(v.size, e.world_size) +
                        " (ranks count from 0)",
                    v.fix);
  const std::string local_size = v.local_size
                                     ? show(v.local_size, e.local_world_size)
                                     : std::to_string(e.local_world_size) + " tasks on this node";
  if (e.local_world_size < 1 || e.local_world_size > e.world_size)
    throw env_error(local_size + " is not between 1 and " + show(v.size, e.world_size), v.fix);
  if (e.local_rank >= e.local_world_size)
    throw env_error(show(v.local_rank, e.local_rank) + " is not below " + local_size +
                        " (local ranks count from 0)",
                    v.fix);
}

// torchrun's static rendezvous (its default) keeps its own store listening
// on MASTER_PORT for the whole job and tells its workers so with
// TORCHELASTIC_USE_AGENT_STORE=True. That store speaks PyTorch's protocol,
// not ours, so dtrain's rendezvous takes the next port, which every rank
// works out alike. Other rendezvous backends hand workers a free port.
inline bool torchrun_store_holds_port(const EnvLookup& env) {
  auto flag = env("TORCHELASTIC_USE_AGENT_STORE");
  return flag && (*flag == "True" || *flag == "true" || *flag == "1");
}

inline void read_master(const EnvLookup& env, const RankVars* v, LaunchEnv& e) {
  if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
    e.master_addr = *addr;
  } else if (v == &slurm_vars) {
    // The step's nodes first: a step may run on part of the allocation, and
    // its rank 0 is on the step's first node, not necessarily the job's.
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = env(name)) {
        e.master_addr = first_slurm_host(name, *list);
        break;
      }
    }
  }
  if (e.world_size > 1 && e.master_addr.empty())
    throw env_error("a world of " + std::to_string(e.world_size) +
                        " processes needs a master address, but MASTER_ADDR is not set",
                    v ? v->addr_fix : "set MASTER_ADDR");
  const std::string port_fix = "set MASTER_PORT to a free TCP port between 1 and 65535 (default " +
                               std::to_string(default_master_port) + ")";
  if (auto text = env("MASTER_PORT")) {
    auto port = parse_integer(*text);
    if (!port) throw env_error("MASTER_PORT='" + *text + "' is not an integer", port_fix);
    if (*port < 1 || *port > 65535)
      throw env_error("MASTER_PORT=" + *text + " is outside 1..65535", port_fix);
    e.master_port = static_cast<int>(*port);
  } else if (!e.master_addr.empty()) {
    e.master_port = default_master_port;
  }
  if (e.master_port != 0 && v == &torchrun_vars && torchrun_store_holds_port(env)) {
    if (e.master_port == 65535)
      throw env_error("MASTER_PORT=65535 is held by torchrun's own store, and no port above it is left for "
                      "dtrain's rendezvous",
                      "pass torchrun a --master_port below 65535");
    ++e.master_port;
  }
}

inline std::optional<double> read_comm_timeout(const EnvLookup& env) {
  auto text = env("DTRAIN_COMM_TIMEOUT_S");
  if (!text) return std::nullopt;
  auto seconds = parse_number(*text);
  if (!seconds || *seconds <= 0)
    throw env_error("DTRAIN_COMM_TIMEOUT_S='" + *text + "' is not a positive number of seconds",
                    "set it to e.g. 600 (ten minutes), or unset it for the default");
  return seconds;
}

// One of `names` (their spelling in the error), or nullopt when unset.
template <class E>
std::optional<E> env_choice(const EnvLookup& env, const char* var,
                            std::initializer_list<std::pair<std::string_view, E>> names) {
  auto text = env(var);
  if (!text) return std::nullopt;
  std::string list;
  for (const auto& [name, value] : names) {
    if (*text == name) return value;
    if (!list.empty()) list += '|';
    list += name;
  }
  throw env_error(std::string(var) + "='" + *text + "' is not one of " + list,
                  "set " + std::string(var) + " to one of " + list + ", or unset it");
}

inline void read_comm_choices(const EnvLookup& env, LaunchEnv& e) {
  e.host = env_choice<host_transport>(env, "DTRAIN_HOST_TRANSPORT", {{"auto", host_transport::automatic},
                                                                     {"shm", host_transport::shm},
                                                                     {"gloo", host_transport::gloo}});
  e.wait = env_choice<shm_wait>(env, "DTRAIN_SHM_WAIT",
                                {{"auto", shm_wait::automatic}, {"spin", shm_wait::spin}, {"futex", shm_wait::futex}});
  if (auto text = env("DTRAIN_SHM_CHUNK_KIB")) {
    auto kib = parse_integer(*text);
    if (!kib || *kib < 4 || *kib > (1 << 20) || *kib % 4 != 0)
      throw env_error("DTRAIN_SHM_CHUNK_KIB='" + *text + "' is not a multiple of 4 between 4 and 1048576",
                      "set it to e.g. 256, or unset it for the default");
    e.shm_part_bytes = static_cast<std::size_t>(*kib) << 10;
  }
  for (const char* name : {"GROUP_RANK", "SLURM_NODEID"})
    if (auto tag = env(name); tag && !tag->empty()) {
      e.node_tag = *tag;
      break;
    }
}

}  // namespace detail

inline LaunchEnv discover_env(const EnvLookup& env) {
  const detail::RankVars* vars = nullptr;
  for (const auto* v : {&detail::torchrun_vars, &detail::openmpi_vars, &detail::slurm_vars}) {
    if (detail::launched_by(env, *v)) {
      vars = v;
      break;
    }
  }
  LaunchEnv e;
  e.source = "none";
  if (vars) {
    e = detail::read_ranks(env, *vars);
    detail::check_ranks(e, *vars);
  }
  detail::read_master(env, vars, e);
  e.comm_timeout_s = detail::read_comm_timeout(env);
  detail::read_comm_choices(env, e);
  return e;
}

// The process environment as an EnvLookup. getenv is not thread-safe
// against setenv; dtrain reads the environment once at init, before it
// starts threads.
inline std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (!value) return std::nullopt;
  return std::string(value);
}

inline LaunchEnv discover_env() { return discover_env(process_env); }

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
