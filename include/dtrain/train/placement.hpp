#pragma once
// Where a Trainer's optimizer runs: on the compute device, over the flat the
// strategy owns there; or with Offload<...> (TrainerOptions::offload) on the
// offload arena's host, over the flat the strategy keeps there, its state in
// host memory or in files on a local disk (TrainerOptions::offload_dir).
// Everything else about a step is the same either way.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/offload/arena.hpp"
#include "dtrain/optim/config.hpp"
#include "dtrain/optim/flat_optimizer.hpp"
#include "dtrain/optim/param_groups.hpp"
#include "dtrain/strategy/any_strategy.hpp"
#include "dtrain/train/options.hpp"

namespace dtrain {

template <class Dev, class T>
class OptimizerPlacement {
 public:
  // The arena for TrainerOptions::offload (null without one), checked
  // against what the strategy can offload. Made before the strategy, which
  // keeps its owned flat in it.
  static std::unique_ptr<OffloadArena<Dev>> make_arena(Dev& dev, const TrainerOptions& options,
                                                       const StrategyFactory<Dev, T>& factory);

  // The optimizer over the strategy's owned flat, with every element's
  // parameter group when there is more than one.
  template <Optimizer Opt>
  OptimizerPlacement(Dev& dev, Opt optimizer, AnyStrategy<T>& strategy, OffloadArena<Dev>* arena,
                     const ModelLayout& layout, const GroupPlan& groups)
      : strategy_(strategy), arena_(arena) {
    const OwnedFlat<T> owned = strategy.owned();
    std::vector<GroupRate> rates;
    for (const GroupSettings& g : groups.groups)
      rates.push_back({static_cast<float>(static_cast<double>(g.lr) / optimizer.lr), g.weight_decay});
    std::vector<std::uint8_t> ids;
    if (groups.size() > 1) ids = element_groups(layout, groups, strategy.ownership().trainable, owned.size);
    if (owned.on_host && arena->state_on_disk()) {
      arena->check_state_space(optimizer.state_names().size() * owned.size * sizeof(float));
      host_.emplace(arena->host(), std::move(optimizer), owned.size, std::move(rates), ids,
                    [arena](std::size_t n) { return arena->allocate_state_file(n); });
    } else if (owned.on_host) {
      host_.emplace(arena->host(), std::move(optimizer), owned.size, std::move(rates), ids);
    } else {
      device_.emplace(dev, std::move(optimizer), owned.size, std::move(rates), ids);
    }
  }

  // One pass over the owned flat: master weights and state updated, the
  // compute-dtype copy written.
  void step(const OptimizerStep& s);

  // The state buffers (on the host when offloaded), for checkpoints.
  std::vector<OptimizerStateView> state() { return host_ ? host_->state() : device_->state(); }
  std::string_view name() const { return host_ ? host_->name() : device_->name(); }
  float base_lr() const { return host_ ? host_->base_lr() : device_->base_lr(); }

 private:
  AnyStrategy<T>& strategy_;
  OffloadArena<Dev>* arena_;
  std::optional<FlatOptimizer<Dev>> device_;                                    // on the compute device
  std::optional<FlatOptimizer<typename OffloadArena<Dev>::host_device>> host_;  // offloaded: on the arena's host
};

template <class Dev, class T>
auto OptimizerPlacement<Dev, T>::make_arena(Dev& dev, const TrainerOptions& options,
                                            const StrategyFactory<Dev, T>& factory)
    -> std::unique_ptr<OffloadArena<Dev>> {
  const offload_kind want = options.offload;
  if (want == offload_kind::none && !options.offload_dir.empty())
    throw config_error(
        "TrainerOptions::offload_dir is set ('" + options.offload_dir.string() + "') but nothing is offloaded",
        "set TrainerOptions::offload (optimizer or params) too, or clear offload_dir");
  if (want == offload_kind::none) return nullptr;
  if (static_cast<int>(want) > static_cast<int>(factory.max_offload)) {
    const std::string have = factory.max_offload == offload_kind::none
                                 ? std::string("offloads nothing")
                                 : "offloads at most '" + std::string(offload_name(factory.max_offload)) + "'";
    throw config_error("offload '" + std::string(offload_name(want)) + "' with strategy '" + std::string(factory.name) +
                           "', which " + have,
                       want == offload_kind::params
                           ? "offload parameter shards with a strategy that shards parameters (fsdp-full, "
                             "fsdp-grad-op, fsdp-no-shard, fsdp-hybrid), or offload only the optimizer state"
                           : "use a strategy that declares max_offload (ddp, zero1 and the fsdp modes do)");
  }
  auto arena = std::make_unique<OffloadArena<Dev>>(dev, want);
  if (!options.offload_dir.empty()) arena->use_state_dir(options.offload_dir);
  return arena;
}

template <class Dev, class T>
auto OptimizerPlacement<Dev, T>::step(const OptimizerStep& s) -> void {
  const OwnedFlat<T> owned = strategy_.owned();
  if (host_) {
    host_->step(owned.master, owned.grad, owned.param_out, s);
    if (arena_->state_on_disk()) arena_->after_state_pass();
  } else {
    device_->step(owned.master, owned.grad, owned.param_out, s);
  }
}

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
// The constructor is a template over the optimizer: the built-in ones' too.
#define DTRAIN_PLACEMENT_CTOR_TEMPLATE(X, Dev, T, Opt)                                                                 \
  X(OptimizerPlacement<Dev, T>::OptimizerPlacement(Dev&, Opt, AnyStrategy<T>&, OffloadArena<Dev>*, const ModelLayout&, \
                                                   const GroupPlan&))
#define DTRAIN_PLACEMENT_TEMPLATES(X, Dev, T) \
  X(class OptimizerPlacement<Dev, T>) DTRAIN_FOR_EACH_OPTIMIZER(DTRAIN_PLACEMENT_CTOR_TEMPLATE, X, Dev, T)

}  // namespace dtrain
