#pragma once
// dtrain::init(): join the job this process was launched into.
//
// Reads rank, world size, local rank and the master address from the
// environment of dtrain-run / torchrun, Slurm or Open MPI (launch/env.hpp)
// and connects to the rendezvous that rank 0 hosts. Without any launcher it
// returns a world of one. Every failure (inconsistent environment, port in
// use, unreachable master) is a dtrain::launch_error within the timeout.

#include <chrono>

#include "dtrain/comm/world.hpp"
#include "dtrain/core/fault.hpp"
#include "dtrain/launch/env.hpp"

namespace dtrain {

struct InitOptions {
  CommOptions comm{};
};

inline World init(const LaunchEnv& env, InitOptions options = {}) {
  if (env.comm_timeout_s)
    options.comm.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(*env.comm_timeout_s * 1000.0));
  if (env.host) options.comm.host = *env.host;
  if (env.gpu) options.comm.gpu = *env.gpu;
  if (env.wait) options.comm.wait = *env.wait;
  if (env.shm_part_bytes) options.comm.shm_part_bytes = *env.shm_part_bytes;
  fault::arm(env.rank, env.world_size);  // DTRAIN_FAULT_INJECT (core/fault.hpp), for the reliability tests
  return World(World::Layout{env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_tag},
               env.master_addr, env.master_port, options.comm);
}

inline World init(InitOptions options = {}) { return init(discover_env(), options); }

}  // namespace dtrain
