// dtrain-doctor: what someone debugging a multi-GPU (or multi-process) setup
// needs on one screen, then a check of every collective on this node.
//
// Prints the host, CUDA driver/runtime, GPUs (memory, compute capability, PCI
// bus), the peer-access matrix, NCCL's version and the environment variables
// launchers and NCCL/Gloo read. Then it runs all_reduce (sum, avg),
// reduce_scatter, all_gather, broadcast and barrier across every local GPU
// through NCCL (one thread per GPU) or, with no GPU or --host, across CPU
// ranks (threads of this process) over the host transport a job would use
// (shared memory; DTRAIN_HOST_TRANSPORT=gloo forces Gloo), which it names;
// checks every result, and
// prints an nccl-tests-style bandwidth table. Exit status 0: all checks
// passed; 1: a check failed or a collective threw; 2: bad arguments.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <dtrain/backend/cuda/comm_nccl.hpp>
#include <dtrain/backend/host/comm.hpp>
#include <dtrain/backend/host/device.hpp>
#include <dtrain/backend/host/device_isa.hpp>
#include <dtrain/comm/world.hpp>
#include <dtrain/launch/env.hpp>
#include <dtrain/version.hpp>

extern char** environ;

namespace {

using namespace dtrain;

constexpr std::string_view usage = R"(usage: dtrain-doctor [options]

Prints this node's setup (host, CUDA, GPUs, peer access, NCCL, environment),
then runs and checks every collective across all local GPUs (NCCL, one
thread per GPU) or, without a GPU, across CPU ranks (threads) over the host
transport a job would use: shared memory, or Gloo with DTRAIN_HOST_TRANSPORT=gloo.

options:
  --host             use CPU ranks even when GPUs are present
  --ranks N          number of ranks (default: every GPU; 2 CPU ranks)
  --max-bytes B      largest message, with optional K/M/G suffix (default 64M)
  --iters N          timed iterations per size, median reported (default 10)
  --warmup N         untimed iterations before them (default 3)
  --timeout S        seconds before a stuck collective fails (default: DTRAIN_COMM_TIMEOUT_S,
                     else 600, as in a launched job)
  --help             this text

exit status: 0 all checks passed, 1 a check failed, 2 bad arguments
)";

struct Options {
  bool host = false;
  std::optional<int> ranks;
  std::size_t max_bytes = std::size_t{64} << 20;
  int iters = 10;
  int warmup = 3;
  std::optional<double> timeout_s;  // --timeout
};

struct usage_error {
  std::string what;
};

std::size_t parse_bytes(std::string_view text) {
  std::size_t value = 0;
  std::size_t used = 0;
  try {
    value = std::stoull(std::string(text), &used);
  } catch (const std::exception&) {
    throw usage_error{"--max-bytes: '" + std::string(text) + "' is not a size"};
  }
  const std::string_view suffix = text.substr(used);
  if (suffix.empty()) return value;
  if (suffix == "K" || suffix == "k") return value << 10;
  if (suffix == "M" || suffix == "m") return value << 20;
  if (suffix == "G" || suffix == "g") return value << 30;
  throw usage_error{"--max-bytes: unknown suffix '" + std::string(suffix) + "' (use K, M or G)"};
}

int parse_positive(std::string_view flag, std::string_view text) {
  try {
    std::size_t used = 0;
    const int v = std::stoi(std::string(text), &used);
    if (used == text.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw usage_error{std::string(flag) + ": '" + std::string(text) + "' is not a positive integer"};
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw usage_error{std::string(arg) + " needs a value"};
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage.data(), stdout);
      std::exit(0);
    } else if (arg == "--host") {
      o.host = true;
    } else if (arg == "--ranks") {
      o.ranks = parse_positive(arg, value());
    } else if (arg == "--max-bytes") {
      o.max_bytes = parse_bytes(value());
    } else if (arg == "--iters") {
      o.iters = parse_positive(arg, value());
    } else if (arg == "--warmup") {
      o.warmup = parse_positive(arg, value());
    } else if (arg == "--timeout") {
      o.timeout_s = static_cast<double>(parse_positive(arg, value()));
    } else {
      throw usage_error{"unknown option '" + std::string(arg) + "'"};
    }
  }
  if (o.max_bytes < 8) throw usage_error{"--max-bytes must be at least 8"};
  return o;
}

