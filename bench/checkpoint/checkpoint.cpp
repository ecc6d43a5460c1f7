// Checkpoint save and load, timed: a stack of Linear layers (about 25M fp32
// parameters with AdamW state: a ~300 MB training state), one training step,
// then per repetition a sharded save, a consolidated save and a load of each.
// Launched by dtrain-run; rank 0 writes one JSON object to --json.
//   bench_checkpoint --dir D --json OUT [--strategy ddp|fsdp-full] [--hidden 2048] [--layers 6] [--repeat 3]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <dtrain/trainer.hpp>

namespace {

struct Stack {
  std::vector<dtrain::nn::AnyUnit> layers;
  dtrain::nn::SoftmaxCrossEntropy loss;
  Stack(std::int64_t hidden, int n) {
    for (int i = 0; i < n; ++i) layers.emplace_back(dtrain::nn::Linear(hidden, i + 1 == n ? 10 : hidden));
  }
  auto units() { return std::tie(layers); }
};

double median(std::vector<double> v) {
  std::ranges::sort(v);
  return v[v.size() / 2];
}

template <class Kind>
int run(dtrain::World& world, const std::filesystem::path& dir, const std::string& json, std::int64_t hidden,
        int layers, int repeat) {
  Stack model(hidden, layers);
  dtrain::Trainer<Stack, dtrain::Strategy<Kind>> trainer(world, model, dtrain::AdamW{.lr = 1e-4f});
  const std::vector<float> x(static_cast<std::size_t>(4 * hidden), 0.5f);
  const std::vector<std::int32_t> y{1, 2, 3, 4};
  trainer.step(std::vector<dtrain::Batch>{dtrain::Batch::table(x, y, 4, hidden)});
  std::vector<double> save_sharded, save_full, load_sharded, load_full;
  std::uintmax_t shard_bytes = 0, full_shard_bytes = 0, model_bytes = 0;
  auto timed = [&](auto&& f) {
    world.barrier("bench-start");
    const auto t0 = std::chrono::steady_clock::now();
    f();
    world.barrier("bench-end");
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const std::string mine = dtrain::detail::shard_file_name(world.rank(), world.size());
  for (int r = 0; r < repeat; ++r) {
    const auto sharded = dir / ("sharded-" + std::to_string(r)), full = dir / ("full-" + std::to_string(r));
    save_sharded.push_back(timed([&] { trainer.save(sharded); }));
    save_full.push_back(timed([&] { trainer.save(full, {.consolidated = true}); }));
    load_sharded.push_back(timed([&] { trainer.load(sharded); }));
    load_full.push_back(timed([&] { trainer.load(full); }));
    if (std::filesystem::exists(sharded / mine)) shard_bytes = std::filesystem::file_size(sharded / mine);
    if (std::filesystem::exists(full / mine)) full_shard_bytes = std::filesystem::file_size(full / mine);
    if (world.rank() == 0) model_bytes = std::filesystem::file_size(full / "model.safetensors");
    world.barrier("bench-clean");
    if (world.rank() == 0) {
      std::filesystem::remove_all(sharded);
      std::filesystem::remove_all(full);
    }
  }
  // every rank's bytes, gathered to rank 0
  const auto all = world.all_gather("bench-bytes", std::array{shard_bytes, full_shard_bytes});
  if (world.rank() == 0) {
    std::string per_rank = "[", per_rank_full = "[";
    for (std::size_t i = 0; i < all.size(); ++i) {
      per_rank += (i ? ", " : "") + std::to_string(all[i][0]);
      per_rank_full += (i ? ", " : "") + std::to_string(all[i][1]);
    }
    std::FILE* out = std::fopen(json.c_str(), "w");
    if (!out) throw dtrain::config_error("cannot write " + json, "check the path");
    std::fprintf(out,
                 "{\"strategy\": \"%s\", \"ranks\": %d, \"parameters\": %zu, \"save_sharded_s\": %.4f, "
                 "\"save_consolidated_s\": %.4f, \"load_sharded_s\": %.4f, \"load_consolidated_s\": %.4f, "
                 "\"sharded_bytes_per_rank\": %s], \"consolidated_shard_bytes_per_rank\": %s], "
                 "\"model_safetensors_bytes\": %ju}\n",
                 std::string(Kind::name).c_str(), world.size(), trainer.layout().trainable_numel(),
                 median(save_sharded), median(save_full), median(load_sharded), median(load_full), per_rank.c_str(),
                 per_rank_full.c_str(), model_bytes);
    std::fclose(out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::filesystem::path dir;
    std::string strategy = "ddp", json;
    std::int64_t hidden = 2048;
    int layers = 6, repeat = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--dir")
        dir = v;
      else if (k == "--json")
        json = v;
      else if (k == "--strategy")
        strategy = v;
      else if (k == "--hidden")
        hidden = std::stoll(v);
      else if (k == "--layers")
        layers = std::stoi(v);
      else if (k == "--repeat")
        repeat = std::stoi(v);
    }
    if (dir.empty() || json.empty())
      throw dtrain::config_error("--dir and --json are required", "pass --dir <scratch directory> --json <file>");
    auto world = dtrain::init();
    if (strategy == "fsdp-full") return run<dtrain::FSDP<dtrain::FullShard>>(world, dir, json, hidden, layers, repeat);
    return run<dtrain::DDP>(world, dir, json, hidden, layers, repeat);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    return 1;
  }
}
