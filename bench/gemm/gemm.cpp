// The GEMM engines a host build could use, on the matrix products of a
// language model's training step (bench/run_gemm_bench.sh).
//
// usage: bench_gemm --engine NAME --library PATH --api cblas|dnnl --model gpt2-124m|llama-100m
//                   --tokens M [--repeat N] [--json PATH]
//
// The library is loaded with dlopen (this program links no BLAS), so one
// binary measures OpenBLAS, BLIS, oneDNN or MKL alike; the caller sets its
// thread count through the environment (OPENBLAS_NUM_THREADS,
// BLIS_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS). For every Linear of
// the model (weights [out, in], row-major, as PyTorch and dtrain keep them)
// it times the three products of a training step, M tokens through it:
//   forward  Y[M,N]  = X[M,K] W[N,K]^T   (no-trans, trans)
//   input    dX[M,K] = dY[M,N] W[N,K]    (no-trans, no-trans)
//   weight   dW[N,K] = dY[M,N]^T X[M,K]  (trans, no-trans)
// each the median of N calls after one warm-up, and checks 32 entries of
// each result against a float64 sum (relative error <= 1e-4). One JSON
// line per product, and the step's total (each product times its count per
// step) last.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);
using DnnlSgemm = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                          const float*, std::int64_t, float, float*, std::int64_t);
constexpr int row_major = 101, no_trans = 111, trans = 112;  // CBLAS's enum values

struct Engine {
  CblasSgemm cblas = nullptr;
  DnnlSgemm dnnl = nullptr;
  // C[m,n] = op(A) op(B), row-major, lda/ldb the stored rows' lengths.
  void gemm(bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float* c) const {
    const int lda = ta ? m : k, ldb = tb ? k : n;
    if (cblas) {
      cblas(row_major, ta ? trans : no_trans, tb ? trans : no_trans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
    } else if (dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n) != 0) {
      throw std::runtime_error("dnnl_sgemm failed");
    }
  }
};

struct Linear {
  const char* name;
  int in, out, per_step;  // per_step: how many such layers one step runs
};

std::vector<Linear> model_linears(const std::string& model) {
  if (model == "gpt2-124m")  // 12 layers of width 768, MLP 3072, the tied head over 50257 tokens
    return {{"attn.qkv", 768, 2304, 12},
            {"attn.proj", 768, 768, 12},
            {"mlp.fc", 768, 3072, 12},
            {"mlp.proj", 3072, 768, 12},
            {"lm_head", 768, 50257, 1}};
  if (model == "llama-100m")  // 8 layers of width 768, 4 key/value heads of 64, SwiGLU 2048, 32000 tokens
    return {{"q_proj", 768, 768, 8},     {"k_proj", 768, 256, 8},     {"v_proj", 768, 256, 8},
            {"o_proj", 768, 768, 8},     {"gate_proj", 768, 2048, 8}, {"up_proj", 768, 2048, 8},
            {"down_proj", 2048, 768, 8}, {"lm_head", 768, 32000, 1}};
  if (model == "tiny") return {{"fc", 64, 96, 2}, {"head", 64, 128, 1}};  // the smoke run
  throw std::runtime_error("unknown --model '" + model + "' (gpt2-124m, llama-100m, tiny)");
}

