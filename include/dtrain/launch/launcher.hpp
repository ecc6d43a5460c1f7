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
#include <filesystem>
#include <cerrno>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/launch/env.hpp"

namespace dtrain {

// --nproc-per-node: a number, "gpu" (one per visible CUDA device) or "auto"
// (one per GPU, or one per usable CPU core when there is no GPU).
struct NprocSpec {
  enum class Kind { count, gpu, automatic };
  Kind kind = Kind::count;
  int count = 1;
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
  --nproc-per-node N|gpu|auto  processes on this node (default 1); gpu: one per
                               visible CUDA device (an error if none); auto: one
                               per GPU, or one per usable CPU core without GPUs
  --nnodes N                   nodes in the job, one dtrain-run each (default 1)
  --node-rank R                this node's index, 0..N-1 (default 0)
  --master-addr A              host of rank 0 (default 127.0.0.1; required
                               when --nnodes > 1)
  --master-port P              TCP port of rank 0 (default: a free port on one
                               node, 29500 on several; 0 = pick a free port,
                               one node only)
  --max-restarts K             restart all local ranks up to K times after a
                               failure (default 0)
  --prefix / --no-prefix       prefix each output line of a rank with
                               "[rank N] " (default on); --no-prefix lets ranks
                               write straight to dtrain-run's stdout/stderr
  --grace-period S             seconds between SIGTERM and SIGKILL when
                               stopping ranks (default 5)
  -h, --help                   show this help and exit
  --version                    show the version and exit

each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT, DTRAIN_RUN=1, DTRAIN_RESTART_COUNT, DTRAIN_JOB_ID, and
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS = max(1, cores / nproc) unless set
(OPENBLAS_NUM_THREADS no more than a quarter of ulimit -v holds at 136 MiB each).

exit status: 0 when every rank succeeded; the first failing rank's exit code
(128+N if it was killed by signal N); 2 for bad options; 127 if PROGRAM cannot
be found. SIGINT/SIGTERM/SIGHUP/SIGQUIT are forwarded to every rank (a second
one kills them at once) and dtrain-run then ends by the same signal.
)";
}

namespace detail {

inline int option_int(const std::string& flag, const std::string& value, long long min,
                      long long max) {
  auto parsed = parse_integer(value);
  if (!parsed || *parsed < min || *parsed > max)
    throw launch_error(flag + " " + value + " is not an integer in " + std::to_string(min) + ".." +
                           std::to_string(max),
                       "see dtrain-run --help");
  return static_cast<int>(*parsed);
}

inline NprocSpec parse_nproc(const std::string& value) {
  if (value == "gpu") return {NprocSpec::Kind::gpu, 0};
  if (value == "auto") return {NprocSpec::Kind::automatic, 0};
  auto parsed = parse_integer(value);
  if (!parsed || *parsed < 1 || *parsed > 4096)
    throw launch_error("--nproc-per-node " + value + " is not a process count, gpu or auto",
                       "pass a number such as 4, or gpu, or auto");
  return {NprocSpec::Kind::count, static_cast<int>(*parsed)};
}

inline void check_run_options(const RunOptions& o) {
  if (o.help || o.version) return;
  if (o.program.empty())
    throw launch_error("no PROGRAM to run", "usage: dtrain-run [options] PROGRAM [ARGS...]");
  if (o.node_rank >= o.nnodes)
    throw launch_error("--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                           std::to_string(o.nnodes),
                       "node ranks count from 0 to nnodes-1");
  if (o.nnodes > 1 && !o.master_addr)
    throw launch_error("--nnodes " + std::to_string(o.nnodes) + " needs --master-addr",
                       "pass the address of the node with --node-rank 0 to every node");
  if (o.nnodes > 1 && o.master_port == 0)
    throw launch_error("--master-port 0 (pick a free port) works on one node only",
                       "pass the same fixed port to every node");
}

}  // namespace detail

// Parses dtrain-run's arguments (without argv[0]). Options end at the first
// argument that is not one (or after "--"); the rest is PROGRAM and its args.
inline RunOptions parse_run_options(std::span<const std::string> args) {
  RunOptions o;
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
    std::replace(arg.begin() + 2, arg.end(), '_', '-');
    auto flag_only = [&] {
      if (inline_value) throw launch_error(arg + " takes no value", "see dtrain-run --help");
    };
    auto value = [&] {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size())
        throw launch_error(arg + " needs a value", "see dtrain-run --help");
      return args[++i];
    };
    if (arg == "-h" || arg == "--help") {
      flag_only();
      o.help = true;
    } else if (arg == "--version") {
      flag_only();
      o.version = true;
    } else if (arg == "--prefix" || arg == "--no-prefix") {
      flag_only();
      o.prefix = arg == "--prefix";
    } else if (arg == "--nproc-per-node") {
      o.nproc = detail::parse_nproc(value());
    } else if (arg == "--nnodes") {
      auto v = value();
      if (v.find(':') != std::string::npos)
        throw launch_error("--nnodes " + v + ": elastic MIN:MAX node counts are not supported",
                           "pass a fixed node count");
      o.nnodes = detail::option_int(arg, v, 1, 1 << 20);
    } else if (arg == "--node-rank") {
      o.node_rank = detail::option_int(arg, value(), 0, 1 << 20);
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
    } else {
      throw launch_error("unknown option " + args[i], "see dtrain-run --help");
    }
  }
  if (i < args.size()) {
    o.program = args[i];
    o.program_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
  }
  detail::check_run_options(o);
  return o;
}

inline int resolve_nproc(const NprocSpec& spec, int gpu_count, int cpu_count) {
  switch (spec.kind) {
    case NprocSpec::Kind::count: return spec.count;
    case NprocSpec::Kind::gpu:
      if (gpu_count < 1)
        throw launch_error("--nproc-per-node gpu, but no CUDA device is visible",
                           "check nvidia-smi and CUDA_VISIBLE_DEVICES, or pass a number or auto");
      return gpu_count;
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
  if (!ok)
    throw launch_error("could not find a free TCP port: " + reason, "pass --master-port P");
  return ntohs(addr.sin_port);
}

// What every rank of one local group shares.
struct GroupLayout {
  int nproc_per_node = 1;
  int master_port = default_master_port;
  int cpu_count = 1;
  int restart_count = 0;
  // Names this launch's shared-memory segments (comm/host.hpp), so that
  // remove_job_segments() can clear what a killed rank left behind.
  std::string job_id;
};

// The environment of local rank `local_rank`: the inherited one, with the
// launch variables replaced and thread counts added where the user set none.
inline std::vector<std::string> rank_environment(const RunOptions& o, const GroupLayout& g,
                                                 int local_rank,
                                                 std::span<const std::string> inherited) {
  auto num = [](int v) { return std::to_string(v); };
  // One BLAS/OpenMP pool per rank sized to the whole machine oversubscribes
  // the cores nproc times over, so each rank gets its share.
  const int share = std::max(1, g.cpu_count / g.nproc_per_node);
  const std::string threads = num(share);
  // OpenBLAS's pool threads also reserve address space each (env.hpp).
  const std::string blas_threads = num(blas_threads_capped(share));
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
      {"OMP_NUM_THREADS", threads},
      {"OPENBLAS_NUM_THREADS", blas_threads},
  };
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  auto user_keeps = [](const std::string& name) {
    return name == "OMP_NUM_THREADS" || name == "OPENBLAS_NUM_THREADS";
  };
  std::vector<std::string> env;
  for (const auto& entry : inherited) {
    auto name = name_of(entry);
    auto ours =
        std::find_if(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; });
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
