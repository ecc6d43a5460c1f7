// The optimizer pass with its state in files on a disk (offload=nvme:DIR,
// offload/arena.hpp) against the same pass with the state in memory, in
// one process: AdamW over n fp32 elements whose two moments live in files in
// --dir, every pass made to read them from the disk and write them back
// (after_state_pass(true): the writes finished and the page cache dropped),
// the way a state larger than the memory is met. Reports the median pass and
// the state's disk traffic per second (2 buffers x 4 bytes x n, read and
// written: 16 n bytes per pass); bench/run_offload_bench.sh sets it beside
// dd's direct-I/O figures for the same directory.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <dtrain/backend/host/device.hpp>
#include <dtrain/backend/host/offload.hpp>
#include <dtrain/model/init.hpp>
#include <dtrain/offload/arena.hpp>
#include <dtrain/optim/flat_optimizer.hpp>

namespace {

using namespace dtrain;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median ms of `iters` passes after one untimed pass.
template <class F>
double median_ms(int iters, F&& pass) {
  pass();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(std::move(ms));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string dir, json;
    std::size_t n = 50'000'000;
    int iters = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string a = argv[i], v = argv[i + 1];
      if (a == "--dir")
        dir = v;
      else if (a == "--elements-m")
        n = static_cast<std::size_t>(std::stod(v) * 1e6);
      else if (a == "--iters")
        iters = std::max(1, std::stoi(v));
      else if (a == "--json")
        json = v;
      else
        throw config_error("unknown argument '" + a + "'",
                           "usage: bench_state_disk --dir DIR [--elements-m N] [--iters K] [--json PATH]");
    }
    if (dir.empty())
      throw config_error("no --dir", "usage: bench_state_disk --dir DIR [--elements-m N] [--iters K] [--json PATH]");
    Host dev;
    OffloadArena<Host> arena(dev, offload_kind::optimizer);
    arena.use_state_dir(dir);
    std::vector<float> master(n), grad(n);
    init_values(std::span<float>(master), Init::uniform(-1.f, 1.f), 1);
    init_values(std::span<float>(grad), Init::uniform(-1e-2f, 1e-2f), 2);
    const AdamW adamw{.lr = 1e-3f, .weight_decay = 1e-2f};
    std::int64_t step = 0;
    FlatOptimizer<Host> in_memory(arena.host(), adamw, n);
    const double memory_ms = median_ms(iters, [&] {
      in_memory.step<float>(master.data(), grad.data(), nullptr, {1e-3f, ++step, 1.f});
    });
    arena.check_state_space(2 * n * sizeof(float));
    FlatOptimizer<Host> on_disk(arena.host(), adamw, n, {}, {},
                                [&](std::size_t k) { return arena.allocate_state_file(k); });
    step = 0;
    const double disk_ms = median_ms(iters, [&] {
      on_disk.step<float>(master.data(), grad.data(), nullptr, {1e-3f, ++step, 1.f});
      arena.after_state_pass(true);
    });
    const double state_bytes = 16.0 * static_cast<double>(n);  // 2 buffers, read and written
    char out[512];
    std::snprintf(
        out, sizeof out,
        "{\"elements\": %zu, \"threads\": %d, \"iters\": %d, \"memory_pass_ms\": %.3f, \"disk_pass_ms\": %.3f, "
        "\"state_disk_mb_per_s\": %.1f}\n",
        n, dev.threads(), iters, memory_ms, disk_ms, state_bytes / disk_ms / 1e3);
    if (json.empty())
      std::fputs(out, stdout);
    else
      std::ofstream(json) << out;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_state_disk: %s\n", e.what());
    return 1;
  }
}
