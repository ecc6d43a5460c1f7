// The attention alone on the GPU: cuDNN's fused attention as dtrain calls it
// (cudnn_attention_forward / _backward, q, k, v in the projections' rows
// [B*T, 3C], the output [B*T, C]), forward + backward, bf16, causal, at each
// sequence length given. bench/gpu/torch_attention_cuda.py times PyTorch's
// scaled_dot_product_attention (its flash backend) on the same problems.
//
// FLOPs per forward + backward, causal (half of the scores computed): the
// forward's two matrix products are 4 B H T^2 d, halved by the mask; the
// backward does 2.5 times the forward's (FlashAttention-2's count): in all
// 3.5 * 2 B H T^2 d. Each size runs `iters` times after 3 warm-ups, each timed
// alone with CUDA events; the median is reported.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <dtrain/backend/cuda/device.hpp>
#include <dtrain/device/fused_attention.hpp>
#include <dtrain/kernels/elementwise.hpp>

namespace {

using namespace dtrain;

constexpr const char* usage =
    "usage: bench_gpu_attention [--time 1024,4096] [--batch-tokens 16384] [--heads 12] [--head-dim 64] [--iters N] "
    "[--json PATH]";

struct Options {
  std::vector<std::int64_t> times{1024, 4096};
  std::int64_t batch_tokens = 16384, heads = 12, head_dim = 64;
  int iters = 20;
  std::string json;
};

std::vector<std::int64_t> list(const char* text) {
  std::vector<std::int64_t> out;
  for (std::string s = text; !s.empty();) {
    const auto comma = s.find(',');
    out.push_back(std::stoll(s.substr(0, comma)));
    s = comma == std::string::npos ? "" : s.substr(comma + 1);
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw config_error(a + " needs a value", usage);
    const char* v = argv[++i];
    if (a == "--time")
      o.times = list(v);
    else if (a == "--batch-tokens")
      o.batch_tokens = std::stoll(v);
    else if (a == "--heads")
      o.heads = std::stoll(v);
    else if (a == "--head-dim")
      o.head_dim = std::stoll(v);
    else if (a == "--iters")
      o.iters = std::stoi(v);
    else if (a == "--json")
      o.json = v;
    else
      throw config_error("unknown option " + a, usage);
  }
  return o;
}

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

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  Cuda dev(0);
  dev.set_paths({.rows = dev.paths().rows, .attention = attention_kernels::cudnn});
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("attention forward + backward on %s, bf16, causal, %lld heads of %lld, %lld tokens per batch\n",
              prop.name, static_cast<long long>(o.heads), static_cast<long long>(o.head_dim),
              static_cast<long long>(o.batch_tokens));
  std::printf("%8s %6s %12s %12s\n", "T", "batch", "ms", "TFLOP/s");
  std::ofstream json;
  if (!o.json.empty()) json.open(o.json);
  json << "{\"implementation\": \"dtrain (cuDNN fused attention)\", \"device\": \"" << prop.name << "\", \"rows\": [";
  for (std::size_t k = 0; k < o.times.size(); ++k) {
    const std::int64_t T = o.times[k], B = std::max<std::int64_t>(1, o.batch_tokens / T), H = o.heads, d = o.head_dim,
                       C = H * d, N = B * T;
    auto qkv = make_buffer<bf16>(dev, static_cast<std::size_t>(3 * N * C));
    auto dqkv = make_buffer<bf16>(dev, static_cast<std::size_t>(3 * N * C));
    auto out = make_buffer<bf16>(dev, static_cast<std::size_t>(N * C));
    auto dout = make_buffer<bf16>(dev, static_cast<std::size_t>(N * C));
    auto stats = make_buffer<float>(dev, static_cast<std::size_t>(B * H * T));
    std::vector<float> host(static_cast<std::size_t>(3 * N * C));
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = 0.01f * static_cast<float>(static_cast<int>(i % 201) - 100);
    auto staging = make_buffer<float>(dev, host.size());
    dev.copy_from_host(staging.data(), host.data(), host.size());
    dev.for_each(host.size(), Cast<float, bf16>{staging.data(), qkv.data()});
    dev.for_each(static_cast<std::size_t>(N * C), Cast<float, bf16>{staging.data(), dout.data()});
    const AttentionStrides rows{T * 3 * C, d, 3 * C}, o_rows{T * C, d, C};
    const FusedAttentionShape s{B, H, H, T, d, rows, rows, rows, o_rows, false};
    if (!use_fused_attention<Cuda, bf16>(dev, s))
      throw config_error("cuDNN cannot run this attention problem", "try another head dim or sequence length");
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    bf16* q = qkv.data();
    bf16* dq = dqkv.data();
    const double ms = median_ms(dev, o.iters, [&] {
      fused_attention_forward<Cuda, bf16>(dev, s, scale, q, q + C, q + 2 * C, nullptr, out.data(), stats.data());
      fused_attention_backward<Cuda, bf16>(dev, s, scale, q, q + C, q + 2 * C, out.data(), dout.data(), stats.data(),
                                           nullptr, dq, dq + C, dq + 2 * C);
    });
    const double flops = 3.5 * 2.0 * static_cast<double>(B * H) * static_cast<double>(T) * static_cast<double>(T) *
                         static_cast<double>(d);
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("%8lld %6lld %12.3f %12.1f\n", static_cast<long long>(T), static_cast<long long>(B), ms, tflops);
    json << (k ? ", " : "") << "{\"time\": " << T << ", \"batch\": " << B << ", \"heads\": " << H
         << ", \"head_dim\": " << d << ", \"ms\": " << ms << ", \"tflops\": " << tflops << "}";
  }
  json << "]}\n";
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_gpu_attention: %s\n", e.what());
  return 1;
}