// ---- the node ------------------------------------------------------------------

void print_host() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  const int usable = dtrain::usable_cpu_count();
  std::printf("dtrain-doctor %s\n\n", dtrain::version.data());
  std::printf("host            %s\n", name);
  std::printf("cpu cores       %u online, %d usable by this process\n", std::thread::hardware_concurrency(), usable);
  // What a CPU rank started here with this environment runs (backend/host/device.hpp).
  if (const char* set = std::getenv("OPENBLAS_NUM_THREADS"); set && *set) {
    std::printf("blas threads    %s per rank (OPENBLAS_NUM_THREADS)\n", set);
  } else {
    try {
      const int local = dtrain::local_world_size(dtrain::process_env);
      const int share = dtrain::cores_per_local_rank(dtrain::process_env);
      const int threads = dtrain::blas_threads_per_rank(dtrain::process_env);
      if (threads < share)
        std::printf(
            "blas threads    %d per rank (a quarter of ulimit -v, %llu MiB, at %llu MiB per thread; the "
            "cores would give %d)\n",
            threads, static_cast<unsigned long long>(*dtrain::address_space_limit() >> 20),
            static_cast<unsigned long long>(dtrain::blas_thread_address_space >> 20), share);
      else
        std::printf("blas threads    %d per rank (%d usable cores / %d rank%s on this node)\n", threads, usable, local,
                    local == 1 ? "" : "s");
    } catch (const dtrain::error& e) {
      std::printf("blas threads    unknown: %s\n", e.what());
    }
  }
  // The vector level of the host's kernels (backend/host/device_isa.hpp).
  try {
    const dtrain::host_isa isa = dtrain::current_host_isa();
    const dtrain::host_isa widest = dtrain::detail::widest_host_isa();
    std::printf("host kernels    %s%s\n", dtrain::host_isa_name(isa),
                isa == widest ? " (the widest this CPU has)" : " (pinned by DTRAIN_HOST_ISA)");
  } catch (const dtrain::error& e) {
    std::printf("host kernels    %s\n", e.what());
  }
  // Which library multiplies fp32 matrices on the host (DTRAIN_HOST_GEMM).
  try {
    const bool onednn = dtrain::detail::host_gemm_from_env() == dtrain::host_gemm::onednn;
    const std::string& missing = dtrain::detail::onednn_unavailable();
    std::printf("host gemm       %s%s\n", onednn ? "onednn" : "openblas",
                onednn || missing.empty() ? "" : (" (oneDNN: " + missing + "; apt install libdnnl2)").c_str());
  } catch (const dtrain::error& e) {
    std::printf("host gemm       %s\n", e.what());
  }
}

