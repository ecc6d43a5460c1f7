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
#include "dtrain/core/macros.hpp"
#include "dtrain/launch/env.hpp"

namespace dtrain {

struct InitOptions {
  CommOptions comm{};
};

DTRAIN_DECL World init(const LaunchEnv& env, InitOptions options = {});

inline World init(InitOptions options = {}) { return init(discover_env(), options); }

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/launch/init.ipp"
#endif
