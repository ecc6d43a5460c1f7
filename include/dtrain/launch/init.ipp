// The definitions init.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/launch/init.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  DTRAIN_DECL World init(const LaunchEnv& env, InitOptions options) {
    if (env.comm_timeout_s)
      options.comm.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(*env.comm_timeout_s * 1000.0));
    if (env.host) options.comm.host = *env.host;
    if (env.gpu) options.comm.gpu = *env.gpu;
    if (env.wait) options.comm.wait = *env.wait;
    if (env.shm_part_bytes) options.comm.shm_part_bytes = *env.shm_part_bytes;
    if (!env.job_token.empty()) options.comm.job_token = env.job_token;
    if (env.insecure_no_token) options.comm.insecure_no_token = true;
    if (!env.store_bind.empty()) options.comm.store_bind = env.store_bind;
    fault::arm(env.rank, env.world_size);  // DTRAIN_FAULT_INJECT (core/fault.hpp), for the reliability tests
    return World(World::Layout{env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_tag},
                 env.master_addr, env.master_port, options.comm);
  }
}  // namespace dtrain
DTRAIN_IMPL_END