void print_environment() {
  // Always shown, "(unset)" included: a missing one is often the problem.
  constexpr const char* named[] = {
      "CUDA_VISIBLE_DEVICES", "MASTER_ADDR",          "MASTER_PORT",      "RANK",
      "WORLD_SIZE",           "LOCAL_RANK",           "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
      "OPENBLAS_NUM_THREADS", "DTRAIN_HOST_TRANSPORT"};
  // Every variable with these prefixes is shown when set.
  constexpr std::string_view prefixes[] = {"NCCL_",         "GLOO_", "DTRAIN_", "CUDA_", "SLURM_", "OMPI_COMM_WORLD_",
                                           "TORCHELASTIC_", "UCX_",  "FI_"};
  std::printf("\nenvironment\n");
  for (const char* n : named) {
    const char* v = std::getenv(n);
    std::printf("  %-26s %s\n", n, v ? v : "(unset)");
  }
  std::vector<std::string> extra;
  for (char** e = environ; *e; ++e) {
    const std::string_view kv = *e;
    const std::string_view key = kv.substr(0, kv.find('='));
    const bool shown = std::find(std::begin(named), std::end(named), key) != std::end(named);
    const bool wanted =
        std::any_of(std::begin(prefixes), std::end(prefixes), [&](std::string_view p) { return key.starts_with(p); });
    if (wanted && !shown) extra.emplace_back(kv);
  }
  std::sort(extra.begin(), extra.end());
  for (const auto& kv : extra) {
    const auto eq = kv.find('=');
    // The job's secret is never printed: doctor output gets pasted into issues.
    const bool secret = kv.substr(0, eq) == "DTRAIN_JOB_TOKEN";
    const std::string value =
        secret ? "(set, " + std::to_string(kv.size() - eq - 1) + " characters; not shown)" : kv.substr(eq + 1);
    std::printf("  %-26s %s\n", kv.substr(0, eq).c_str(), value.c_str());
  }
}

#if DTRAIN_HAS_CUDA
std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

// Returns the number of usable GPUs (0 when CUDA cannot see any).
int print_cuda() {
  int driver = 0;
  int runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("\nCUDA            driver %s, runtime %s\n", driver ? cuda_version_text(driver).c_str() : "(none)",
              cuda_version_text(runtime).c_str());
  int nccl = 0;
  ncclGetVersion(&nccl);
  std::printf("NCCL            %d.%d.%d\n", nccl / 10000, (nccl % 10000) / 100, nccl % 100);
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    std::printf("GPUs            none usable: %s (%s)\n", cudaGetErrorString(e), cudaGetErrorName(e));
    return 0;
  }
  std::printf("GPUs            %d\n", count);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    cuda_check(cudaGetDeviceProperties(&p, d), "cudaGetDeviceProperties");
    char bus[32] = {};
    cudaDeviceGetPCIBusId(bus, sizeof bus, d);
    std::size_t free_b = 0;
    std::size_t total_b = 0;
    cudaSetDevice(d);
    cudaMemGetInfo(&free_b, &total_b);
    std::printf("  GPU %d  %s  %.1f GiB (%.1f free)  sm_%d%d  %d SMs  PCI %s\n", d, p.name,
                static_cast<double>(p.totalGlobalMem) / (1 << 30), static_cast<double>(free_b) / (1 << 30), p.major,
                p.minor, p.multiProcessorCount, bus);
  }
  if (count > 1) {
    std::printf("peer access (row can read column directly; '-' goes through host memory)\n       ");
    for (int j = 0; j < count; ++j) std::printf("%4d", j);
    std::printf("\n");
    for (int i = 0; i < count; ++i) {
      std::printf("  %4d ", i);
      for (int j = 0; j < count; ++j) {
        int can = 0;
        if (i != j) cudaDeviceCanAccessPeer(&can, i, j);
        std::printf("%4s", i == j ? "." : can ? "Y" : "-");
      }
      std::printf("\n");
    }
  }
  return count;
}
#endif

// ---- the collectives ------------------------------------------------------------

enum class Coll { all_reduce_sum, all_reduce_avg, reduce_scatter, all_gather, broadcast, barrier };
constexpr Coll all_colls[] = {Coll::all_reduce_sum, Coll::all_reduce_avg, Coll::reduce_scatter, Coll::all_gather,
                              Coll::broadcast};

struct CollInfo {
  const char* name;
  const char* op;
};
constexpr CollInfo info(Coll c) {
  switch (c) {
    case Coll::all_reduce_sum: return {"all_reduce", "sum"};
    case Coll::all_reduce_avg: return {"all_reduce", "avg"};
    case Coll::reduce_scatter: return {"reduce_scatter", "sum"};
    case Coll::all_gather: return {"all_gather", "-"};
    case Coll::broadcast: return {"broadcast", "-"};
    case Coll::barrier: return {"barrier", "-"};
  }
  return {"?", "?"};
}

