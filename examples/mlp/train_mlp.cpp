// train_mlp: trains an MLP classifier with dtrain on every rank it was
// launched with (dtrain-run, torchrun, srun, mpirun, or alone).
//
//   dtrain-run --nproc-per-node 2 train_mlp --config examples/configs/ddp_host.yaml steps=500 precision=bf16
//
// Compiled by g++ only: range-v3 and yaml-cpp stay out of the nvcc translation unit.

#include <cstdio>
#include <exception>
#include <string>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "mlp.hpp"

namespace mlp {

namespace {

constexpr const char* usage = R"(Trains an MLP classifier on every rank this process was launched with.
)";

void declare_extra(dtrain::ConfigReader& r, Config& c) {
  r.add("hidden", c.hidden, "hidden widths, e.g. [256, 256] or 256,256");
  r.add("activation", c.activation, "gelu | relu");
  r.add("data", c.data, "synthetic | FILE.safetensors (tensors x, y) | X.npy,Y.npy");
  r.add("samples", c.samples, "rows of the synthetic task");
  r.add("features", c.features, "features of the synthetic task");
  r.add("classes", c.classes, "classes of the synthetic task");
}

void validate_extra(const Config& c) {
  if (c.hidden.empty())
    throw dtrain::config_error("hidden is empty", "give at least one hidden width, e.g. hidden=256");
  if (c.activation != "gelu" && c.activation != "relu")
    throw dtrain::config_error("activation = '" + c.activation + "' is unknown", "use gelu or relu");
}

}  // namespace

Config load_config(int argc, char** argv) {
  return examples::parse_cli<Config>(argc, argv, "train_mlp", usage, declare_extra, validate_extra);
}

dtrain::Dataset load_data(const Config& c) {
  if (c.data == "synthetic") return synthetic_dataset(c.samples, c.features, c.classes, c.seed);
  const auto comma = c.data.find(',');
  if (comma != std::string::npos) return dtrain::load_npy_dataset(c.data.substr(0, comma), c.data.substr(comma + 1));
  return dtrain::load_safetensors_dataset(c.data);
}

}  // namespace mlp

int main(int argc, char** argv) {
  try {
    const mlp::Config cfg = mlp::load_config(argc, argv);
    auto world = examples::init_world(cfg);
    const dtrain::Dataset data = mlp::load_data(cfg);
    std::int64_t classes = cfg.classes;
    if (cfg.data != "synthetic") {
      classes = 0;
      for (auto y : data.y) classes = std::max<std::int64_t>(classes, y + 1);
    }
    data.validate(classes);
    if (world.rank() == 0)
      std::printf(
          "train_mlp: %d rank(s), strategy=%s device=%s precision=%s accumulate=%d batch=%lld/rank, %lld "
          "samples x %lld features, %lld classes\n",
          world.size(), cfg.strategy.c_str(), cfg.device.c_str(), cfg.precision.c_str(), cfg.accumulate,
          static_cast<long long>(cfg.batch_size), static_cast<long long>(data.rows),
          static_cast<long long>(data.features), static_cast<long long>(classes));
    if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
      return mlp::train_cuda(cfg, world, data, classes);
#else
      throw dtrain::config_error("this train_mlp was built without CUDA", "use device=host, or rebuild with CUDA");
#endif
    }
    return mlp::train_host(cfg, world, data, classes);
  } catch (const std::exception& e) {
    examples::report_failure(e);
    return examples::exit_status(e);
  }
}
