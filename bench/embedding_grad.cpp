// The embedding's gradient on the host, its two forms side by side: an
// index per table element (what a GPU runs: EmbeddingScatter over vocab x
// dim) and a table row per index (by_rows, the host's form since 2026-11-29),
// for tables of the Hugging Face models' shapes, on one thread and on every
// core. Checks the two give the same bits, then prints a table and writes
// JSON (bench/run_embedding_bench.sh adds the machine and the commit).
//
// usage: bench_embedding_grad [--vocab 32000,50257] [--dim 768] [--rows 512] [--iters 15] [--json PATH]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <dtrain/backend/host/device.hpp>
#include <dtrain/kernels/sequence.hpp>

namespace {

struct Options {
  std::vector<std::int64_t> vocab{32000, 50257};
  std::int64_t dim = 768, rows = 512;
  int iters = 15;
  std::string json;
};

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr,
               "bench_embedding_grad: %s\nusage: bench_embedding_grad [--vocab 32000,50257] [--dim 768] "
               "[--rows 512] [--iters 15] [--json PATH]\n",
               why.c_str());
  std::exit(2);
}

std::int64_t positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v <= 0)
    usage_error(flag + " needs a positive integer, got '" + text + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--vocab") {
      o.vocab.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) o.vocab.push_back(positive(flag, item));
    } else if (flag == "--dim") {
      o.dim = positive(flag, value);
    } else if (flag == "--rows") {
      o.rows = positive(flag, value);
    } else if (flag == "--iters") {
      o.iters = static_cast<int>(positive(flag, value));
    } else if (flag == "--json") {
      o.json = value;
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  return o;
}

// The median of `iters` timed calls after one untimed call (first touch).
template <class F>
double median_ms(int iters, F&& f) {
  f();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::int64_t vocab;
  int threads;
  double elements_ms, rows_ms;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> thread_counts{1};
  if (cores > 1) thread_counts.push_back(cores);
  std::vector<Row> rows;
  for (const std::int64_t vocab : o.vocab) {
    // Token ids drawn at random, bucketed as nn::Embedding's backward does.
    std::mt19937_64 rng(static_cast<std::uint64_t>(vocab));
    std::vector<std::int64_t> index(static_cast<std::size_t>(vocab + 1 + o.rows), 0);
    std::int64_t* offsets = index.data();
    std::int64_t* order = offsets + vocab + 1;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(o.rows));
    for (auto& id : ids) id = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(vocab));
    for (const auto id : ids) ++offsets[id + 1];
    for (std::int64_t v = 0; v < vocab; ++v) offsets[v + 1] += offsets[v];
    std::vector<std::int64_t> next(offsets, offsets + vocab);
    for (std::int64_t r = 0; r < o.rows; ++r)
      order[next[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)])]++] = r;
    std::vector<float> dy(static_cast<std::size_t>(o.rows * o.dim));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& x : dy) x = u(rng);
    std::vector<float> by_elements(static_cast<std::size_t>(vocab * o.dim)), by_rows(by_elements.size());
    for (const int threads : thread_counts) {
      dtrain::Host dev(threads);
      const Row row{
          vocab, threads,
          median_ms(o.iters,
                    [&] {
                      dev.for_each(by_elements.size(), dtrain::EmbeddingScatter<float>{offsets, order, dy.data(),
                                                                                       by_elements.data(), o.dim});
                    }),
          median_ms(o.iters, [&] {
            dev.for_each(static_cast<std::size_t>(vocab),
                         dtrain::EmbeddingScatter<float>{offsets, order, dy.data(), by_rows.data(), o.dim, true});
          })};
      if (std::memcmp(by_rows.data(), by_elements.data(), by_rows.size() * sizeof(float)) != 0) {
        std::fprintf(stderr, "bench_embedding_grad: the two forms differ (vocab %lld, %d threads)\n",
                     static_cast<long long>(vocab), threads);
        return 1;
      }
      rows.push_back(row);
    }
  }
  std::printf(
      "| table | threads | an index per element ms | a row per index ms | speed-up |\n|---|---:|---:|---:|---:|\n");
  std::ostringstream json;
  json << "{\"benchmark\": \"embedding_grad\", \"dim\": " << o.dim << ", \"token_rows\": " << o.rows
       << ", \"iters\": " << o.iters << ", \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf("| %lld x %lld | %d | %.2f | %.2f | %.2fx |\n", static_cast<long long>(r.vocab),
                static_cast<long long>(o.dim), r.threads, r.elements_ms, r.rows_ms, r.elements_ms / r.rows_ms);
    json << (i ? ", " : "") << "{\"vocab\": " << r.vocab << ", \"threads\": " << r.threads
         << ", \"elements_ms\": " << r.elements_ms << ", \"rows_ms\": " << r.rows_ms << "}";
  }
  json << "]}\n";
  if (!o.json.empty()) std::ofstream(o.json) << json.str();
  return 0;
}