// nccl-tests' bus bandwidth: what each link carries relative to the message,
// so numbers compare across world sizes and against link speed.
double bus_factor(Coll c, int n) {
  switch (c) {
    case Coll::all_reduce_sum:
    case Coll::all_reduce_avg: return 2.0 * (n - 1) / n;
    case Coll::reduce_scatter:
    case Coll::all_gather: return static_cast<double>(n - 1) / n;
    case Coll::broadcast:
    case Coll::barrier: return 1.0;
  }
  return 1.0;
}

// Rank r's input: small integers that differ by rank and position, so a
// block landing at the wrong offset or from the wrong rank is caught.
template <class T>
T pattern(int rank, std::size_t i) {
  return T(static_cast<float>(rank + 1 + static_cast<int>(i % 61)));
}

// What every rank thread reports into, read by the main thread after join.
class Report {
 public:
  void time(Coll c, std::size_t bytes, int rank, std::vector<double> us) {
    std::lock_guard lock(mu_);
    auto& per_rank = times_[{c, bytes}];
    per_rank.resize(static_cast<std::size_t>(std::max<int>(rank + 1, static_cast<int>(per_rank.size()))));
    per_rank[static_cast<std::size_t>(rank)] = std::move(us);
  }
  void fail(std::string what) {
    std::lock_guard lock(mu_);
    failures_.push_back(std::move(what));
  }
  void count_check() {
    std::lock_guard lock(mu_);
    ++checks_;
  }

  // The median over iterations of the slowest rank's time: a collective is
  // done when its last rank is.
  static double median_of_max(const std::vector<std::vector<double>>& per_rank) {
    std::vector<double> worst(per_rank.front().size(), 0.0);
    for (const auto& r : per_rank)
      for (std::size_t i = 0; i < worst.size() && i < r.size(); ++i) worst[i] = std::max(worst[i], r[i]);
    std::sort(worst.begin(), worst.end());
    return worst[worst.size() / 2];
  }

  const std::map<std::pair<Coll, std::size_t>, std::vector<std::vector<double>>>& times() const { return times_; }
  const std::vector<std::string>& failures() const { return failures_; }
  int checks() const { return checks_; }

 private:
  std::mutex mu_;
  std::map<std::pair<Coll, std::size_t>, std::vector<std::vector<double>>> times_;
  std::vector<std::string> failures_;
  int checks_ = 0;
};

struct HostBackend {
  template <class T>
  class Buffer {
   public:
    explicit Buffer(std::size_t n) : data_(n) {}
    std::span<T> span(std::size_t n) { return std::span<T>(data_).first(n); }
    void upload(const std::vector<T>& host) { std::copy(host.begin(), host.end(), data_.begin()); }
    std::vector<T> download(std::size_t n) const {
      return {data_.begin(), data_.begin() + static_cast<std::ptrdiff_t>(n)};
    }

   private:
    std::vector<T> data_;
  };

