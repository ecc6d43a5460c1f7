#pragma once
// The parts of dtrain-run that decide rather than supervise: its command line,
// the environment each rank gets, the host facts it needs (GPUs, cores, a free
// port) and the line prefixer for child output. Kept here, apart from the
// process handling in tools/dtrain_run.cpp, so they are unit-testable.

#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/io/json.hpp"
#include "dtrain/launch/env.hpp"

namespace dtrain {

// --nproc-per-node: a number, "gpu" (one per visible CUDA device), "cpu" (one
// per usable CPU core) or "auto" (one per GPU, or per usable core without one).
struct NprocSpec {
  enum class Kind { count, gpu, cpu, automatic };
  Kind kind = Kind::count;
  int count = 1;
};

// torchrun's --redirects / --tee value: which of a rank's streams go to its log
// files (bit 1 stdout, bit 2 stderr), for every local rank ("3") or per local
// rank ("0:3,1:1"; ranks not listed: none).
struct StdStreams {
  static constexpr int out = 1, err = 2;
  int all = 0;
  std::optional<std::map<int, int>> per_rank;

  int of(int local_rank) const {
    if (!per_rank) return all;
    auto it = per_rank->find(local_rank);
    return it == per_rank->end() ? 0 : it->second;
  }
  bool any() const {
    if (!per_rank) return all != 0;
    return std::any_of(per_rank->begin(), per_rank->end(), [](const auto& kv) { return kv.second != 0; });
  }
};

struct RunOptions {
  NprocSpec nproc;
  int nnodes = 1;
  int node_rank = 0;
  std::optional<std::string> master_addr;  // nullopt: 127.0.0.1 (one node only)
  std::optional<int> master_port;          // nullopt or 0 on one node: a free port
  int max_restarts = 0;
  bool prefix = true;
  double grace_period_s = 5.0;
  bool help = false;
  bool version = false;
  bool new_token = false;  // --new-token: print a fresh job token and exit
  // torchrun's rendezvous flags. They end up as master_addr / master_port:
  // dtrain's rendezvous is rank 0's TCP store, whichever backend is named.
  bool standalone = false;
  std::string rdzv_backend = "static";
  std::optional<std::string> rdzv_endpoint;
  std::string rdzv_id = "none";  // TORCHELASTIC_RUN_ID, as torchrun's default
  std::optional<std::string> log_dir;
  StdStreams redirects, tee;
  std::string program;
  std::vector<std::string> program_args;

