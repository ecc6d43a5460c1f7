// train_libtorch: trains a model written with LibTorch's torch::nn (a GPT-style
// language model or a small ResNet, models.hpp) with dtrain's strategies on
// every rank it was launched with.
//
//   dtrain-run --nproc-per-node 2 train_libtorch model=lm strategy=fsdp-full save_params=lm.safetensors
//
// Compiled by g++ only: LibTorch, yaml-cpp and range-v3 stay out of the nvcc
// translation unit (train_cuda.cu sees dtrain/torch/block.hpp only).

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "common/windows.hpp"
#include "libtorch.hpp"
#include "models.hpp"

#include <dtrain/torch/module.hpp>

namespace libtorch_example {
namespace {

constexpr const char* usage = R"(Trains a model written with LibTorch (torch::nn) on every rank this process
was launched with: model=lm, a GPT-style transformer on a synthetic token
stream (each token follows from the two before it, with noise), or
model=resnet, a small residual network on synthetic images (the class is
the brightest of a few fixed patterns). The module's blocks are dtrain units:
every strategy, precision, accumulation and checkpoint key works.
save_params=FILE.safetensors writes the weights by LibTorch's parameter names
(Python: model.load_state_dict(safetensors.torch.load_file(FILE))), and
init_from=FILE.safetensors reads such a file.
)";

void declare_extra(dtrain::ConfigReader& r, Config& c) {
  r.add("model", c.model, "lm | resnet");
  r.add("vocab", c.vocab, "lm: tokens in the vocabulary");
  r.add("block_size", c.block_size, "lm: positions per sequence");
  r.add("dim", c.dim, "lm: width");
  r.add("heads", c.heads, "lm: attention heads");
  r.add("layers", c.layers, "lm: transformer blocks");
  r.add("tokens", c.tokens, "lm: length of the synthetic token stream");
  r.add("image", c.image, "resnet: image side in pixels (3 channels)");
  r.add("channels", c.channels, "resnet: channels of every stage (a multiple of 4)");
  r.add("depth", c.depth, "resnet: residual blocks");
  r.add("classes", c.classes, "resnet: classes");
  r.add("samples", c.samples, "resnet: synthetic images");
  r.add("eval_batches", c.eval_batches, "held-out batches per rank evaluated at the end (0 = none)");
}

void validate_extra(const Config& c) {
  if (c.model != "lm" && c.model != "resnet")
    throw dtrain::config_error("model = '" + c.model + "' is unknown", "use lm or resnet");
  if (c.model == "lm" && (c.dim % c.heads != 0))
    throw dtrain::config_error(
        "dim = " + std::to_string(c.dim) + " is not a multiple of heads = " + std::to_string(c.heads),
        "choose dim divisible by heads");
  if (c.model == "resnet" && c.channels % 4 != 0)
    throw dtrain::config_error("channels = " + std::to_string(c.channels) + " is not a multiple of 4",
                               "group normalisation uses 4 groups: choose a multiple of 4");
}

// A stream whose next token is a function of the two before it, one in
// eight replaced at random: a language model visibly learns it.
std::vector<std::int32_t> token_stream(const Config& c) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(c.tokens));
  std::uint64_t s = c.seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&] {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  };
  for (std::size_t i = 0; i < t.size(); ++i) {
    const auto v = static_cast<std::uint64_t>(c.vocab);
    t[i] = i < 2 || next() % 8 == 0
               ? static_cast<std::int32_t>(next() % v)
               : static_cast<std::int32_t>(
                     (3 * static_cast<std::uint64_t>(t[i - 1]) + static_cast<std::uint64_t>(t[i - 2]) + 1) % v);
  }
  return t;
}

// Images of noise plus one of `classes` fixed patterns: the label.
struct Images {
  std::int64_t size, classes, samples, seed;
  std::vector<float> patterns;
  explicit Images(const Config& c)
      : size(c.image), classes(c.classes), samples(c.samples), seed(static_cast<std::int64_t>(c.seed)) {
    torch::manual_seed(c.seed ^ 0x5eedull);
    const auto p = torch::randn({classes, 3 * size * size});
    patterns.assign(p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
  }
  dtrain::Batch rows(std::span<const std::int64_t> indices) const {
    const std::int64_t f = 3 * size * size, n = static_cast<std::int64_t>(indices.size());
    std::vector<float> x(static_cast<std::size_t>(n * f));
    std::vector<std::int32_t> y(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k) {
      std::uint64_t s = static_cast<std::uint64_t>(indices[static_cast<std::size_t>(k)] * 7919 + seed) | 1;
      auto uniform = [&] {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return static_cast<float>((s >> 11) * 0x1.0p-53);
      };
      const auto label = static_cast<std::int64_t>(s % static_cast<std::uint64_t>(classes));
      y[static_cast<std::size_t>(k)] = static_cast<std::int32_t>(label);
      for (std::int64_t j = 0; j < f; ++j)
        x[static_cast<std::size_t>(k * f + j)] =
            patterns[static_cast<std::size_t>(label * f + j)] + 1.5f * (uniform() - 0.5f) * 2.f;
    }
    dtrain::Batch b;
    b.set("x", dtrain::HostTensor::of(x, {n, f}));
    b.set("y", dtrain::HostTensor::of(y, {n}));
    return b;
  }
};

}  // namespace

Config load_config(int argc, char** argv) {
  return examples::parse_cli<Config>(argc, argv, "train_libtorch", usage, declare_extra, validate_extra);
}

}  // namespace libtorch_example

