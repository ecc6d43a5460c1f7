// dtrain's GPU kernels against the GPU's own copy bandwidth, measured in the
// same process: the optimizer pass the Trainer runs (FlatOptimizer<Cuda>'s
// GroupedStep over one flat buffer: AdamW with one parameter group, with two,
// and with two writing the bf16 compute copy), the fp32 -> bf16 parameter
// cast, the fp16 gradient unscale (Scale) with its non-finite count, and the
// squared gradient norm.
// bench/gpu/torch_kernels_cuda.py times PyTorch's counterparts the same way
// and bench/run_gpu_bench.sh runs both and prints the table.
//
// Bytes are counted as each pass needs them (read + written, as STREAM does):
//   copy        4 read + 4 written per element (cudaMemcpyAsync, device to device)
//   adamw       param, grad, m, v read, param, m, v written: 28 per element
//   adamw_groups  the same plus each element's group id read: 29
//   adamw_bf16    adamw_groups plus the bf16 parameter written: 31
//   cast        4 read + 2 written
//   unscale     fp16 gradient read and written (4), then read again to count
//               non-finite values (2): 6 per element, two kernels
//   norm        4 read (one pass, per-block double partial sums)
// Each pass runs `iters` times after 3 warm-ups, each timed alone with CUDA
// events; the median is reported.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "../size_options.hpp"

#include <dtrain/backend/cuda/device.hpp>
#include <dtrain/kernels/elementwise.hpp>
#include <dtrain/kernels/optimizer.hpp>
#include <dtrain/kernels/reduce.hpp>
#include <dtrain/optim/flat_optimizer.hpp>

namespace {

using namespace dtrain;

constexpr const char* usage = "usage: bench_gpu_kernels [--sizes-m 10,100] [--iters N] [--json PATH]";

using Options = bench::SizeOptions;

Options parse(int argc, char** argv) {
  return bench::parse_size_options(argc, argv, {{10'000'000, 100'000'000}, 20, {}}, usage);
}

// Median milliseconds of `iters` runs of `pass`, each between two events on the device's stream.
double median_ms(Cuda& dev, int iters, const std::function<void()>& pass) {
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) pass();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    cuda_check(cudaEventRecord(start, dev.stream()), "cudaEventRecord");
    pass();
    cuda_check(cudaEventRecord(stop, dev.stream()), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    cuda_check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string pass;
  std::size_t n;
  double ms, bytes;
  double gbps() const { return bytes / (ms * 1e-3) / 1e9; }
};

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  Cuda dev(0);
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::vector<Row> rows;
  for (const std::size_t n : o.sizes) {
    auto param = make_buffer<float>(dev, n), grad = make_buffer<float>(dev, n), m = make_buffer<float>(dev, n),
         v = make_buffer<float>(dev, n);
    auto half = make_buffer<bf16>(dev, n);
    auto g16 = make_buffer<fp16>(dev, n);
    // Non-zero, finite contents (the kernels' speed does not depend on them).
    dev.zero(m.data(), n);
    dev.zero(v.data(), n);
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i)
      host[i] = 0.001f * static_cast<float>(static_cast<int>(i % 2001) - 1000) + 1e-4f;
    dev.copy_from_host(param.data(), host.data(), n);
    dev.copy_from_host(grad.data(), host.data(), n);
    dev.for_each(n, Cast<float, fp16>{grad.data(), g16.data()});
    const double fn = static_cast<double>(n);

    rows.push_back({"copy", n, median_ms(dev, o.iters, [&] { dev.copy(m.data(), grad.data(), n); }), 8 * fn});
    // The Trainer's pass: FlatOptimizer over the owned flat (GroupedStep),
    // with the element group ids a no-decay group brings.
    std::vector<std::uint8_t> ids(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = i % 4096 < 64 ? 1 : 0;  // a bias-sized run per 4096
    const AdamW adamw{.lr = 1e-4f, .weight_decay = 0.1f};
    FlatOptimizer<Cuda> one(dev, adamw, n), two(dev, adamw, n, {{1.f, 0.1f}, {1.f, 0.f}}, ids);
    std::int64_t step = 0;
    const auto pass = [&](FlatOptimizer<Cuda>& opt, auto* out) {
      return [&, out] { opt.step(param.data(), grad.data(), out, {.lr = 1e-4f, .step = ++step, .grad_scale = 1.f}); };
    };
    rows.push_back({"adamw", n, median_ms(dev, o.iters, pass(one, static_cast<float*>(nullptr))), 28 * fn});
    rows.push_back({"adamw_groups", n, median_ms(dev, o.iters, pass(two, static_cast<float*>(nullptr))), 29 * fn});
    rows.push_back({"adamw_bf16", n, median_ms(dev, o.iters, pass(two, half.data())), 31 * fn});
    rows.push_back({"cast_bf16", n,
                    median_ms(dev, o.iters,
                              [&] {
                                dev.for_each(n, Cast<float, bf16>{param.data(), half.data()});
                              }),
                    6 * fn});
    std::size_t bad = 0;
    rows.push_back({"unscale_fp16", n,
                    median_ms(dev, o.iters,
                              [&] {
                                dev.for_each(n, Scale<fp16>{g16.data(), 1.0f});
                                bad += count_non_finite(dev, std::span<const fp16>(g16.data(), n));
                              }),
                    6 * fn});
    double norm = 0;
    rows.push_back({"grad_norm", n,
                    median_ms(dev, o.iters, [&] { norm += squared_norm(dev, std::span<const float>(grad.data(), n)); }),
                    4 * fn});
    if (bad != 0 || !(norm > 0)) throw config_error("benchmark data went non-finite", "report this as a dtrain bug");
  }

  int driver = 0;
  cuda_check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  std::printf("GPU kernels on %s (%d SMs), median of %d runs each\n", prop.name, prop.multiProcessorCount, o.iters);
  std::printf("%-14s %12s %10s %10s %14s\n", "pass", "elements", "ms", "GB/s", "of copy bw");
  double copy_gbps = 0;
  for (const Row& r : rows) {
    if (r.pass == "copy") copy_gbps = r.gbps();
    std::printf("%-14s %12zu %10.4f %10.1f %13.1f%%\n", r.pass.c_str(), r.n, r.ms, r.gbps(),
                100.0 * r.gbps() / copy_gbps);
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << "{\"implementation\": \"dtrain\", \"device\": \"" << prop.name << "\", \"cuda_driver\": " << driver
        << ", \"iters\": " << o.iters << ", \"rows\": [";
    for (std::size_t i = 0; i < rows.size(); ++i)
      out << (i ? ", " : "") << "{\"pass\": \"" << rows[i].pass << "\", \"elements\": " << rows[i].n
          << ", \"ms\": " << rows[i].ms << ", \"bytes\": " << rows[i].bytes << ", \"gbps\": " << rows[i].gbps() << "}";
    out << "]}\n";
    if (!out) throw config_error("cannot write " + o.json, "check the folder exists and is writable");
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gpu_kernels: %s\n", e.what());
  return 1;
}