  std::string effective_master_addr() const { return master_addr.value_or("127.0.0.1"); }
};

inline std::string run_usage() {
  return R"(usage: dtrain-run [options] PROGRAM [ARGS...]

Starts PROGRAM as one process per rank on this node, gives each the variables
dtrain::init() (and torchrun-style programs) read, and supervises them: if one
rank fails, the others are stopped and dtrain-run exits with that rank's code.

options (torchrun's spellings with '_' are accepted too, and --flag=value):
  --nproc-per-node N|gpu|cpu|auto
                               processes on this node (default 1); gpu: one per
                               visible CUDA device (an error if none); cpu: one
                               per usable CPU core; auto: one per GPU, or one
                               per usable CPU core without GPUs
  --nnodes N                   nodes in the job, one dtrain-run each (default
                               1; N:N is N, elastic MIN:MAX is an error)
  --node-rank R                this node's index, 0..N-1 (default 0)
  --master-addr A              host of rank 0 (default 127.0.0.1; required
                               when --nnodes > 1)
  --master-port P              TCP port of rank 0 (default: a free port on one
                               node, 29500 on several; 0 = pick a free port,
                               one node only)
  --max-restarts K             restart all local ranks up to K times after a
                               failure (default 0)
  --standalone                 one node, rendezvous on 127.0.0.1 at a free port
                               (rendezvous and master flags are then ignored)
  --rdzv-backend c10d|static   accepted; the rendezvous is always rank 0's TCP
                               store at the endpoint (or master address/port)
  --rdzv-endpoint HOST[:PORT]  rank 0's host and port: the same as --master-addr
                               and --master-port (port default 29400 for c10d)
  --rdzv-id ID                 passed to the ranks as TORCHELASTIC_RUN_ID
  --log-dir DIR                where --redirects/--tee write each rank's
                               stdout.log and stderr.log (default: a new folder
                               under $TMPDIR), in DIR/ID_XXXXXX/attempt_K/LOCAL/
  -r, --redirects 0|1|2|3|MAP  streams that go to the log files only: 1 stdout,
                               2 stderr, 3 both; MAP per local rank: 0:3,1:1
  -t, --tee 0|1|2|3|MAP        streams that go to the log files and the console
  --no-python                  accepted: dtrain-run always runs PROGRAM itself
  --monitor-interval S         accepted: dtrain-run sees a rank end at once
  --start-method M             accepted: every rank is a fresh process
  --prefix / --no-prefix       prefix each output line of a rank with
                               "[rank N] " (default on); --no-prefix lets ranks
                               write straight to dtrain-run's stdout/stderr
  --grace-period S             seconds between SIGTERM and SIGKILL when
                               stopping ranks (default 5)
  --new-token                  print a fresh random job token and exit (for
                               DTRAIN_JOB_TOKEN on several nodes)
  -h, --help                   show this help and exit
  --version                    show the version and exit

torchrun's -m/--module and --run-path (Python only) are errors.

each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT, DTRAIN_JOB_TOKEN, DTRAIN_RUN=1, DTRAIN_RESTART_COUNT, DTRAIN_JOB_ID,
TORCHELASTIC_RUN_ID, DTRAIN_LAUNCH_DEVICE=gpu with --nproc-per-node gpu, and
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS = max(1, cores / nproc) unless set
(OPENBLAS_NUM_THREADS no more than a quarter of ulimit -v holds at 136 MiB each).

exit status: 0 when every rank succeeded; the first failing rank's exit code
(128+N if it was killed by signal N); 2 for bad options; 127 if PROGRAM cannot
be found; 75 when the ranks saved a checkpoint on a preemption notice and
exited with 75 (requeue the job; it is not restarted here). SIGINT/SIGTERM/
SIGHUP/SIGQUIT are forwarded to every rank (a second one kills them at once)
and dtrain-run then ends by the same signal, or with 75 as above; SIGUSR1 and
SIGUSR2 (Slurm's --signal=USR1@T notice) are forwarded and stop nothing.
)";
}

namespace detail {

inline int option_int(const std::string& flag, const std::string& value, long long min, long long max) {
  auto parsed = parse_integer(value);
  if (!parsed || *parsed < min || *parsed > max)
    throw launch_error(flag + " " + value + " is not an integer in " + std::to_string(min) + ".." + std::to_string(max),
                       "see dtrain-run --help");
  return static_cast<int>(*parsed);
}

inline NprocSpec parse_nproc(const std::string& value) {
  if (value == "gpu") return {NprocSpec::Kind::gpu, 0};
  if (value == "cpu") return {NprocSpec::Kind::cpu, 0};
  if (value == "auto") return {NprocSpec::Kind::automatic, 0};
  auto parsed = parse_integer(value);
  if (!parsed || *parsed < 1 || *parsed > 4096)
    throw launch_error("--nproc-per-node " + value + " is not a process count, gpu, cpu or auto",
                       "pass a number such as 4, or gpu, cpu or auto");
  return {NprocSpec::Kind::count, static_cast<int>(*parsed)};
}

// "2" or torchrun's "2:2"; an elastic range has no fixed world to start.
inline int parse_nnodes(const std::string& value) {
  auto colon = value.find(':');
  if (colon == std::string::npos) return option_int("--nnodes", value, 1, 1 << 20);
  const auto min = parse_integer(value.substr(0, colon)), max = parse_integer(value.substr(colon + 1));
  if (!min || !max || *min < 1 || *max > (1 << 20) || *min > *max)
    throw launch_error("--nnodes " + value + " is not a node count N or a range MIN:MAX",
                       "pass a fixed --nnodes N, e.g. --nnodes 2");
  if (*min != *max)
    throw launch_error("--nnodes " + value + ": elastic MIN:MAX node counts are not supported",
                       "pass a fixed --nnodes N, and restart the job (or use --max-restarts K) when a node fails");
  return static_cast<int>(*min);
}

// --redirects / --tee: "0".."3", or per local rank "0:3,1:1" (torchrun's forms).
inline StdStreams parse_std_streams(const std::string& flag, const std::string& value) {
  const auto bad = [&] {
    return launch_error(flag + " " + value + " is not 0, 1, 2, 3 or a per-rank list like 0:3,1:1",
                        "pass 0 (none), 1 (stdout), 2 (stderr) or 3 (both), for every local rank or as "
                        "LOCAL_RANK:VALUE pairs");
  };
  const auto level = [&](std::string_view text) {
    auto v = parse_integer(text);
    if (!v || *v < 0 || *v > 3) throw bad();
    return static_cast<int>(*v);
  };
  StdStreams s;
  if (value.find(':') == std::string::npos) {
    s.all = level(value);
    return s;
  }
  s.per_rank.emplace();
  std::string_view rest = value;
  while (true) {
    auto comma = rest.find(',');
    auto item = rest.substr(0, comma);
    auto colon = item.find(':');
    if (colon == std::string_view::npos) throw bad();
    auto rank = parse_integer(item.substr(0, colon));
    if (!rank || *rank < 0 || *rank > 4095) throw bad();
    (*s.per_rank)[static_cast<int>(*rank)] = level(item.substr(colon + 1));
    if (comma == std::string_view::npos) return s;
    rest.remove_prefix(comma + 1);
  }
}

// HOST:PORT, [IPV6]:PORT or HOST; the port nullopt when absent.
inline std::pair<std::string, std::optional<int>> parse_endpoint(const std::string& value) {
  const std::string fix = "pass the host of rank 0's node and a port, e.g. --rdzv-endpoint node0:29400";
  std::string host = value;
  std::optional<std::string> port;
  if (!value.empty() && value.front() == '[') {
    auto close = value.find(']');
    const std::string rest = close == std::string::npos ? "" : value.substr(close + 1);
    if (close == std::string::npos || (!rest.empty() && rest.front() != ':'))
      throw launch_error("--rdzv-endpoint " + value + " is not [HOST]:PORT", fix);
    host = value.substr(1, close - 1);
    if (!rest.empty()) port = rest.substr(1);
  } else if (auto colon = value.rfind(':'); colon != std::string::npos) {
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
  }
  if (host.empty()) throw launch_error("--rdzv-endpoint '" + value + "' names no host", fix);
  if (!port) return {host, std::nullopt};
  return {host, option_int("--rdzv-endpoint " + value + ": port", *port, 0, 65535)};
}

// A run id like torchrun's --standalone picks (a random UUID there).
inline std::string random_run_id() {
  std::random_device rd;
  char text[33];
  for (int i = 0; i < 4; ++i) std::snprintf(text + 8 * i, 9, "%08x", static_cast<unsigned>(rd()));
  return text;
}

// torchrun's rendezvous flags as the master address and port of rank 0's
// TCP store, which is where dtrain's ranks meet whatever torchrun would use.
inline void apply_rendezvous(RunOptions& o, bool nnodes_given, bool node_rank_given) {
  if (o.standalone) {
    if (nnodes_given && o.nnodes > 1)
      throw launch_error("--standalone runs one node, but --nnodes is " + std::to_string(o.nnodes),
                         "drop --standalone and pass every node --nnodes, its --node-rank and rank 0's "
                         "--rdzv-endpoint HOST:PORT");
    // As torchrun: a local rendezvous on a free port, the other flags ignored.
    o.nnodes = 1;
    o.node_rank = 0;
    o.master_addr.reset();
    o.master_port = 0;
    o.rdzv_backend = "c10d";
    o.rdzv_endpoint.reset();
    o.rdzv_id = random_run_id();
    return;
  }
  if (o.rdzv_backend != "c10d" && o.rdzv_backend != "static")
    throw launch_error(
        "--rdzv-backend " + o.rdzv_backend + " is not supported: dtrain's ranks meet at rank 0's TCP store",
        "use --rdzv-backend c10d --rdzv-endpoint HOST:PORT (HOST: the node of rank 0), or "
        "--master-addr HOST --master-port PORT");
  if (o.rdzv_endpoint) {
    auto [host, port] = parse_endpoint(*o.rdzv_endpoint);
    if (!port && o.rdzv_backend == "static")
      throw launch_error("--rdzv-endpoint " + *o.rdzv_endpoint + " has no port",
                         "write HOST:PORT, e.g. --rdzv-endpoint " + host + ":29500");
    o.master_addr = host;
    o.master_port = port.value_or(29400);  // torchrun's c10d default
  }
  // torchrun's c10d rendezvous numbers the nodes as they arrive; dtrain-run's
  // launchers do not talk to each other, so each node must know its number.
  if (o.rdzv_backend == "c10d" && o.nnodes > 1 && !node_rank_given)
    throw launch_error("--rdzv-backend c10d on " + std::to_string(o.nnodes) +
                           " nodes needs --node-rank: dtrain-run does not number the nodes at rendezvous",
                       "pass each node its own --node-rank, 0 to " + std::to_string(o.nnodes - 1));
}

// torchrun flags that dtrain-run does not take, with what to do instead.
inline void reject_torchrun_only(const std::string& flag) {
  if (flag == "-m" || flag == "--module")
    throw launch_error(flag + " runs a Python module, but dtrain-run runs programs, not Python modules",
                       "name the program: dtrain-run [options] python3 -m MODULE [ARGS...]");
  if (flag == "--run-path")
    throw launch_error("--run-path runs a Python file, but dtrain-run runs programs, not Python files",
                       "name the program: dtrain-run [options] python3 FILE [ARGS...]");
  if (flag == "--rdzv-conf")
    throw launch_error("torchrun's --rdzv-conf is not supported by dtrain-run",
                       "drop it; DTRAIN_COMM_TIMEOUT_S sets how long ranks wait for each other");
  for (const char* other : {"--role", "--local-addr", "--logs-specs", "--local-ranks-filter", "--event-log-handler",
                            "--numa-binding", "--signals-to-handle", "--virtual-local-rank"})
    if (flag == other)
      throw launch_error("torchrun's " + flag + " is not supported by dtrain-run",
                         "drop it; dtrain-run --help lists the flags it takes");
}

inline void check_run_options(const RunOptions& o) {
  if (o.help || o.version || o.new_token) return;
  if (o.program.empty()) throw launch_error("no PROGRAM to run", "usage: dtrain-run [options] PROGRAM [ARGS...]");
  if (o.node_rank >= o.nnodes)
    throw launch_error(
        "--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " + std::to_string(o.nnodes),
        "node ranks count from 0 to nnodes-1");
  if (o.nnodes > 1 && !o.master_addr)
    throw launch_error("--nnodes " + std::to_string(o.nnodes) + " needs --master-addr",
                       "pass the address of the node with --node-rank 0 to every node (--master-addr HOST, or "
                       "--rdzv-endpoint HOST:PORT)");
  if (o.nnodes > 1 && o.master_port == 0)
    throw launch_error("--master-port 0 (pick a free port) works on one node only",
                       "pass the same fixed port to every node");
}

}  // namespace detail

// Inside a Slurm job, --nnodes cannot exceed the job's nodes: the missing
// nodes' dtrain-run would never start, and the others would wait for them
// until the rendezvous timed out.
inline void check_slurm_nodes(const RunOptions& o, const EnvLookup& env) {
  if (o.help || o.version || o.nnodes < 2) return;
  for (const char* name : {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}) {
    const auto text = env(name);
    if (!text) continue;
    const auto nodes = detail::parse_integer(*text);
    if (nodes && *nodes >= 1 && o.nnodes > *nodes)
      throw launch_error("--nnodes " + std::to_string(o.nnodes) + ", but this Slurm job has " + *text + " node(s) (" +
                             name + "=" + *text + "): the other nodes' dtrain-run would never start",
                         "pass --nnodes " + *text +
                             " (--nnodes $SLURM_JOB_NUM_NODES), or ask sbatch for --nodes=" + std::to_string(o.nnodes) +
                             "; start one dtrain-run per node with "
                             "srun --ntasks-per-node=1");
    return;
  }
}

// Parses dtrain-run's arguments (without argv[0]). Options end at the first
// argument that is not one (or after "--"); the rest is PROGRAM and its args.
inline RunOptions parse_run_options(std::span<const std::string> args) {
  RunOptions o;
  bool nnodes_given = false, node_rank_given = false;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;
    std::optional<std::string> inline_value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg.resize(eq);
    }
    if (arg.size() > 2) std::replace(arg.begin() + 2, arg.end(), '_', '-');  // "-=x" leaves "-" (found by fuzzing)
    auto flag_only = [&] {
      if (inline_value) throw launch_error(arg + " takes no value", "see dtrain-run --help");
    };
    auto value = [&] {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) throw launch_error(arg + " needs a value", "see dtrain-run --help");
      return args[++i];
    };
    if (arg == "-h" || arg == "--help") {
      flag_only();
      o.help = true;
    } else if (arg == "--version") {
      flag_only();
      o.version = true;
    } else if (arg == "--new-token") {
      flag_only();
      o.new_token = true;
    } else if (arg == "--prefix" || arg == "--no-prefix") {
      flag_only();
      o.prefix = arg == "--prefix";
    } else if (arg == "--nproc-per-node") {
      o.nproc = detail::parse_nproc(value());
    } else if (arg == "--nnodes") {
      o.nnodes = detail::parse_nnodes(value());
      nnodes_given = true;
    } else if (arg == "--node-rank") {
      o.node_rank = detail::option_int(arg, value(), 0, 1 << 20);
      node_rank_given = true;
    } else if (arg == "--master-addr") {
      o.master_addr = value();
      if (o.master_addr->empty())
        throw launch_error("--master-addr is empty", "pass the host name or IP of rank 0's node");
    } else if (arg == "--master-port") {
      o.master_port = detail::option_int(arg, value(), 0, 65535);
    } else if (arg == "--max-restarts") {
      o.max_restarts = detail::option_int(arg, value(), 0, 1 << 20);
    } else if (arg == "--grace-period") {
      auto v = value();
      auto seconds = detail::parse_number(v);
      if (!seconds || *seconds < 0 || *seconds > 86400)
        throw launch_error("--grace-period " + v + " is not a number of seconds in 0..86400",
                           "pass e.g. --grace-period 5");
      o.grace_period_s = *seconds;
    } else if (arg == "--standalone") {
      flag_only();
      o.standalone = true;
    } else if (arg == "--rdzv-backend") {
      o.rdzv_backend = value();
    } else if (arg == "--rdzv-endpoint") {
      o.rdzv_endpoint = value();
    } else if (arg == "--rdzv-id") {
      o.rdzv_id = value();
      if (o.rdzv_id.empty()) throw launch_error("--rdzv-id is empty", "pass a job name, e.g. --rdzv-id job1");
    } else if (arg == "--log-dir") {
      o.log_dir = value();
      if (o.log_dir->empty()) throw launch_error("--log-dir is empty", "pass a folder, e.g. --log-dir logs");
    } else if (arg == "-r" || arg == "--redirects") {
      o.redirects = detail::parse_std_streams(arg, value());
    } else if (arg == "-t" || arg == "--tee") {
      o.tee = detail::parse_std_streams(arg, value());
    } else if (arg == "--no-python") {
      flag_only();  // what dtrain-run always does: PROGRAM is run as it is
    } else if (arg == "--monitor-interval") {
      // dtrain-run learns of a rank's end from SIGCHLD at once: nothing to poll.
      auto v = value();
      auto seconds = detail::parse_number(v);
      if (!seconds || *seconds < 0)
        throw launch_error("--monitor-interval " + v + " is not a number of seconds", "pass e.g. --monitor-interval 1");
    } else if (arg == "--start-method") {
      // Every rank is exec'd afresh, which is what torchrun's methods differ in for Python only.
      auto v = value();
      if (v != "spawn" && v != "fork" && v != "forkserver")
        throw launch_error("--start-method " + v + " is not spawn, fork or forkserver",
                           "pass one of them, or drop the flag (dtrain-run always starts a fresh process)");
    } else {
      detail::reject_torchrun_only(arg);
      throw launch_error("unknown option " + args[i], "see dtrain-run --help");
    }
  }
  if (i < args.size()) {
    o.program = args[i];
    o.program_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
  }
  if (!o.help && !o.version && !o.new_token) detail::apply_rendezvous(o, nnodes_given, node_rank_given);
  detail::check_run_options(o);
  return o;
}

