// Host collective bandwidth of dtrain's HostCommunicator, one process per
// rank (launch with dtrain-run, torchrun, srun or mpirun): all_reduce,
// reduce_scatter, all_gather and broadcast of fp32 from 1 MiB to 256 MiB,
// over the transport --transport picks (auto, shm or gloo). It also measures
// the copy bandwidth the shared-memory bound is stated in: every rank at
// once memcpy()s a 64 MiB buffer into another (both private, first-touched),
// median of 9, reported as bytes copied per second per rank (the slowest).
// bench/torch_gloo_bandwidth.py measures PyTorch the same way and
// bench/run_comm_bench.sh runs both and compares them.
//
// Method (identical in the Python script): message size = the larger buffer
// (all_gather output, reduce_scatter input), as nccl-tests counts it; a
// barrier before every timed iteration so ranks start together; per rank the
// median over iterations; reported, the slowest rank's median. The iteration
// count depends only on the size, so every rank runs the same sequence.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <dtrain/backend/host/comm.hpp>
#include <dtrain/launch/init.hpp>

namespace {

using namespace dtrain;

struct Options {
  std::size_t min_bytes = std::size_t{1} << 20;
  std::size_t max_bytes = std::size_t{256} << 20;
  std::string json;  // rank 0 writes the results here when set
  std::string transport = "auto";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc)
      throw config_error(
          "usage: bench_comm_bandwidth [--min-mib N] [--max-mib N] [--json PATH] [--transport auto|shm|gloo]");
    const std::string value = argv[++i];
    if (arg == "--min-mib")
      o.min_bytes = std::stoull(value) << 20;
    else if (arg == "--max-mib")
      o.max_bytes = std::stoull(value) << 20;
    else if (arg == "--json")
      o.json = value;
    else if (arg == "--transport")
      o.transport = value;
    else
      throw config_error("unknown option " + std::string(arg),
                         "usage: bench_comm_bandwidth [--min-mib N] [--max-mib N] [--json PATH]");
  }
  return o;
}

// Few iterations for large messages keep the run short on a small machine;
// the median of 5 is still robust to one outlier.
int iterations(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{512} << 20) / bytes, 5, 20));
}

// nccl-tests' bus bandwidth factors.
double bus_factor(std::string_view coll, int n) {
  if (coll == "all_reduce") return 2.0 * (n - 1) / n;
  if (coll == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

struct Row {
  std::string collective;
  std::size_t bytes;
  int iters;
  double time_us;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Issue>
double time_collective(HostCommunicator& comm, int iters, Issue&& issue) {
  issue().wait();  // warm-up: first-touch of the buffers, connection buffers
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    comm.barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    issue().wait();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(std::move(us));
}

// memcpy GB/s of this rank while every rank copies at the same time.
double copy_gbps(HostCommunicator& comm) {
  const std::size_t bytes = std::size_t{64} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> gbps;
  for (int i = 0; i < 9; ++i) {
    comm.barrier().wait();
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gbps.push_back(static_cast<double>(bytes) / s / 1e9);
  }
  return median(std::move(gbps));
}

std::string to_json(const std::vector<Row>& rows, int n, const HostCommunicator& comm, double copy) {
  char head[512];
  std::snprintf(head, sizeof head,
                "{\"implementation\": \"dtrain %s\", \"transport\": \"%s\", \"world_size\": %d, "
                "\"copy_gbps_per_rank\": %.3f, \"dtype\": \"fp32\", \"results\": [",
                std::string(comm.transport()).c_str(), comm.description().c_str(), n, copy);
  std::string out = head;
  char line[256];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double algbw = static_cast<double>(r.bytes) / r.time_us / 1e3;
    std::snprintf(line, sizeof line,
                  "%s\n  {\"collective\": \"%s\", \"bytes\": %zu, \"iters\": %d, \"time_us\": %.1f, "
                  "\"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f}",
                  i ? "," : "", r.collective.c_str(), r.bytes, r.iters, r.time_us, algbw,
                  algbw * bus_factor(r.collective, n));
    out += line;
  }
  return out + "\n]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse(argc, argv);
    World world = init();
    if (opt.transport != "auto" && opt.transport != "shm" && opt.transport != "gloo")
      throw config_error("--transport " + opt.transport + " is not auto, shm or gloo");
    HostCommunicator comm(world, opt.transport == "shm"    ? host_transport::shm
                                 : opt.transport == "gloo" ? host_transport::gloo
                                                           : world.options().host);
    double copy = copy_gbps(comm);
    const int n = comm.size();
    std::vector<float> in(opt.max_bytes / sizeof(float), 1.0f);
    std::vector<float> out(opt.max_bytes / sizeof(float), 0.0f);
    std::vector<Row> rows;
    for (std::size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= 4) {
      const std::size_t total = bytes / sizeof(float);
      const auto n_ranks = static_cast<std::size_t>(n);
      const std::size_t chunk = total / n_ranks;  // reduce_scatter / all_gather use chunk x n elements
      const std::span<float> whole(in.data(), total);
      const int iters = iterations(bytes);
      // Sums grow by n per iteration; at most ~25 iterations of n = 2 stay
      // far from fp32 overflow, and the values do not affect the timing.
      rows.push_back({"all_reduce", bytes, iters,
                      time_collective(comm, iters, [&] { return comm.all_reduce(whole, reduce_op::sum); })});
      rows.push_back({"reduce_scatter", bytes, iters, time_collective(comm, iters, [&] {
                        return comm.reduce_scatter(std::span<const float>(whole).first(chunk * n_ranks),
                                                   std::span<float>(out).first(chunk), reduce_op::sum);
                      })});
      rows.push_back({"all_gather", bytes, iters, time_collective(comm, iters, [&] {
                        return comm.all_gather(std::span<const float>(in).first(chunk),
                                               std::span<float>(out).first(chunk * n_ranks));
                      })});
      rows.push_back(
          {"broadcast", bytes, iters, time_collective(comm, iters, [&] { return comm.broadcast(whole, 0); })});
    }
    // The slowest rank's median: gather every rank's medians through the store.
    // (the copy bandwidth first, then each row's time)
    std::vector<double> mine{copy};
    for (const Row& r : rows) mine.push_back(r.time_us);
    for (const std::vector<double>& theirs : world.all_gather("bench_times", mine)) {
      copy = std::min(copy, theirs[0]);
      for (std::size_t i = 0; i < rows.size(); ++i) rows[i].time_us = std::max(rows[i].time_us, theirs[i + 1]);
    }
    comm.barrier().wait();
    if (comm.rank() != 0) return 0;
    const std::string json = to_json(rows, n, comm, copy);
    if (opt.json.empty()) {
      std::fputs(json.c_str(), stdout);
    } else {
      std::ofstream(opt.json) << json;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm_bandwidth: %s\n", e.what());
    return 1;
  }
}
