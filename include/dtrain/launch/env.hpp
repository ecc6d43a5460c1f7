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
#include <cmath>
#include <cstdint>
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

#include "dtrain/comm/auth.hpp"
#include "dtrain/comm/communicator.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/host_env.hpp"
#include "dtrain/core/macros.hpp"
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
  // DTRAIN_JOB_TOKEN, DTRAIN_INSECURE_NO_TOKEN, DTRAIN_STORE_BIND (CommOptions).
  std::string job_token{};
  bool insecure_no_token = false;
  std::string store_bind{};
};

// The port used when a master address is known but MASTER_PORT is not set;
// torchrun's default, so mixed setups agree.
inline constexpr int default_master_port = 29500;

namespace detail {

// First host of a Slurm hostlist: "gpu[01-04,07],cpu3" -> "gpu01". Each
// bracket contributes the start of its first range, zero padding kept.
DTRAIN_DECL std::string first_slurm_host(const std::string& name, const std::string& list);

DTRAIN_DECL int required_count(const EnvLookup& env, const RankVars& v, const char* name);

DTRAIN_DECL LaunchEnv read_ranks(const EnvLookup& env, const RankVars& v);

DTRAIN_DECL void check_ranks(const LaunchEnv& e, const RankVars& v);
DTRAIN_DECL void check_slurm_step(const EnvLookup& env, const RankVars& v, const LaunchEnv& e);

// torchrun's static rendezvous (its default) keeps its own store listening
// on MASTER_PORT for the whole job and tells its workers so with
// TORCHELASTIC_USE_AGENT_STORE=True. That store speaks PyTorch's protocol,
// not ours, so dtrain's rendezvous takes the next port, which every rank
// works out alike. Other rendezvous backends hand workers a free port.
DTRAIN_DECL bool torchrun_store_holds_port(const EnvLookup& env);

DTRAIN_DECL void read_master(const EnvLookup& env, const RankVars* v, LaunchEnv& e);

DTRAIN_DECL std::optional<double> read_comm_timeout(const EnvLookup& env);

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

DTRAIN_DECL void read_comm_choices(const EnvLookup& env, LaunchEnv& e);

// DTRAIN_JOB_TOKEN (checked: long enough), DTRAIN_INSECURE_NO_TOKEN (0 or 1)
// and DTRAIN_STORE_BIND.
DTRAIN_DECL void read_security(const EnvLookup& env, LaunchEnv& e);

}  // namespace detail

DTRAIN_DECL LaunchEnv discover_env(const EnvLookup& env);

inline LaunchEnv discover_env() { return discover_env(process_env); }

// dtrain-run --nproc-per-node gpu sets this to "gpu" in every rank.
inline constexpr const char* launch_device_variable = "DTRAIN_LAUNCH_DEVICE";

// A rank started for a GPU whose trainer runs on the host would train anyway,
// on a share of the CPU cores, as many CPU ranks as there are GPUs: slowly
// and not what was asked for. It stops at start instead.
DTRAIN_DECL void check_launch_device(bool on_host, std::string_view device, const EnvLookup& env = process_env);

template <class Dev>
void check_launch_device(const EnvLookup& env = process_env) {
  check_launch_device(Dev::host_accessible, Dev::name, env);
}

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/launch/env.ipp"
#endif