inline int resolve_nproc(const NprocSpec& spec, int gpu_count, int cpu_count) {
  switch (spec.kind) {
    case NprocSpec::Kind::count: return spec.count;
    case NprocSpec::Kind::gpu:
      if (gpu_count < 1)
        throw launch_error("--nproc-per-node gpu, but no CUDA device is visible",
                           "pass --nproc-per-node N to run N ranks on the CPU, or check nvidia-smi and "
                           "CUDA_VISIBLE_DEVICES");
      return gpu_count;
    case NprocSpec::Kind::cpu: return std::max(1, cpu_count);
    case NprocSpec::Kind::automatic: break;
  }
  return gpu_count > 0 ? gpu_count : std::max(1, cpu_count);
}

// CUDA devices visible to this process. The driver is loaded at run time so
// dtrain-run neither links nor needs CUDA; 0 when it is absent or finds no
// device. The library stays loaded: unloading the driver after cuInit is not
// supported.
inline int cuda_device_count() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  using init_fn = int (*)(unsigned);
  using count_fn = int (*)(int*);
  auto init = reinterpret_cast<init_fn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<count_fn>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0) return 0;
  return n;
}

// A TCP port that is free right now. Another process may take it before rank
// 0 listens; the window is short and a clash fails loudly at rendezvous.
inline int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  std::string reason = ok ? "" : std::strerror(errno);
  if (fd >= 0) ::close(fd);
  if (!ok) throw launch_error("could not find a free TCP port: " + reason, "pass --master-port P");
  return ntohs(addr.sin_port);
}