// The largest relative error of 32 entries of C = op(A) op(B) against float64.
double check(bool ta, bool tb, int m, int n, int k, const std::vector<float>& a, const std::vector<float>& b,
             const std::vector<float>& c, std::mt19937& rng) {
  double worst = 0;
  for (int s = 0; s < 32; ++s) {
    const int i = static_cast<int>(rng() % static_cast<unsigned>(m)),
              j = static_cast<int>(rng() % static_cast<unsigned>(n));
    double want = 0, scale = 0;
    for (int p = 0; p < k; ++p) {
      const double x = ta ? a[static_cast<std::size_t>(p) * m + i] : a[static_cast<std::size_t>(i) * k + p];
      const double y = tb ? b[static_cast<std::size_t>(j) * k + p] : b[static_cast<std::size_t>(p) * n + j];
      want += x * y;
      scale += std::abs(x * y);
    }
    worst = std::max(worst, std::abs(c[static_cast<std::size_t>(i) * n + j] - want) / std::max(scale, 1e-30));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::string engine_name, library, api = "cblas", model = "gpt2-124m", json;
  int tokens = 512, repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--engine")
      engine_name = value;
    else if (key == "--library")
      library = value;
    else if (key == "--api")
      api = value;
    else if (key == "--model")
      model = value;
    else if (key == "--tokens")
      tokens = std::atoi(value.c_str());
    else if (key == "--repeat")
      repeat = std::atoi(value.c_str());
    else if (key == "--json")
      json = value;
    else {
      std::fprintf(stderr, "bench_gemm: unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (engine_name.empty() || library.empty() || tokens < 1 || repeat < 1 || (api != "cblas" && api != "dnnl")) {
    std::fprintf(stderr,
                 "usage: bench_gemm --engine NAME --library PATH --api cblas|dnnl --model M --tokens N "
                 "[--repeat N] [--json PATH]\n");
    return 2;
  }
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "bench_gemm: cannot load %s: %s\n", library.c_str(), dlerror());
    return 1;
  }
  Engine engine;
  const char* symbol = api == "cblas" ? "cblas_sgemm" : "dnnl_sgemm";
  void* f = dlsym(handle, symbol);
  if (!f) {
    std::fprintf(stderr, "bench_gemm: %s has no %s\n", library.c_str(), symbol);
    return 1;
  }
  if (api == "cblas")
    engine.cblas = reinterpret_cast<CblasSgemm>(f);
  else
    engine.dnnl = reinterpret_cast<DnnlSgemm>(f);

  std::FILE* out = json.empty() ? stdout : std::fopen(json.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "bench_gemm: cannot write %s\n", json.c_str());
    return 1;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  double step_ms = 0, step_flops = 0;
  for (const Linear& l : model_linears(model)) {
    const int m = tokens, k = l.in, n = l.out;
    std::vector<float> x(static_cast<std::size_t>(m) * k), w(static_cast<std::size_t>(n) * k),
        dy(static_cast<std::size_t>(m) * n);
    for (auto* v : {&x, &w, &dy})
      for (float& e : *v) e = dist(rng);
    struct Product {
      const char* what;
      bool ta, tb;
      int m, n, k;
      const std::vector<float>*a, *b;
    };
    const Product products[] = {{"forward", false, true, m, n, k, &x, &w},
                                {"input", false, false, m, k, n, &dy, &w},
                                {"weight", true, false, n, k, m, &dy, &x}};
    for (const Product& p : products) {
      std::vector<float> c(static_cast<std::size_t>(p.m) * p.n);
      engine.gemm(p.ta, p.tb, p.m, p.n, p.k, p.a->data(), p.b->data(), c.data());  // warm-up
      const double err = check(p.ta, p.tb, p.m, p.n, p.k, *p.a, *p.b, c, rng);
      if (!(err <= 1e-4)) {
        std::fprintf(stderr, "bench_gemm: %s %s %s: relative error %g against float64\n", engine_name.c_str(), l.name,
                     p.what, err);
        return 1;
      }
      std::vector<double> ms;
      for (int r = 0; r < repeat; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        engine.gemm(p.ta, p.tb, p.m, p.n, p.k, p.a->data(), p.b->data(), c.data());
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::nth_element(ms.begin(), ms.begin() + static_cast<long>(ms.size() / 2), ms.end());
      const double median = ms[ms.size() / 2], flops = 2.0 * p.m * p.n * p.k;
      step_ms += median * l.per_step;
      step_flops += flops * l.per_step;
      std::fprintf(out,
                   "{\"engine\": \"%s\", \"model\": \"%s\", \"tokens\": %d, \"linear\": \"%s\", \"product\": \"%s\", "
                   "\"m\": %d, \"n\": %d, \"k\": %d, \"per_step\": %d, \"median_ms\": %.4f, \"gflops\": %.2f, "
                   "\"max_rel_error\": %.3g}\n",
                   engine_name.c_str(), model.c_str(), tokens, l.name, p.what, p.m, p.n, p.k, l.per_step, median,
                   flops / median / 1e6, err);
    }
  }
  std::fprintf(out,
               "{\"engine\": \"%s\", \"model\": \"%s\", \"tokens\": %d, \"linear\": \"step\", \"product\": \"all\", "
               "\"median_ms\": %.3f, \"gflops\": %.2f}\n",
               engine_name.c_str(), model.c_str(), tokens, step_ms, step_flops / step_ms / 1e6);
  if (out != stdout) std::fclose(out);
  return 0;
}
