#pragma once
// train_mlp's training loop, written once and instantiated for each policy
// combination the config can ask for (policies are compile-time types; the
// config picks one at run time). Included only by the generated
// per-strategy translation units.

#include "mlp.hpp"

#include <cstdio>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

namespace mlp {

// "params 1.2 MiB | grads ..." for the progress line.
inline std::string memory_text(const dtrain::MemoryUsage& m) {
  auto mib = [](std::size_t b) {
    char t[32];
    std::snprintf(t, sizeof t, "%.2f", static_cast<double>(b) / (1 << 20));
    return std::string(t);
  };
  return "params " + mib(m.params) + " | grads " + mib(m.grads) + " | optimizer " + mib(m.optimizer) + " | master " +
         mib(m.master) + " | gathered " + mib(m.gathered) + " | activations " + mib(m.activations) + " | total " +
         mib(m.total()) + " MiB";
}

// The `memory` object of a metrics record: bytes on this rank by category.
inline std::string memory_json(const dtrain::MemoryUsage& m) {
  return "{\"params\": " + std::to_string(m.params) + ", \"grads\": " + std::to_string(m.grads) +
         ", \"optimizer\": " + std::to_string(m.optimizer) + ", \"master\": " + std::to_string(m.master) +
         ", \"gathered\": " + std::to_string(m.gathered) + ", \"activations\": " + std::to_string(m.activations) +
         "}";
}

template <class... Policies>
int train(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  Model model(c, data.features, classes);
  dtrain::TrainerOptions opts;
  opts.seed = c.seed;
  opts.sharding = {.shard_group = c.shard_group, .prefetch = c.prefetch};
  opts.clip.max_norm = c.clip;
  opts.buckets.bucket_bytes = static_cast<std::size_t>(c.bucket_mb * (1 << 20));
  opts.lr_scaling = c.lr_scaling == "linear" ? dtrain::LrScaling::linear
                    : c.lr_scaling == "sqrt" ? dtrain::LrScaling::sqrt
                                             : dtrain::LrScaling::none;
  opts.schedule = dtrain::make_schedule(
      c.schedule, {.lr = c.lr, .warmup_steps = c.warmup_steps, .total_steps = c.schedule == "cosine" ? c.steps : 0});

  auto run = [&](auto optimizer) {
    dtrain::Trainer<Model, Policies...> trainer(world, model, optimizer, opts);
    dtrain::DistributedSampler sampler(data.rows, world, {.shuffle = true, .seed = c.seed});
    dtrain::DataLoader loader(data, sampler, {.batch_size = c.batch_size, .num_workers = c.num_workers});
    std::ofstream metrics;
    if (world.rank() == 0 && !c.metrics.empty()) {
      metrics.open(c.metrics);
      if (!metrics)
        throw dtrain::config_error("cannot write the metrics file '" + c.metrics + "'",
                                   "check that its folder exists and is writable");
    }
    std::vector<dtrain::Batch> micro(static_cast<std::size_t>(c.accumulate));
    for (std::int64_t s = 0; s < c.steps; ++s) {
      for (auto& b : micro) b = loader.next();
      const auto st = trainer.step(micro);
      const double sps = st.samples / (st.step_ms / 1000.0);
      if (world.rank() != 0) continue;
      if (metrics.is_open())
        metrics << "{\"step\": " << st.step << ", \"loss\": " << st.loss << ", \"lr\": " << st.lr
                << ", \"grad_norm\": " << st.grad_norm << ", \"samples_per_s\": " << sps
                << ", \"step_ms\": " << st.step_ms << ", \"world_size\": " << world.size()
                << ", \"loss_scale\": " << st.loss_scale << ", \"skipped\": " << (st.skipped ? "true" : "false")
                << ", \"memory\": " << memory_json(st.memory) << "}\n";
      if (st.step == 1)
        std::printf("memory per rank (%.*s, rank 0): %s\n", static_cast<int>(dtrain::Trainer<Model, Policies...>::strategy_kind::name.size()),
                    dtrain::Trainer<Model, Policies...>::strategy_kind::name.data(), memory_text(st.memory).c_str());
      if (st.step == 1 || st.step % c.log_every == 0 || s + 1 == c.steps)
        std::printf("step %5lld/%lld | loss %.4f | lr %.2e | %8.0f samples/s | step %7.2f ms | scale %g%s\n",
                    static_cast<long long>(st.step), static_cast<long long>(c.steps), st.loss, st.lr, sps,
                    st.step_ms, st.loss_scale, st.skipped ? " | skipped (inf/nan)" : "");
    }
    if (!c.save_params.empty()) trainer.save_params(c.save_params);
    std::fflush(stdout);
  };
  if (c.optimizer == "sgd")
    run(dtrain::SGD{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
  else
    run(dtrain::AdamW{.lr = c.lr, .weight_decay = c.weight_decay});
  return 0;
}

template <class Dev, class Kind>
int train_strategy(const Config& c, dtrain::World& world, const dtrain::Dataset& data, std::int64_t classes) {
  using namespace dtrain;
  auto with_accumulate = [&]<class Prec>(std::type_identity<Prec>) {
    switch (c.accumulate) {
      case 1: return train<Device<Dev>, Strategy<Kind>, Prec, Accumulate<1>>(c, world, data, classes);
      case 2: return train<Device<Dev>, Strategy<Kind>, Prec, Accumulate<2>>(c, world, data, classes);
      case 4: return train<Device<Dev>, Strategy<Kind>, Prec, Accumulate<4>>(c, world, data, classes);
      case 8: return train<Device<Dev>, Strategy<Kind>, Prec, Accumulate<8>>(c, world, data, classes);
    }
    throw config_error("accumulate = " + std::to_string(c.accumulate) + " is not built into train_mlp",
                       "use 1, 2, 4 or 8");
  };
  const bool same = c.reduce_dtype == "same";
  if (c.precision == "fp32") return with_accumulate(std::type_identity<Precision<fp32>>{});
  if (c.precision == "bf16")
    return same ? with_accumulate(std::type_identity<Precision<bf16, bf16>>{})
                : with_accumulate(std::type_identity<Precision<bf16>>{});
  if (c.precision == "fp16")
    return same ? with_accumulate(std::type_identity<Precision<fp16, fp16>>{})
                : with_accumulate(std::type_identity<Precision<fp16>>{});
  throw config_error("precision = '" + c.precision + "' is unknown", "use fp32, bf16 or fp16");
}

}  // namespace mlp