// What every rank of one local group shares.
struct GroupLayout {
  int nproc_per_node = 1;
  int master_port = default_master_port;
  int cpu_count = 1;
  int restart_count = 0;
  // Names this launch's shared-memory segments (backend/host/comm.hpp), so that
  // remove_job_segments() can clear what a killed rank left behind.
  std::string job_id;
  // This run's folder of rank logs (make_log_run_dir); empty when --redirects
  // and --tee send nothing to files.
  std::string log_dir;
  // This run's folder of the ranks' error records (rank_error_file): the log
  // folder, or a private one dtrain-run removes; empty for none.
  std::string error_dir;
  // The job's secret (job_token_for), given to every rank as DTRAIN_JOB_TOKEN;
  // empty under DTRAIN_INSECURE_NO_TOKEN=1.
  std::string job_token{};
};

// The token this launch gives its ranks: DTRAIN_JOB_TOKEN from the
// environment (checked), else a fresh one when this dtrain-run starts the
// whole job (one node); several nodes must share one, which no node can
// make for the others, so it must be given. Empty only when the user asked
// for DTRAIN_INSECURE_NO_TOKEN=1.
inline std::string job_token_for(const RunOptions& o, const EnvLookup& env) {
  if (auto given = env("DTRAIN_JOB_TOKEN"); given && !given->empty()) {
    check_job_token(*given, "DTRAIN_JOB_TOKEN");
    return *given;
  }
  if (auto insecure = env("DTRAIN_INSECURE_NO_TOKEN"); insecure && *insecure == "1") return {};
  if (o.nnodes == 1) return new_job_token();
  throw launch_error("a job of " + std::to_string(o.nnodes) +
                         " nodes needs one job token on every node, and DTRAIN_JOB_TOKEN is not set",
                     "make one with `export DTRAIN_JOB_TOKEN=$(dtrain-run --new-token)` where the job starts "
                     "and pass it to every node's dtrain-run (srun and sbatch pass exported variables on; "
                     "see docs/security.md), or set DTRAIN_INSECURE_NO_TOKEN=1 to run without one");
}

