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
#include "dtrain/core/host_env.hpp"
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
  // DTRAIN_HOST_TRANSPORT, DTRAIN_SHM_WAIT, DTRAIN_SHM_CHUNK_KIB, DTRAIN_GPU_TRANSPORT
  // (comm/communicator.hpp).
  std::optional<host_transport> host;
  std::optional<gpu_transport> gpu;
  std::optional<shm_wait> wait;
  std::optional<std::size_t> shm_part_bytes;
};

// The port used when a master address is known but MASTER_PORT is not set;
// torchrun's default, so mixed setups agree.
inline constexpr int default_master_port = 29500;

namespace detail {



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



inline int required_count(const EnvLookup& env, const RankVars& v, const char* name) {
  auto value = env_count(env, name, v.fix);
  if (!value)
    throw env_error(std::string(name) + " is not set, although other " + v.source +
                        " variables are: the launch environment is incomplete",
                    v.fix);
  return *value;
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
  e.gpu = env_choice<gpu_transport>(env, "DTRAIN_GPU_TRANSPORT", {{"nccl", gpu_transport::nccl},
                                                                  {"host", gpu_transport::host}});
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


inline LaunchEnv discover_env() { return discover_env(process_env); }

// dtrain-run --nproc-per-node gpu sets this to "gpu" in every rank.
inline constexpr const char* launch_device_variable = "DTRAIN_LAUNCH_DEVICE";

// A rank started for a GPU whose trainer runs on the host would train anyway,
// on a share of the CPU cores, as many CPU ranks as there are GPUs: slowly
// and not what was asked for. It stops at start instead.
inline void check_launch_device(bool on_host, std::string_view device, const EnvLookup& env = process_env) {
  if (!on_host) return;
  auto asked = env(launch_device_variable);
  if (!asked || *asked != "gpu") return;
  throw config_error("dtrain-run --nproc-per-node gpu started this rank for a GPU, but its trainer runs on the "
                         "CPU (device " + std::string(device) + ")",
                     "run the program's CUDA variant (in the examples: device=cuda), or launch with "
                     "--nproc-per-node N for N CPU ranks");
}

template <class Dev>
void check_launch_device(const EnvLookup& env = process_env) {
  check_launch_device(Dev::host_accessible, Dev::name, env);
}


}  // namespace dtrain
