#pragma once
// The options of the benchmarks that time passes over buffers of given sizes
// (bench_adamw, bench_gpu_kernels):
//   --sizes-m 10,50   element counts, in millions
//   --iters N         timed runs per pass (at least 1)
//   --json PATH       where the results go
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <dtrain/core/error.hpp>

namespace dtrain::bench {

struct SizeOptions {
  std::vector<std::size_t> sizes;
  int iters = 1;
  std::string json;
};

// `o` holds the defaults; `usage` goes into every error.
inline SizeOptions parse_size_options(int argc, char** argv, SizeOptions o, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) throw config_error(std::string("missing value after ") + argv[i], usage);
    const std::string value = argv[++i];
    if (arg == "--sizes-m") {
      o.sizes.clear();
      for (std::size_t pos = 0; pos <= value.size();) {
        const std::size_t end = std::min(value.find(',', pos), value.size());
        o.sizes.push_back(std::stoull(value.substr(pos, end - pos)) * 1'000'000);
        pos = end + 1;
      }
    } else if (arg == "--iters") {
      o.iters = std::max(1, std::stoi(value));
    } else if (arg == "--json") {
      o.json = value;
    } else {
      throw config_error("unknown option " + std::string(arg), usage);
    }
  }
  return o;
}

}  // namespace dtrain::bench
