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
#include "dtrain/core/macros.hpp"
#include "dtrain/core/parse.hpp"

namespace dtrain {

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

namespace detail {

// Reads an integer variable that must be >= 0 and fit an int.
DTRAIN_DECL std::optional<int> env_count(const EnvLookup& env, const std::string& name, const std::string& fix);

// Slurm compresses per-node task counts: "4(x2),3" means nodes with 4, 4 and 3.
DTRAIN_DECL std::vector<int> expand_slurm_counts(const std::string& name, const std::string& text);

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
    "torchrun",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "launch with dtrain-run or torchrun, which set RANK, WORLD_SIZE, LOCAL_RANK and "
    "LOCAL_WORLD_SIZE together; or unset all four to run as a single process",
    "set MASTER_ADDR to the host that runs rank 0 (dtrain-run and torchrun set it)"};
inline constexpr RankVars openmpi_vars{
    "openmpi",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "these variables are set by Open MPI's mpirun; launch with mpirun or unset them",
    "pass the address of rank 0's host to every rank: mpirun -x MASTER_ADDR=<host> ..."};
inline constexpr RankVars slurm_vars{
    "slurm",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    nullptr,
    "these variables are set by Slurm for each task; launch with srun",
    "export MASTER_ADDR, or start the tasks with srun, which sets SLURM_STEP_NODELIST"};

// Any one of torchrun's or mpirun's variables marks a process they started.
// Slurm sets SLURM_NTASKS in a whole allocation, also in an salloc shell that
// runs no task, so only SLURM_PROCID marks a task that srun started.
DTRAIN_DECL bool launched_by(const EnvLookup& env, const RankVars& v);

// Tasks on this node: Slurm gives per-node counts; the step's own layout
// (srun) is preferred over the allocation's, which a step may use only part of.
DTRAIN_DECL int slurm_local_size(const EnvLookup& env);

// One pause of a spin-wait (x86's pause, Arm's yield): the shared-memory
// transport's waits and the host's thread pool poll with it.
DTRAIN_DECL void cpu_relax();

}  // namespace detail

// The process environment as an EnvLookup. getenv is not thread-safe
// against setenv; dtrain reads the environment once at init, before it
// starts threads.
DTRAIN_DECL std::optional<std::string> process_env(const std::string& name);

// How many ranks share this node, from whichever launcher started the
// process, with discover_env's precedence: LOCAL_WORLD_SIZE (dtrain-run,
// torchrun), OMPI_COMM_WORLD_LOCAL_SIZE (mpirun), this node's task count
// (srun); 1 when no launcher's variables are present. Only the local count
// is read and checked, so a device can size its threads before the rest of
// the launch environment is validated.
DTRAIN_DECL int local_world_size(const EnvLookup& env);

// Cores this process may run on: the affinity mask (taskset, Slurm and
// container cpusets restrict it), not the machine's total.
DTRAIN_DECL int usable_cpu_count();

// Each rank's share of the usable cores when all of this node's ranks run on
// them.
DTRAIN_DECL int cores_per_local_rank(const EnvLookup& env);

// The address space each thread of OpenBLAS's pool reserves: its 128 MiB work
// buffer (Debian's OpenBLAS 0.3.21 on x86-64, measured) and an 8 MiB stack.
// Under an address-space limit (ulimit -v, RLIMIT_AS) this is what counts,
// and a pool thread that finds no room for its buffer retries forever: the
// process then hangs when it exits and joins the pool.
inline constexpr std::uint64_t blas_thread_address_space = std::uint64_t{136} << 20;

// The process's address-space limit in bytes; nullopt when unlimited.
DTRAIN_DECL std::optional<std::uint64_t> address_space_limit();

// The most BLAS threads an address-space limit has room for, when their pool
// may take a quarter of it and the program the rest.
DTRAIN_DECL int blas_threads_within(std::uint64_t limit_bytes);

// `threads` BLAS threads, no more than the address-space limit has room for.
DTRAIN_DECL int blas_threads_capped(int threads, std::optional<std::uint64_t> limit_bytes = address_space_limit());

// A rank's BLAS threads when OPENBLAS_NUM_THREADS does not say: its share of
// the usable cores, capped as above. What a Host device takes; dtrain-run
// passes the same cap of its ranks' share as OPENBLAS_NUM_THREADS.
inline int blas_threads_per_rank(const EnvLookup& env) { return blas_threads_capped(cores_per_local_rank(env)); }

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/core/host_env.ipp"
#endif
