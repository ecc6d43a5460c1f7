// AdamW over one flat fp32 buffer: dtrain's AdamWStep<float> through
// Host::for_each, against a pass with the same memory traffic measured the
// same way in the same process (the reference AdamW is a share of), and the
// machine's memcpy bandwidth for information. bench/training/torch_adamw.py measures torch.optim.AdamW the same
// way and bench/run_training_bench.sh runs both.
//
// Bytes are counted as the update needs them: AdamW reads param, grad, m, v
// and writes param, m, v, so 7 x 4 bytes per element. The reference
// ("stream") reads and writes exactly those buffers with one add each,
// through the same Host::for_each (threads, ranges, instruction level): the
// time AdamW would take if its arithmetic were free. The copy is
// STREAM's: bytes read + bytes written (its write-allocate reads of the
// destination are not counted, as in STREAM). It copies a source of 2n floats
// into a destination of 2n floats, so its footprint equals AdamW's four
// buffers of n floats: both see the same caches. It runs on as many threads
// as the Host device does (OPENBLAS_NUM_THREADS, else the rank's share of the
// cores), each thread memcpy'ing its own contiguous part.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../size_options.hpp"

#include <dtrain/backend/host/device.hpp>
#include <dtrain/kernels/optimizer.hpp>
#include <dtrain/model/init.hpp>

namespace {

using namespace dtrain;
using clock_type = std::chrono::steady_clock;

// Built with the default flags, GCC reaches the square-root instruction
// through math::sqrt's SIMD variants (a call per vector); with
// -fno-math-errno (the bench_adamw_no_errno target) it inlines it. The
// results say which build produced them.
#ifdef __NO_MATH_ERRNO__
constexpr const char* build_flags = ", built with -fno-math-errno";
#else
constexpr const char* build_flags = "";
#endif

constexpr const char* usage = "usage: bench_adamw [--sizes-m 10,100] [--iters N] [--json PATH]";

using Options = bench::SizeOptions;

Options parse(int argc, char** argv) {
  return bench::parse_size_options(argc, argv, {{10'000'000, 100'000'000}, 15, {}}, usage);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median time of `iters` calls after one untimed call (first touch).
template <class F>
double median_ms(int iters, F&& f) {
  f(0);
  std::vector<double> ms;
  for (int i = 1; i <= iters; ++i) {
    const auto t0 = clock_type::now();
    f(i);
    ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  return median(std::move(ms));
}

void parallel_copy(float* dst, const float* src, std::size_t n, int threads) {
  const std::size_t chunk = (n + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
  auto part = [&](std::size_t t) {
    const std::size_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    std::memcpy(dst + begin, src + begin, (end - begin) * sizeof(float));
  };
  std::vector<std::jthread> workers;
  for (std::size_t t = 1; t < static_cast<std::size_t>(threads); ++t) workers.emplace_back(part, t);
  part(0);
}

// AdamW's memory traffic without its arithmetic: 4 streams read, 3 written.
struct StreamTouch {
  float* param;
  const float* grad;
  float* m;
  float* v;
  void operator()(std::size_t i) const {
    const float g = grad[i];
    param[i] += g;
    m[i] += g;
    v[i] += g;
  }
};

struct Row {
  std::size_t n;
  double adamw_ms;
  double stream_ms;
  double copy_ms;
  double adamw_gbps() const { return 28.0 * static_cast<double>(n) / adamw_ms / 1e6; }
  double stream_gbps() const { return 28.0 * static_cast<double>(n) / stream_ms / 1e6; }
  double copy_gbps() const { return 16.0 * static_cast<double>(n) / copy_ms / 1e6; }
};

Row measure(Host& dev, std::size_t n, int iters) {
  auto param = make_buffer<float>(dev, n), grad = make_buffer<float>(dev, n);
  auto m = make_buffer<float>(dev, n, zero_init), v = make_buffer<float>(dev, n, zero_init);
  init_values(param.span(), Init::uniform(-1.f, 1.f), 1);
  init_values(grad.span(), Init::uniform(-1e-2f, 1e-2f), 2);
  const AdamWHyper hyper{.lr = 1e-3f, .weight_decay = 1e-2f};
  const double adamw_ms = median_ms(iters, [&](int i) {
    dev.for_each(n, AdamWStep<float>({param.data(), grad.data(), m.data(), v.data()}, hyper, i + 1));
  });
  const double stream_ms = median_ms(iters, [&](int) {
    dev.for_each(n, StreamTouch{param.data(), grad.data(), m.data(), v.data()});
  });
  param = {};
  grad = {};
  m = {};
  v = {};
  auto src = make_buffer<float>(dev, 2 * n), dst = make_buffer<float>(dev, 2 * n);
  init_values(src.span(), Init::uniform(-1.f, 1.f), 3);
  const double copy_ms = median_ms(iters, [&](int) { parallel_copy(dst.data(), src.data(), 2 * n, dev.threads()); });
  return {n, adamw_ms, stream_ms, copy_ms};
}

std::string to_json(const std::vector<Row>& rows, int threads, int iters) {
  std::string out = "{\"implementation\": \"dtrain AdamWStep<float> via Host::for_each" + std::string(build_flags) +
                    "\", \"threads\": " + std::to_string(threads) + ", \"iters\": " + std::to_string(iters) +
                    ", \"results\": [";
  char line[320];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::snprintf(line, sizeof line,
                  "%s\n  {\"elements\": %zu, \"adamw_ms\": %.3f, \"adamw_gbps\": %.3f, \"stream_ms\": %.3f, "
                  "\"stream_gbps\": %.3f, \"adamw_vs_stream\": %.3f, \"copy_ms\": %.3f, \"copy_gbps\": %.3f}",
                  i ? "," : "", r.n, r.adamw_ms, r.adamw_gbps(), r.stream_ms, r.stream_gbps(), r.stream_ms / r.adamw_ms,
                  r.copy_ms, r.copy_gbps());
    out += line;
  }
  return out + "\n]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse(argc, argv);
    Host dev;
    std::vector<Row> rows;
    for (const std::size_t n : opt.sizes) rows.push_back(measure(dev, n, opt.iters));
    const std::string json = to_json(rows, dev.threads(), opt.iters);
    if (opt.json.empty()) {
      std::fputs(json.c_str(), stdout);
    } else {
      std::ofstream(opt.json) << json;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_adamw: %s\n", e.what());
    return 1;
  }
}
