// Many ranks on one machine: what bench/run_scale_bench.sh measures at 8, 16
// and 32 ranks (shared memory on one node, Gloo over TCP between two network
// namespaces). Three modes:
//
//   bench_scale_probe ranks [--transport auto|shm|gloo] [--sizes B,B..] [--json PATH]
//     One process per rank under dtrain-run. Each rank reports its
//     rendezvous time: from the process's start (/proc/self/stat, 10 ms
//     ticks) to init()'s World, and to its HostCommunicator ready (every
//     rank connected); then checks every collective's result against what
//     one rank computes (all_reduce, reduce_scatter, all_gather, broadcast on
//     small integers, exact in fp32) and times each of them and barrier at
//     each size in bytes (fp32; the size is the larger buffer, as
//     bench_comm_bandwidth counts it): a barrier before each timed
//     iteration, the median per rank, the slowest rank's median reported.
//     Rank 0 writes the JSON (per-rank rendezvous times too).
//   bench_scale_probe store [--clients N] [--ops K] [--json PATH]
//     N threads, each its own TcpStore client of one TcpStoreServer in this
//     process (with a job token: connecting includes its handshake), each doing K rounds of set / get (its own key
//     back, checked) / add (one shared counter) and at the end a get of every other client's last key; the wall time
//     for all of them, per-operation latency percentiles, and the checks (the counter must be N x K).
//   bench_scale_probe compare A.safetensors B.safetensors
//     The largest |a - b| / max(1, |b|) over every tensor (the strategy
//     tests' relative difference, tests/strategy/common.hpp), printed as
//     "max_rel_diff X at NAME[i]"; exit 1 when the tensor sets differ.

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <dtrain/backend/host/comm.hpp>
#include <dtrain/comm/store.hpp>
#include <dtrain/io/safetensors.hpp>
#include <dtrain/launch/init.hpp>

namespace {

using namespace dtrain;
using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

// Milliseconds since this process started, by the kernel's record of its
// start (boot-time clock ticks) against CLOCK_BOOTTIME now.
double ms_since_process_start() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  // Fields after the name start at 3 (state); starttime is field 22.
  for (int f = 3; f < 22 && rest >> field; ++f) {
  }
  unsigned long long ticks = 0;
  if (!(rest >> ticks)) return -1;
  timespec now{};
  ::clock_gettime(CLOCK_BOOTTIME, &now);
  const double now_ms = static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
  return now_ms - static_cast<double>(ticks) * 1e3 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::string value_after(int argc, char** argv, int& i, std::string_view usage) {
  if (i + 1 >= argc) throw config_error(std::string(argv[i]) + " needs a value", std::string(usage));
  return argv[++i];
}

// ---------------------------------------------------------------- ranks

constexpr std::string_view ranks_usage =
    "usage: bench_scale_probe ranks [--transport auto|shm|gloo] [--sizes BYTES,BYTES..] [--json PATH]";

// Rank r's input element i: small integers, so every sum is exact in fp32
// and the result equals one rank's computation bit for bit.
float input(int r, std::size_t i) { return static_cast<float>(r + 1) + static_cast<float>(i % 5); }

// Checks each collective once against the sums one rank computes; returns
// the number of wrong elements (0 when all is right).
std::size_t check_collectives(HostCommunicator& comm, std::size_t total) {
  const int n = comm.size(), me = comm.rank();
  const auto nn = static_cast<std::size_t>(n);
  const float rank_sum = static_cast<float>(n) * static_cast<float>(n + 1) / 2;
  const std::size_t chunk = total / nn;
  std::size_t wrong = 0;
  std::vector<float> buf(total), out(total);
  for (std::size_t i = 0; i < total; ++i) buf[i] = input(me, i);
  comm.all_reduce(std::span<float>(buf), reduce_op::sum).wait();
  for (std::size_t i = 0; i < total; ++i)
    wrong += buf[i] != rank_sum + static_cast<float>(n) * static_cast<float>(i % 5);
  for (std::size_t i = 0; i < total; ++i) buf[i] = input(me, i);
  comm.reduce_scatter(std::span<const float>(buf).first(chunk * nn), std::span<float>(out).first(chunk), reduce_op::sum)
      .wait();
  for (std::size_t j = 0; j < chunk; ++j)
    wrong +=
        out[j] != rank_sum + static_cast<float>(n) * static_cast<float>((static_cast<std::size_t>(me) * chunk + j) % 5);
  comm.all_gather(std::span<const float>(buf).first(chunk), std::span<float>(out).first(chunk * nn)).wait();
  for (std::size_t q = 0; q < nn; ++q)
    for (std::size_t j = 0; j < chunk; ++j) wrong += out[q * chunk + j] != input(static_cast<int>(q), j);
  comm.broadcast(std::span<float>(buf), 0).wait();
  for (std::size_t i = 0; i < total; ++i) wrong += buf[i] != input(0, i);
  return wrong;
}

template <class Issue>
double time_ms(HostCommunicator& comm, int iters, Issue&& issue) {
  issue().wait();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    comm.barrier().wait();
    const auto t0 = clock_type::now();
    issue().wait();
    ms.push_back(ms_since(t0));
  }
  return median(std::move(ms));
}