// Where one stream (StdStreams::out or ::err) of a local rank goes, by
// torchrun's rule: --tee is --redirects plus the console.
struct StreamRoute {
  bool file = false;
  bool console = true;
};

inline StreamRoute stream_route(const RunOptions& o, int local_rank, int stream) {
  const bool tee = (o.tee.of(local_rank) & stream) != 0;
  const bool file = tee || (o.redirects.of(local_rank) & stream) != 0;
  return {file, tee || !file};
}

inline bool logs_to_files(const RunOptions& o) { return o.redirects.any() || o.tee.any(); }

// torchrun's layout: RUN_DIR/attempt_<restart>/<local rank>/{stdout,stderr}.log.
inline std::filesystem::path rank_log_file(const std::filesystem::path& run_dir, int restart, int local_rank,
                                           int stream) {
  return run_dir / ("attempt_" + std::to_string(restart)) / std::to_string(local_rank) /
         (stream == StdStreams::out ? "stdout.log" : "stderr.log");
}

// Where a local rank records the error that ends it (TORCHELASTIC_ERROR_FILE,
// dtrain::record_failure), beside its logs as torchrun keeps it.
inline std::filesystem::path rank_error_file(const std::filesystem::path& run_dir, int restart, int local_rank) {
  return run_dir / ("attempt_" + std::to_string(restart)) / std::to_string(local_rank) / "error.json";
}