int main(int argc, char** argv) {
  using namespace libtorch_example;
  try {
    Config cfg = load_config(argc, argv);
    auto world = examples::init_world(cfg);
    namespace lt = dtrain::libtorch;
    const lt::WrapOptions wrap{.device = cfg.device == "cuda" ? lt::device_kind::cuda : lt::device_kind::host};
    const c10::Device device = cfg.device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    // The user's LibTorch program: a module built as always (the same seed
    // on every rank, though wrap would take rank 0's weights anyway).
    torch::manual_seed(cfg.seed);
    std::shared_ptr<torch::nn::Module> net;
    Model model;
    Samples train_data, held_out;
    std::vector<std::int32_t> tokens;
    std::unique_ptr<Images> images;
    std::int64_t stride = 1;
    std::string unit;
    if (cfg.model == "lm") {
      libtorch_models::Lm lm(cfg.vocab, cfg.block_size, cfg.dim, cfg.heads, cfg.layers);
      lm->to(device);
      model =
          lt::wrap(world, lm, {lm->embed, lm->blocks, lm->head},
                   torch::zeros({2, cfg.block_size}, torch::TensorOptions().dtype(torch::kLong).device(device)), wrap);
      net = lm.ptr();
      tokens = token_stream(cfg);
      const auto n = static_cast<std::int64_t>(tokens.size()), split = n - n / 10;
      auto windows = std::make_shared<examples::Windows>(tokens, cfg.block_size, 0, split);
      auto tail = std::make_shared<examples::Windows>(tokens, cfg.block_size, split, n);
      train_data = {windows->size(), [windows](auto idx) { return windows->gather(idx); }};
      held_out = {tail->size(), [tail](auto idx) { return tail->gather(idx); }};
      stride = cfg.block_size;
      unit = std::to_string(cfg.block_size) + " tokens";
    } else {
      libtorch_models::ResNet resnet(cfg.channels, cfg.image, cfg.depth, cfg.classes);
      resnet->to(device);
      model = lt::wrap(world, resnet, {resnet->stem, resnet->layers, resnet->head},
                       torch::zeros({2, 3 * cfg.image * cfg.image}, torch::TensorOptions().device(device)), wrap);
      net = resnet.ptr();
      images = std::make_unique<Images>(cfg);
      const std::int64_t split = cfg.samples - cfg.samples / 10;
      train_data = {split, [im = images.get()](auto idx) { return im->rows(idx); }};
      held_out = {cfg.samples - split, [im = images.get(), split](std::span<const std::int64_t> idx) {
                    std::vector<std::int64_t> shifted(idx.begin(), idx.end());
                    for (auto& i : shifted) i += split;
                    return im->rows(shifted);
                  }};
      unit = "one image";
    }
    std::int64_t params = 0;
    for (const auto& p : net->parameters()) params += p.numel();
    if (world.rank() == 0)
      std::printf(
          "train_libtorch: %s (LibTorch %s, %lld parameters in %zu blocks), %d rank(s), strategy=%s "
          "device=%s precision=%s accumulate=%d batch=%lld/rank\n",
          cfg.model.c_str(), TORCH_VERSION, static_cast<long long>(params), model.blocks.size() + 1, world.size(),
          cfg.strategy.c_str(), cfg.device.c_str(), cfg.precision.c_str(), cfg.accumulate,
          static_cast<long long>(cfg.batch_size));
    // The weights by LibTorch's names at the end, instead of dtrain's.
    const std::string save = cfg.save_params, init = cfg.init_from;
    cfg.save_params.clear();
    cfg.init_from.clear();
    Finish finish;
    finish.held_out = [&](const auto& evaluate) {
      if (cfg.eval_batches < 1 || held_out.size() < 1) return;
      const double loss =
          evaluate(examples::held_out_batches(world, held_out, stride, cfg.batch_size, cfg.eval_batches));
      if (world.rank() == 0)
        std::printf("eval: held-out loss %.4f over %lld samples of %s\n", loss,
                    static_cast<long long>(cfg.eval_batches * cfg.batch_size * world.size()), unit.c_str());
      if (world.rank() == 0 && model.recomputed() > 0)
        std::printf("libtorch: %lld block forwards recomputed in backward (their parameters were gathered anew)\n",
                    static_cast<long long>(model.recomputed()));
    };
    finish.save = [&](const auto& visit) {
      if (save.empty()) return;
      lt::save_state_dict_from(visit, model, save);
      if (world.rank() == 0) std::printf("saved %s (LibTorch's parameter names)\n", save.c_str());
    };
    finish.load = [&](const auto& load) {
      if (init.empty()) return;
      const auto r = lt::load_state_dict_with(load, model, init, {.strict = cfg.init_strict});
      if (world.rank() == 0)
        std::printf("init_from %s: loaded %zu tensor(s) by LibTorch's names\n", init.c_str(), r.loaded.size());
    };
    if (cfg.device == "cuda") {
#if DTRAIN_EXAMPLE_CUDA
      return train_cuda(cfg, world, model, train_data, finish);
#else
      throw dtrain::config_error("this train_libtorch was built without CUDA", "use device=host, or rebuild with CUDA");
#endif
    }
    return train_host(cfg, world, model, train_data, finish);
  } catch (const c10::Error& e) {  // the module's own code (a shape its forward refuses)
    std::fprintf(stderr, "error: LibTorch: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    examples::report_failure(e);
    return examples::exit_status(e);
  }
}
