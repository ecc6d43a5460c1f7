// The definitions env.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/launch/env.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::string first_slurm_host(const std::string& name, const std::string& list) {
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
      throw env_error(name + " is empty", "set MASTER_ADDR to the host name of the node that runs rank 0");
    return host;
  }

  DTRAIN_DECL int required_count(const EnvLookup& env, const RankVars& v, const char* name) {
    auto value = env_count(env, name, v.fix);
    if (!value)
      throw env_error(std::string(name) + " is not set, although other " + v.source +
                          " variables are: the launch environment is incomplete",
                      v.fix);
    return *value;
  }

  DTRAIN_DECL LaunchEnv read_ranks(const EnvLookup& env, const RankVars& v) {
    LaunchEnv e;
    e.source = v.source;
    e.rank = required_count(env, v, v.rank);
    e.world_size = required_count(env, v, v.size);
    e.local_rank = required_count(env, v, v.local_rank);
    e.local_world_size = v.local_size ? required_count(env, v, v.local_size) : slurm_local_size(env);
    return e;
  }

  DTRAIN_DECL void check_ranks(const LaunchEnv& e, const RankVars& v) {
    auto show = [](const char* name, int value) { return std::string(name) + "=" + std::to_string(value); };
    if (e.world_size < 1) throw env_error(show(v.size, e.world_size) + ": a job needs at least one process", v.fix);
    if (e.rank >= e.world_size)
      throw env_error(show(v.rank, e.rank) + " is not below " + show(v.size, e.world_size) + " (ranks count from 0)",
                      v.fix);
    const std::string local_size = v.local_size ? show(v.local_size, e.local_world_size)
                                                : std::to_string(e.local_world_size) + " tasks on this node";
    if (e.local_world_size < 1 || e.local_world_size > e.world_size)
      throw env_error(local_size + " is not between 1 and " + show(v.size, e.world_size), v.fix);
    if (e.local_rank >= e.local_world_size)
      throw env_error(show(v.local_rank, e.local_rank) + " is not below " + local_size + " (local ranks count from 0)",
                      v.fix);
  }

  // A program run straight from an sbatch script (not by srun) sees the
  // allocation's SLURM_PROCID=0 and SLURM_NTASKS: it would be rank 0 of a
  // world whose other ranks never start, and wait for them until the
  // rendezvous times out. srun gives each task SLURM_STEP_ID; the batch
  // script has none.
  DTRAIN_DECL void check_slurm_step(const EnvLookup& env, const RankVars& v, const LaunchEnv& e) {
    if (&v != &slurm_vars || e.world_size < 2 || env("SLURM_STEP_ID") || env("SLURM_STEPID")) return;
    throw env_error("this process runs in the Slurm job's batch script, not as a task of srun: SLURM_NTASKS=" +
                        std::to_string(e.world_size) + " ranks were asked for, and the other " +
                        std::to_string(e.world_size - 1) + " would never start",
                    "start one task per rank with srun (srun ./train ...), or one dtrain-run per node "
                    "(srun --ntasks-per-node=1 dtrain-run --nproc-per-node N ./train ...)");
  }

  DTRAIN_DECL bool torchrun_store_holds_port(const EnvLookup& env) {
    auto flag = env("TORCHELASTIC_USE_AGENT_STORE");
    return flag && (*flag == "True" || *flag == "true" || *flag == "1");
  }

  DTRAIN_DECL void read_master(const EnvLookup& env, const RankVars* v, LaunchEnv& e) {
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
    const std::string port_fix =
        "set MASTER_PORT to a free TCP port between 1 and 65535 (default " + std::to_string(default_master_port) + ")";
    if (auto text = env("MASTER_PORT")) {
      auto port = parse_integer(*text);
      if (!port) throw env_error("MASTER_PORT='" + *text + "' is not an integer", port_fix);
      if (*port < 1 || *port > 65535) throw env_error("MASTER_PORT=" + *text + " is outside 1..65535", port_fix);
      e.master_port = static_cast<int>(*port);
    } else if (!e.master_addr.empty()) {
      e.master_port = default_master_port;
    }
    if (e.master_port != 0 && v == &torchrun_vars && torchrun_store_holds_port(env)) {
      if (e.master_port == 65535)
        throw env_error(
            "MASTER_PORT=65535 is held by torchrun's own store, and no port above it is left for "
            "dtrain's rendezvous",
            "pass torchrun a --master_port below 65535");
      ++e.master_port;
    }
  }

  DTRAIN_DECL std::optional<double> read_comm_timeout(const EnvLookup& env) {
    auto text = env("DTRAIN_COMM_TIMEOUT_S");
    if (!text) return std::nullopt;
    auto seconds = parse_number(*text);
    if (!seconds || *seconds <= 0)
      throw env_error("DTRAIN_COMM_TIMEOUT_S='" + *text + "' is not a positive number of seconds",
                      "set it to e.g. 600 (ten minutes), or unset it for the default");
    return seconds;
  }

  DTRAIN_DECL void read_comm_choices(const EnvLookup& env, LaunchEnv& e) {
    e.host = env_choice<host_transport>(
        env, "DTRAIN_HOST_TRANSPORT",
        {{"auto", host_transport::automatic}, {"shm", host_transport::shm}, {"gloo", host_transport::gloo}});
    e.gpu = env_choice<gpu_transport>(env, "DTRAIN_GPU_TRANSPORT",
                                      {{"nccl", gpu_transport::nccl}, {"host", gpu_transport::host}});
    e.wait = env_choice<shm_wait>(
        env, "DTRAIN_SHM_WAIT", {{"auto", shm_wait::automatic}, {"spin", shm_wait::spin}, {"futex", shm_wait::futex}});
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

  DTRAIN_DECL void read_security(const EnvLookup& env, LaunchEnv& e) {
    if (auto token = env("DTRAIN_JOB_TOKEN"); token && !token->empty()) {
      check_job_token(*token, "DTRAIN_JOB_TOKEN");
      e.job_token = *token;
    }
    if (auto flag = env("DTRAIN_INSECURE_NO_TOKEN"); flag && !flag->empty()) {
      if (*flag != "0" && *flag != "1")
        throw env_error("DTRAIN_INSECURE_NO_TOKEN='" + *flag + "' is not 0 or 1",
                        "set it to 1 to run a job without a token (any process that reaches the rendezvous port "
                        "can then join it), or unset it");
      e.insecure_no_token = *flag == "1";
    }
    if (auto bind = env("DTRAIN_STORE_BIND"); bind && !bind->empty()) e.store_bind = *bind;
  }
  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL LaunchEnv discover_env(const EnvLookup& env) {
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
    detail::check_slurm_step(env, *vars, e);
  }
  detail::read_master(env, vars, e);
  e.comm_timeout_s = detail::read_comm_timeout(env);
  detail::read_comm_choices(env, e);
  detail::read_security(env, e);
  return e;
}

DTRAIN_DECL void check_launch_device(bool on_host, std::string_view device, const EnvLookup& env) {
  if (!on_host) return;
  auto asked = env(launch_device_variable);
  if (!asked || *asked != "gpu") return;
  throw config_error(
      "dtrain-run --nproc-per-node gpu started this rank for a GPU, but its trainer runs on the "
      "CPU (device " +
          std::string(device) + ")",
      "run the program's CUDA variant (in the examples: device=cuda), or launch with "
      "--nproc-per-node N for N CPU ranks");
}
}  // namespace dtrain
DTRAIN_IMPL_END