int iterations(std::size_t bytes, int n) {
  // Short on 2 cores with 32 ranks: fewer for big messages and big worlds,
  // never under 5 (the median of 5 stands one outlier).
  const int base = bytes <= (std::size_t{64} << 10) ? 20 : 7;
  return std::max(5, n >= 16 ? base / 2 : base);
}

struct RankReport {
  double start_to_world_ms = 0;
  double start_to_comm_ms = 0;
  double main_to_comm_ms = 0;
};

int run_ranks(int argc, char** argv) {
  const auto main_t0 = clock_type::now();
  const double started_ms = ms_since_process_start();  // the process's age at main()
  std::string transport = "auto", json;
  std::vector<std::size_t> sizes{4096, std::size_t{4} << 20};
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--transport") {
      transport = value_after(argc, argv, i, ranks_usage);
    } else if (arg == "--json") {
      json = value_after(argc, argv, i, ranks_usage);
    } else if (arg == "--sizes") {
      sizes.clear();
      std::stringstream list(value_after(argc, argv, i, ranks_usage));
      for (std::string s; std::getline(list, s, ',');) sizes.push_back(std::stoull(s));
    } else {
      throw config_error("unknown option " + std::string(arg), std::string(ranks_usage));
    }
  }
  if (transport != "auto" && transport != "shm" && transport != "gloo")
    throw config_error("--transport " + transport + " is not auto, shm or gloo", std::string(ranks_usage));

  World world = init();
  RankReport me;
  me.start_to_world_ms = started_ms + ms_since(main_t0);
  HostCommunicator comm(world, transport == "shm"    ? host_transport::shm
                               : transport == "gloo" ? host_transport::gloo
                                                     : world.options().host);
  me.main_to_comm_ms = ms_since(main_t0);
  me.start_to_comm_ms = started_ms + me.main_to_comm_ms;
  const int n = comm.size();
  const auto nn = static_cast<std::size_t>(n);

  struct Row {
    std::string collective;
    std::size_t bytes;
    int iters;
    double ms;
  };
  std::vector<Row> rows;
  std::size_t wrong = 0;
  std::vector<float> in, out;
  for (std::size_t bytes : sizes) {
    const std::size_t total = bytes / sizeof(float) / nn * nn;  // divisible into n chunks
    const std::size_t chunk = total / nn;
    wrong += check_collectives(comm, total);
    in.assign(total, 1.0f);
    out.assign(total, 0.0f);
    const std::span<float> whole(in);
    const int iters = iterations(bytes, n);
    rows.push_back(
        {"all_reduce", bytes, iters, time_ms(comm, iters, [&] { return comm.all_reduce(whole, reduce_op::sum); })});
    rows.push_back({"reduce_scatter", bytes, iters, time_ms(comm, iters, [&] {
                      return comm.reduce_scatter(std::span<const float>(in).first(chunk * nn),
                                                 std::span<float>(out).first(chunk), reduce_op::sum);
                    })});
    rows.push_back({"all_gather", bytes, iters, time_ms(comm, iters, [&] {
                      return comm.all_gather(std::span<const float>(in).first(chunk),
                                             std::span<float>(out).first(chunk * nn));
                    })});
    rows.push_back({"broadcast", bytes, iters, time_ms(comm, iters, [&] { return comm.broadcast(whole, 0); })});
  }
  rows.push_back({"barrier", 0, 20, time_ms(comm, 20, [&] { return comm.barrier(); })});

  std::vector<double> mine{me.start_to_world_ms, me.start_to_comm_ms, me.main_to_comm_ms, static_cast<double>(wrong)};
  for (const Row& r : rows) mine.push_back(r.ms);
  const auto all = world.all_gather("scale_probe", mine);
  comm.barrier().wait();
  if (comm.rank() != 0) return 0;

  std::vector<double> world_ms, comm_ms, main_ms;
  double wrong_total = 0;
  for (const auto& theirs : all) {
    world_ms.push_back(theirs[0]);
    comm_ms.push_back(theirs[1]);
    main_ms.push_back(theirs[2]);
    wrong_total += theirs[3];
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i].ms = std::max(rows[i].ms, theirs[i + 4]);
  }
  auto list = [](const std::vector<double>& v) {
    std::string s = "[";
    char b[32];
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::snprintf(b, sizeof b, "%s%.2f", i ? ", " : "", v[i]);
      s += b;
    }
    return s + "]";
  };
  auto stat = [&](const char* name, const std::vector<double>& v) {
    char b[160];
    std::snprintf(b, sizeof b, "\"%s\": {\"median_ms\": %.2f, \"max_ms\": %.2f, \"per_rank_ms\": ", name, median(v),
                  *std::max_element(v.begin(), v.end()));
    return std::string(b) + list(v) + "}";
  };
  std::string text = "{\"world_size\": " + std::to_string(n) + ", \"transport\": \"" + std::string(comm.transport()) +
                     "\", \"description\": \"" + comm.description() +
                     "\", \"wrong_elements\": " + std::to_string(static_cast<long long>(wrong_total)) +
                     ",\n \"rendezvous\": {" + stat("start_to_world", world_ms) + ",\n  " +
                     stat("start_to_communicator", comm_ms) + ",\n  " + stat("main_to_communicator", main_ms) +
                     "},\n \"collectives\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    char b[256];
    std::snprintf(b, sizeof b, "%s\n  {\"collective\": \"%s\", \"bytes\": %zu, \"iters\": %d, \"time_ms\": %.4f}",
                  i ? "," : "", rows[i].collective.c_str(), rows[i].bytes, rows[i].iters, rows[i].ms);
    text += b;
  }
  text += "\n]}\n";
  if (json.empty())
    std::fputs(text.c_str(), stdout);
  else
    std::ofstream(json) << text;
  if (wrong_total != 0) {
    std::fprintf(stderr, "bench_scale_probe: %lld collective result elements differ from one rank's\n",
                 static_cast<long long>(wrong_total));
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------- store

int run_store(int argc, char** argv) {
  constexpr std::string_view usage = "usage: bench_scale_probe store [--clients N] [--ops K] [--json PATH]";
  int clients = 256, ops = 50;
  std::string json;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--clients")
      clients = std::stoi(value_after(argc, argv, i, usage));
    else if (arg == "--ops")
      ops = std::stoi(value_after(argc, argv, i, usage));
    else if (arg == "--json")
      json = value_after(argc, argv, i, usage);
    else
      throw config_error("unknown option " + std::string(arg), std::string(usage));
  }
  if (clients < 1 || ops < 1) throw config_error("--clients and --ops must be positive", std::string(usage));
  // With a job token, as every job has: connecting includes the handshake.
  const std::string token = new_job_token();
  TcpStoreServer server(0, "127.0.0.1", token);
  const auto timeout = std::chrono::seconds(120);
  std::atomic<int> errors{0}, ready{0};
  std::atomic<bool> go{false};
  std::mutex mu;
  std::string first_error;
  std::vector<std::vector<double>> latency_us(static_cast<std::size_t>(clients));
  std::vector<double> connect_ms(static_cast<std::size_t>(clients));
  auto fail = [&](const std::string& why) {
    errors.fetch_add(1);
    std::lock_guard lock(mu);
    if (first_error.empty()) first_error = why;
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(clients));
  const auto t_connect = clock_type::now();
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      try {
        const auto t0 = clock_type::now();
        TcpStore store("127.0.0.1", server.port(), timeout, token);
        connect_ms[static_cast<std::size_t>(c)] = ms_since(t0);
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        auto& lat = latency_us[static_cast<std::size_t>(c)];
        lat.reserve(static_cast<std::size_t>(3 * ops));
        const std::string mine = "client/" + std::to_string(c) + "/";
        for (int k = 0; k < ops; ++k) {
          const std::string key = mine + std::to_string(k), value = std::to_string(c * 1000003 + k);
          auto t = clock_type::now();
          store.set(key, value);
          lat.push_back(ms_since(t) * 1e3);
          t = clock_type::now();
          const std::string back = store.get(key);
          lat.push_back(ms_since(t) * 1e3);
          if (back != value) fail("client " + std::to_string(c) + " read " + back + " for " + key);
          t = clock_type::now();
          store.add("counter", 1);
          lat.push_back(ms_since(t) * 1e3);
        }
        // Every other client's last key: waits until that client got there.
        for (int o = 0; o < clients; o += std::max(1, clients / 16)) {
          const std::string want = std::to_string(o * 1000003 + ops - 1);
          const std::string got = store.get("client/" + std::to_string(o) + "/" + std::to_string(ops - 1));
          if (got != want) fail("client " + std::to_string(c) + " read " + got + " for client " + std::to_string(o));
        }
      } catch (const std::exception& e) {
        ready.fetch_add(1);
        fail("client " + std::to_string(c) + ": " + e.what());
      }
    });
  while (ready.load() < clients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double connect_all_ms = ms_since(t_connect);
  const auto t0 = clock_type::now();
  go.store(true);
  for (auto& t : threads) t.join();
  const double wall_ms = ms_since(t0);
  std::int64_t counter = -1;
  try {
    TcpStore check("127.0.0.1", server.port(), timeout, token);
    counter = check.add("counter", 0);
  } catch (const std::exception& e) {
    fail(std::string("final check: ") + e.what());
  }
  if (counter != static_cast<std::int64_t>(clients) * ops)
    fail("counter " + std::to_string(counter) + " != " + std::to_string(static_cast<std::int64_t>(clients) * ops));
  std::vector<double> all;
  for (const auto& l : latency_us) all.insert(all.end(), l.begin(), l.end());
  const double total_ops = static_cast<double>(all.size());
  char text[1024];
  std::snprintf(text, sizeof text,
                "{\"clients\": %d, \"rounds_per_client\": %d, \"ops_per_round\": \"set, get, add\", "
                "\"operations\": %.0f, \"errors\": %d, \"counter\": %lld, \"connect_all_ms\": %.2f, "
                "\"connect_max_ms\": %.2f, \"wall_ms\": %.2f, \"ops_per_s\": %.0f, \"latency_us\": {\"p50\": %.1f, "
                "\"p99\": %.1f, \"max\": %.1f}}\n",
                clients, ops, total_ops, errors.load(), static_cast<long long>(counter), connect_all_ms,
                *std::max_element(connect_ms.begin(), connect_ms.end()), wall_ms, total_ops / (wall_ms / 1e3),
                percentile(all, 0.5), percentile(all, 0.99), all.empty() ? 0.0 : percentile(all, 1.0));
  if (json.empty())
    std::fputs(text, stdout);
  else
    std::ofstream(json) << text;
  if (errors.load() != 0) {
    std::fprintf(stderr, "bench_scale_probe store: %d errors, the first: %s\n", errors.load(), first_error.c_str());
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------- compare

int run_compare(int argc, char** argv) {
  if (argc != 4) throw config_error("usage: bench_scale_probe compare A.safetensors B.safetensors");
  const auto a = SafetensorsFile::open(argv[2]), b = SafetensorsFile::open(argv[3]);
  std::vector<std::string> na = a.names(), nb = b.names();
  std::sort(na.begin(), na.end());
  std::sort(nb.begin(), nb.end());
  if (na != nb || na.empty()) {
    std::fprintf(stderr, "bench_scale_probe compare: %s and %s hold different tensors\n", argv[2], argv[3]);
    return 1;
  }
  double worst = 0;
  std::string where = "-";
  for (const auto& name : na) {
    const auto va = a.read_f32(name), vb = b.read_f32(name);
    if (va.size() != vb.size()) {
      std::fprintf(stderr, "bench_scale_probe compare: %s has %zu vs %zu elements\n", name.c_str(), va.size(),
                   vb.size());
      return 1;
    }
    for (std::size_t i = 0; i < va.size(); ++i) {
      double d = std::abs(static_cast<double>(va[i]) - vb[i]) / std::max(1.0, std::abs(static_cast<double>(vb[i])));
      if (std::isnan(d)) d = INFINITY;
      if (d > worst) worst = d, where = name + "[" + std::to_string(i) + "]";
    }
  }
  std::printf("max_rel_diff %.3e at %s\n", worst, where.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string_view mode = argc > 1 ? argv[1] : "";
    if (mode == "ranks") return run_ranks(argc, argv);
    if (mode == "store") return run_store(argc, argv);
    if (mode == "compare") return run_compare(argc, argv);
    throw config_error("usage: bench_scale_probe ranks|store|compare ...");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_scale_probe: %s\n", e.what());
    return 1;
  }
}