// What a rank recorded about the error that ended it (dtrain::record_failure).
struct ErrorRecord {
  std::string message;
  int exit_code = 1;
  std::int64_t raised_at_us = 0;
};

// Reads a record dtrain::record_failure wrote; nullopt for a missing file or
// one without dtrain's fields (torchrun's Python records keep only seconds).
inline std::optional<ErrorRecord> read_error_record(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("dtrain") || !j["dtrain"].is_object()) return std::nullopt;
  const auto code = detail::json_number<int>(j["dtrain"].value("exit_code", nlohmann::json()));
  const auto raised = detail::json_number<std::int64_t>(j["dtrain"].value("raised_at_us", nlohmann::json()));
  if (!code || !raised) return std::nullopt;
  const auto message = j.find("message");
  return ErrorRecord{.message = message != j.end() && message->is_string() ? message->get<std::string>() : "",
                     .exit_code = *code,
                     .raised_at_us = *raised};
}

// This run's log folder, LOG_DIR/<rdzv id>_XXXXXX (torchrun's naming; LOG_DIR
// defaults to $TMPDIR/dtrain-run), made now and unique, so a later run given
// the same --log-dir never writes into it.
inline std::filesystem::path make_log_run_dir(const RunOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = o.log_dir ? fs::path(*o.log_dir) : fs::temp_directory_path(ec) / "dtrain-run";
  fs::create_directories(root, ec);
  std::string id = o.rdzv_id;
  for (char& c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') c = '_';
  std::string pattern = (root / (id + "_XXXXXX")).string();
  if (!::mkdtemp(pattern.data()))
    throw launch_error("cannot make a log folder in " + root.string() + ": " + std::strerror(errno),
                       "pass --log-dir DIR, a folder you may write to");
  return pattern;
}

// The environment of local rank `local_rank`: the inherited one, with the
// launch variables replaced and thread counts added where the user set none.
inline std::vector<std::string> rank_environment(const RunOptions& o, const GroupLayout& g, int local_rank,
                                                 std::span<const std::string> inherited) {
  auto num = [](int v) { return std::to_string(v); };
  // One BLAS/OpenMP pool per rank sized to the whole machine oversubscribes
  // the cores nproc times over, so each rank gets its share.
  const int share = std::max(1, g.cpu_count / g.nproc_per_node);
  const std::string threads = num(share);
  // OpenBLAS's pool threads also reserve address space each (env.hpp).
  const std::string blas_threads = num(blas_threads_capped(share));
  // Set by whoever launched dtrain-run, not true of this launch: dropped. An
  // inherited torchrun agent-store flag would shift MASTER_PORT (env.hpp).
  std::vector<std::string> drop = {"TORCHELASTIC_USE_AGENT_STORE"};
  std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", num(o.node_rank * g.nproc_per_node + local_rank)},
      {"WORLD_SIZE", num(o.nnodes * g.nproc_per_node)},
      {"LOCAL_RANK", num(local_rank)},
      {"LOCAL_WORLD_SIZE", num(g.nproc_per_node)},
      {"GROUP_RANK", num(o.node_rank)},
      {"MASTER_ADDR", o.effective_master_addr()},
      {"MASTER_PORT", num(g.master_port)},
      {"DTRAIN_RUN", "1"},
      {"DTRAIN_RESTART_COUNT", num(g.restart_count)},
      {"DTRAIN_JOB_ID", g.job_id},
      {"DTRAIN_JOB_TOKEN", g.job_token},
      {"OMP_NUM_THREADS", threads},
      {"OPENBLAS_NUM_THREADS", blas_threads},
      {"TORCHELASTIC_RUN_ID", o.rdzv_id},
  };
  // Tells a trainer on the host that it was meant to get a GPU (env.hpp).
  if (o.nproc.kind == NprocSpec::Kind::gpu)
    set.emplace_back(launch_device_variable, "gpu");
  else
    drop.emplace_back(launch_device_variable);
  // One record per rank; an inherited one would have every rank overwrite it.
  if (!g.error_dir.empty())
    set.emplace_back("TORCHELASTIC_ERROR_FILE", rank_error_file(g.error_dir, g.restart_count, local_rank).string());
  else
    drop.emplace_back("TORCHELASTIC_ERROR_FILE");
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  auto user_keeps = [](const std::string& name) { return name == "OMP_NUM_THREADS" || name == "OPENBLAS_NUM_THREADS"; };
  std::vector<std::string> env;
  for (const auto& entry : inherited) {
    auto name = name_of(entry);
    if (std::find(drop.begin(), drop.end(), name) != drop.end()) continue;
    auto ours = std::find_if(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; });
    if (ours == set.end()) {
      env.push_back(entry);
    } else if (user_keeps(name)) {
      env.push_back(entry);
      set.erase(ours);
    }
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

// Splits a stream of child output into lines and prefixes each. Output from
// several ranks is interleaved by whole lines only. A line longer than
// max_line is emitted in pieces, which bounds memory for output that never
// ends a line (progress bars).
// Shared-memory segments are unlinked by the ranks as soon as all of them
// have mapped one; a rank killed during that set-up can leave a name behind.
// The launcher removes its job's names (/dev/shm/dtrain-<job_id>-*) once the
// ranks are gone. Returns how many it removed.
inline int remove_job_segments(const std::string& job_id, const std::string& dir = "/dev/shm") {
  if (job_id.empty()) return 0;
  const std::string prefix = "dtrain-" + job_id + "-";
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && std::filesystem::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

class LinePrefixer {
 public:
  explicit LinePrefixer(std::string prefix, std::size_t max_line = 64 * 1024)
      : prefix_(std::move(prefix)), max_line_(max_line) {}

  // The complete lines of pending + chunk, prefixed; keeps the unfinished tail.
  std::string feed(std::string_view chunk) {
    pending_ += chunk;
    std::string out;
    std::size_t start = 0;
    while (true) {
      auto nl = pending_.find('\n', start);
      if (nl == std::string::npos) {
        if (pending_.size() - start < max_line_) break;
        nl = start + max_line_ - 1;
        emit(out, std::string_view(pending_).substr(start, nl + 1 - start));
        out += '\n';
      } else {
        emit(out, std::string_view(pending_).substr(start, nl + 1 - start));
      }
      start = nl + 1;
    }
    pending_.erase(0, start);
    return out;
  }

  // The unfinished last line, prefixed and ended; empty when there is none.
  std::string finish() {
    std::string out;
    if (!pending_.empty()) {
      emit(out, pending_);
      out += '\n';
      pending_.clear();
    }
    return out;
  }

 private:
  void emit(std::string& out, std::string_view line) const {
    out += prefix_;
    out += line;
  }

  std::string prefix_;
  std::size_t max_line_;
  std::string pending_;
};

}  // namespace dtrain