  template <class Comm, class Issue>
  static double time_us(Comm&, Issue&& issue) {
    const auto t0 = std::chrono::steady_clock::now();
    issue().wait();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  template <class Work>
  static void finish(Work&& w) {
    w.wait();
  }
};

#if DTRAIN_HAS_CUDA
struct CudaBackend {
  template <class T>
  class Buffer {
   public:
    explicit Buffer(std::size_t n) {
      cuda_check(cudaMalloc(&data_, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { cudaFree(data_); }
    std::span<T> span(std::size_t n) { return {data_, n}; }
    void upload(const std::vector<T>& host) {
      cuda_check(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
      // The communicator's stream does not wait for cudaMemcpy's legacy stream.
      cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    std::vector<T> download(std::size_t n) const {
      std::vector<T> host(n);
      cuda_check(cudaMemcpy(host.data(), data_, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
      return host;
    }

   private:
    T* data_ = nullptr;
  };

  // GPU time between events around the collective on its stream, so host
  // launch overhead and polling do not count.
  template <class Comm, class Issue>
  static double time_us(Comm& comm, Issue&& issue) {
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
    cuda_check(cudaEventRecord(start, comm.stream()), "cudaEventRecord");
    NcclWork w = issue();
    cuda_check(cudaEventRecord(stop, comm.stream()), "cudaEventRecord");
    w.synchronize();
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return static_cast<double>(ms) * 1000.0;
  }
  template <class Work>
  static void finish(Work&& w) {
    w.synchronize();
  }
};
#endif

// One rank's part: checks (and optionally times) one collective at one size.
template <class Backend, class Comm, class T>
class RankRunner {
 public:
  RankRunner(Comm& comm, Report& report, const Options& opt, std::size_t max_elems)
      : comm_(comm), report_(report), opt_(opt), in_(max_elems), out_(max_elems) {}

  // `total`: elements of the larger buffer (the all_gather output, the
  // reduce_scatter input); a multiple of the world size.
  void check(Coll c, std::size_t total) {
    const int n = comm_.size();
    const int rank = comm_.rank();
    const std::size_t chunk = total / static_cast<std::size_t>(n);
    in_.upload(inputs(rank, c == Coll::all_gather ? chunk : total));
    Backend::finish(issue(c, total));
    const std::size_t got_n = c == Coll::reduce_scatter ? chunk : total;
    const std::vector<T> got =
        c == Coll::reduce_scatter || c == Coll::all_gather ? out_.download(got_n) : in_.download(got_n);
    for (std::size_t i = 0; i < got_n; ++i) {
      const double expect = expected(c, rank, i, chunk);
      const double g = static_cast<float>(got[i]);
      const double tol =
          (c == Coll::all_gather || c == Coll::broadcast) ? 0.0 : (n + 1) * dtype_traits<T>::epsilon * expect;
      if (std::abs(g - expect) <= tol) continue;
      report_.fail("rank " + std::to_string(rank) + ": " + info(c).name + " " + info(c).op + " " +
                   std::string(dtype_traits<T>::name) + " of " + std::to_string(total) + " elements: element " +
                   std::to_string(i) + " is " + std::to_string(g) + ", expected " + std::to_string(expect));
      return;
    }
    report_.count_check();
  }

  // `total` is unused for the barrier.
  void time(Coll c, std::size_t total) {
    for (int i = 0; i < opt_.warmup; ++i) Backend::finish(issue(c, total));
    std::vector<double> us;
    for (int i = 0; i < opt_.iters; ++i) us.push_back(Backend::time_us(comm_, [&] { return issue(c, total); }));
    report_.time(c, total * sizeof(T), comm_.rank(), std::move(us));
  }

 private:
  auto issue(Coll c, std::size_t total) {
    const std::size_t chunk = total / static_cast<std::size_t>(comm_.size());
    switch (c) {
      case Coll::all_reduce_sum: return comm_.all_reduce(in_.span(total), reduce_op::sum);
      case Coll::all_reduce_avg: return comm_.all_reduce(in_.span(total), reduce_op::avg);
      case Coll::reduce_scatter:
        return comm_.reduce_scatter(std::span<const T>(in_.span(total)), out_.span(chunk), reduce_op::sum);
      case Coll::all_gather: return comm_.all_gather(std::span<const T>(in_.span(chunk)), out_.span(total));
      case Coll::broadcast: return comm_.broadcast(in_.span(total), 0);
      case Coll::barrier: break;
    }
    return comm_.barrier();
  }

  static std::vector<T> inputs(int rank, std::size_t n) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = pattern<T>(rank, i);
    return v;
  }

  // The float64 value element i of this rank's result must have.
  double expected(Coll c, int rank, std::size_t i, std::size_t chunk) const {
    const int n = comm_.size();
    auto value = [](int r, std::size_t j) { return static_cast<double>(static_cast<float>(pattern<T>(r, j))); };
    auto sum = [&](std::size_t j) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += value(r, j);
      return s;
    };
    switch (c) {
      case Coll::all_reduce_sum: return sum(i);
      case Coll::all_reduce_avg: return sum(i) / n;
      case Coll::reduce_scatter: return sum(static_cast<std::size_t>(rank) * chunk + i);
      case Coll::all_gather: return value(static_cast<int>(i / chunk), i % chunk);
      case Coll::broadcast: return value(0, i);
      case Coll::barrier: break;
    }
    return 0;
  }

  Comm& comm_;
  Report& report_;
  const Options& opt_;
  typename Backend::template Buffer<T> in_;
  typename Backend::template Buffer<T> out_;
};

// Message sizes: 8 B growing 4x up to --max-bytes (always included).
std::vector<std::size_t> sizes(std::size_t max_bytes) {
  std::vector<std::size_t> s;
  for (std::size_t b = 8; b < max_bytes; b *= 4) s.push_back(b);
  s.push_back(max_bytes);
  return s;
}

// Elements of the larger buffer for `bytes`: rounded down to a multiple of
// the world size, at least one element per rank.
std::size_t total_elems(std::size_t bytes, std::size_t elem, int n) {
  const auto ranks = static_cast<std::size_t>(n);
  return std::max<std::size_t>(bytes / elem / ranks, 1) * ranks;
}

template <class Backend, class Comm>
void run_rank(Comm& comm, Report& report, const Options& opt) {
  const int n = comm.size();
  // Every dtype, every collective, an odd length: the narrow types' paths.
  const std::size_t odd = 1027 * static_cast<std::size_t>(n);
  auto check_dtype = [&]<class T>(T*) {
    RankRunner<Backend, Comm, T> runner(comm, report, opt, odd);
    for (const Coll c : all_colls) runner.check(c, odd);
  };
  check_dtype(static_cast<bf16*>(nullptr));
  check_dtype(static_cast<fp16*>(nullptr));
  check_dtype(static_cast<float*>(nullptr));

  RankRunner<Backend, Comm, float> runner(comm, report, opt, total_elems(opt.max_bytes, sizeof(float), n));
  for (const std::size_t bytes : sizes(opt.max_bytes)) {
    const std::size_t total = total_elems(bytes, sizeof(float), n);
    for (const Coll c : all_colls) {
      runner.check(c, total);
      runner.time(c, total);
    }
  }
  runner.time(Coll::barrier, 0);
  Backend::finish(comm.barrier());
}

// Runs `rank_main(r)` on one thread per rank; an exception becomes a failure.
void run_threads(int n, Report& report, const std::function<void(int)>& rank_main) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        rank_main(r);
      } catch (const std::exception& e) {
        report.fail("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  for (auto& t : threads) t.join();
}

void print_table(const Report& report, int n) {
  std::printf("\n%14s %12s %6s %-15s %-4s %12s %12s %12s\n", "size(B)", "count", "type", "collective", "op", "time(us)",
              "algbw(GB/s)", "busbw(GB/s)");
  for (const Coll c : all_colls)
    for (const auto& [key, per_rank] : report.times()) {
      if (key.first != c) continue;
      const double us = Report::median_of_max(per_rank);
      const double algbw = static_cast<double>(key.second) / us / 1e3;
      std::printf("%14zu %12zu %6s %-15s %-4s %12.1f %12.3f %12.3f\n", key.second, key.second / sizeof(float), "fp32",
                  info(c).name, info(c).op, us, algbw, algbw * bus_factor(c, n));
    }
  if (const auto it = report.times().find({Coll::barrier, 0}); it != report.times().end())
    std::printf("%14d %12d %6s %-15s %-4s %12.1f %12s %12s\n", 0, 0, "-", "barrier", "-",
                Report::median_of_max(it->second), "-", "-");
}

int finish(const Report& report, int n) {
  print_table(report, n);
  if (report.failures().empty()) {
    std::printf("\nall %d checks passed (5 collectives x every size, and bf16/fp16/fp32 at an odd length)\n",
                report.checks());
    return 0;
  }
  std::printf("\n%zu check(s) FAILED:\n", report.failures().size());
  for (const auto& f : report.failures()) std::printf("  %s\n", f.c_str());
  return 1;
}

std::optional<std::string> getenv_lookup(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// The collective timeout in force and where it comes from: --timeout, else
// DTRAIN_COMM_TIMEOUT_S (read as a launched job reads it), else the default.
std::pair<double, const char*> timeout_in_force(const Options& opt) {
  if (opt.timeout_s) return {*opt.timeout_s, "--timeout"};
  if (const auto env = detail::read_comm_timeout(getenv_lookup)) return {*env, "DTRAIN_COMM_TIMEOUT_S"};
  return {std::chrono::duration<double>(CommOptions{}.timeout).count(), "default"};
}

// The timeout in force; the host transport and shared-memory waiting from
// DTRAIN_HOST_TRANSPORT / DTRAIN_SHM_WAIT / DTRAIN_SHM_CHUNK_KIB, as a
// launched job reads them.
CommOptions comm_options(const Options& opt) {
  CommOptions o{.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout_in_force(opt).first * 1000))};
  LaunchEnv env;
  detail::read_comm_choices(getenv_lookup, env);
  o.host = env.host.value_or(o.host);
  o.wait = env.wait.value_or(o.wait);
  o.shm_part_bytes = env.shm_part_bytes.value_or(o.shm_part_bytes);
  return o;
}

void print_timeout(const Options& opt) {
  const auto [seconds, source] = timeout_in_force(opt);
  std::printf(
      "\ncollective timeout  %g s (%s; a job takes timeout_s=, DTRAIN_COMM_TIMEOUT_S or CommOptions::timeout)\n",
      seconds, source);
}

int run_host(const Options& opt) {
  const int n = opt.ranks.value_or(2);
  Report report;
  auto worlds = make_local_worlds(n, comm_options(opt));
  run_threads(n, report, [&](int r) {
    HostCommunicator comm(worlds[static_cast<std::size_t>(r)]);
    if (r == 0) {
      std::printf("\nhost transport  %s\n", comm.description().c_str());
      std::printf(
          "collectives     %d CPU ranks (threads of this process), median of %d iterations after %d "
          "warmup, slowest rank\n",
          n, opt.iters, opt.warmup);
      std::fflush(stdout);
    }
    run_rank<HostBackend>(comm, report, opt);
  });
  return finish(report, n);
}

#if DTRAIN_HAS_CUDA
int run_gpus(const Options& opt, int gpus) {
  const int n = opt.ranks.value_or(gpus);
  if (n > gpus) throw usage_error{"--ranks " + std::to_string(n) + ": only " + std::to_string(gpus) + " GPUs"};
  std::printf(
      "\ncollectives     NCCL, %d GPUs (one thread each), median of %d iterations after %d warmup, "
      "slowest rank\n",
      n, opt.iters, opt.warmup);
  std::fflush(stdout);
  Report report;
  auto worlds = make_local_worlds(n, comm_options(opt));
  run_threads(n, report, [&](int r) {
    cuda_check(cudaSetDevice(r), "cudaSetDevice");
    NcclCommunicator comm(worlds[static_cast<std::size_t>(r)], r);
    run_rank<CudaBackend>(comm, report, opt);
  });
  return finish(report, n);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse(argc, argv);
    print_host();
#if DTRAIN_HAS_CUDA
    const int gpus = print_cuda();
    print_environment();
    print_timeout(opt);
    if (gpus > 0 && !opt.host) return run_gpus(opt, gpus);
#else
    std::printf("\nCUDA            not compiled in (dtrain built without CUDA/NCCL)\n");
    print_environment();
    print_timeout(opt);
#endif
    return run_host(opt);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "dtrain-doctor: %s\n\n%s", e.what.c_str(), usage.data());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtrain-doctor: %s\n", e.what());
    return 1;
  }
}
