#pragma once
// An optimizer over one flat fp32 buffer: the optimizer state that goes with
// whatever flat a strategy owns on this rank (the whole model under DDP, the
// rank's shards under FSDP and ZeRO1), and the fused pass that updates it.
//
//   dtrain::FlatOptimizer<dtrain::Host> opt(dev, dtrain::AdamW{.lr = 1e-3f}, owned_size);
//   opt.step(master, grad, param_out_or_null, {.lr = lr, .step = 1, .grad_scale = 1.f});
//
// Any type modelling dtrain::Optimizer (optim/config.hpp) goes in; the type
// is erased here, so a Trainer compiles once whatever optimizer it is given.
// Elements can belong to parameter groups (param_groups.hpp), each with its
// own rate factor and weight decay. Public so a hand-written loop can pair
// it with ShardedParams/ShardReducer.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/kernels/optimizer.hpp"
#include "dtrain/optim/config.hpp"
#include "dtrain/optim/lion.hpp"

namespace dtrain {

// What changes from one step to the next.
struct OptimizerStep {
  float lr = 0.f;          // the default group's rate; group k runs at lr x its factor
  std::int64_t step = 1;   // optimizer steps taken, this one included (AdamW bias correction)
  float grad_scale = 1.f;  // multiplies every gradient as it is read: 1/loss_scale x clip coefficient
};

// A named view of one optimizer-state buffer (for checkpoints).
struct OptimizerStateView {
  std::string_view name;  // "exp_avg", "exp_avg_sq", "momentum_buffer" (PyTorch's names)
  float* data;
};

// One group's settings as the pass applies them.
struct GroupRate {
  float lr_factor = 1.f;  // the group's lr over the optimizer's
  float weight_decay = 0.f;
};

template <class Dev>
class FlatOptimizer {
 public:
  // Validates the config and allocates zeroed state for `size` elements.
  // `element_groups`, when not empty, gives every element's group (an index
  // into `groups`, which then has one entry per group; empty: one group
  // with the optimizer's weight_decay).
  // `state_allocator`, when set, provides the state buffers instead of the
  // device's allocator.
  template <Optimizer Opt>
  FlatOptimizer(Dev& dev, Opt config, std::size_t size, std::vector<GroupRate> groups = {},
                const std::vector<std::uint8_t>& element_groups = {}, const StateAllocator& state_allocator = {});

  std::string_view name() const { return name_; }
  std::size_t size() const { return size_; }
  float base_lr() const { return base_lr_; }
  const std::vector<GroupRate>& groups() const { return groups_; }

  // One pass over the flat: reads the gradient once, updates master weights
  // and state, and writes T(param) into param_out when it is not null.
  template <Dtype T>
  void step(float* master, const float* grad, T* param_out, const OptimizerStep& s) {
    if (size_ == 0) return;
    impl_->step(*this, Pass<T>{master, grad, param_out, s});
  }

  // The state buffers, each `size()` elements, in the flat's order.
  std::vector<OptimizerStateView> state() {
    std::vector<OptimizerStateView> out;
    for (std::size_t k = 0; k < state_ptrs_.size(); ++k) out.push_back({state_names_[k], state_ptrs_[k]});
    return out;
  }

  // fp32 state buffers a config keeps per element (AdamW 2, SGD 1 with momentum).
  template <Optimizer Opt>
  static std::size_t state_buffers(const Opt& c) {
    return c.state_names().size();
  }

 private:
  template <class T>
  struct Pass {
    float* master;
    const float* grad;
    T* param_out;
    OptimizerStep s;
  };

  struct Concept {
    virtual ~Concept() = default;
    virtual void step(FlatOptimizer&, const Pass<float>&) const = 0;
    virtual void step(FlatOptimizer&, const Pass<bf16>&) const = 0;
    virtual void step(FlatOptimizer&, const Pass<fp16>&) const = 0;
  };

  template <class Opt>
  struct Model final : Concept {
    explicit Model(Opt c) : config(std::move(c)) {}
    // Defined below the class: the built-in optimizers' passes then come
    // from dtrain::runtime under separate compilation (extern template).
    void step(FlatOptimizer& o, const Pass<float>& p) const override;
    void step(FlatOptimizer& o, const Pass<bf16>& p) const override;
    void step(FlatOptimizer& o, const Pass<fp16>& p) const override;
    Opt config;
  };

  template <class Opt, class T>
  void run(const Opt& config, const Pass<T>& p) {
    using C = typename Opt::coefficients;
    C table[max_param_groups];
    for (std::size_t g = 0; g < groups_.size(); ++g)
      table[g] = config.coefficients_for(
          {static_cast<float>(static_cast<double>(p.s.lr) * groups_[g].lr_factor), groups_[g].weight_decay, p.s.step});
    // The group ids and the state count become template arguments (see
    // GroupedStep): one instantiation per case, none with a branch inside.
    const auto launch = [&]<bool Grouped, std::size_t States>() {
      typename GroupedStep<Opt, T, Grouped, States>::Buffers b{};
      b.param = p.master;
      b.grad = p.grad;
      for (std::size_t k = 0; k != States; ++k) b.state[k] = state_ptrs_[k];
      b.param_out = p.param_out;
      b.group = Grouped ? ids_.data() : nullptr;
      dev_.for_each(size_, GroupedStep<Opt, T, Grouped, States>(b, table, groups_.size(), p.s.grad_scale));
    };
    const auto with_states = [&]<bool Grouped>() {
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        ((state_ptrs_.size() == K && (launch.template operator()<Grouped, K>(), true)) || ...);
      }
      (std::make_index_sequence<Opt::max_states + 1>{});
    };
    if constexpr (Dev::host_accessible) {
      if (!runs_.empty()) {
        for (const Run& r : runs_) {
          const auto run_pass = [&]<std::size_t States>() {
            typename GroupedStep<Opt, T, false, States>::Buffers b{};
            b.param = p.master + r.offset;
            b.grad = p.grad + r.offset;
            for (std::size_t k = 0; k != States; ++k) b.state[k] = state_ptrs_[k] + r.offset;
            b.param_out = p.param_out != nullptr ? p.param_out + r.offset : nullptr;
            dev_.for_each(r.count, GroupedStep<Opt, T, false, States>(b, &table[r.group], 1, p.s.grad_scale));
          };
          [&]<std::size_t... K>(std::index_sequence<K...>) {
            ((state_ptrs_.size() == K && (run_pass.template operator()<K>(), true)) || ...);
          }
          (std::make_index_sequence<Opt::max_states + 1>{});
        }
        return;
      }
      // Several groups always make runs on the host: the per-element group
      // lookup is the device's alone, and is not compiled here.
      with_states.template operator()<false>();
    } else {
      if (groups_.size() > 1)
        with_states.template operator()<true>();
      else
        with_states.template operator()<false>();
    }
  }

  Dev& dev_;
  std::size_t size_;
  std::string_view name_;
  float base_lr_;
  std::vector<GroupRate> groups_;
  std::vector<std::string> state_names_;                      // the config's, copied: OptimizerStateView points here
  std::vector<typename Dev::template buffer<float>> states_;  // from the device's allocator
  std::vector<std::shared_ptr<void>> state_owners_;           // from a StateAllocator
  std::vector<float*> state_ptrs_;                            // each state buffer, whichever holds it
  typename Dev::template buffer<std::uint8_t> ids_;           // device: each element's group
  struct Run {
    std::size_t offset, count;
    std::uint8_t group;
  };
  std::vector<Run> runs_;  // host: the elements' groups as runs
  std::unique_ptr<Concept> impl_;
};

template <class Dev>
template <Optimizer Opt>
FlatOptimizer<Dev>::FlatOptimizer(Dev& dev, Opt config, std::size_t size, std::vector<GroupRate> groups,
                                  const std::vector<std::uint8_t>& element_groups,
                                  const StateAllocator& state_allocator)
    : dev_(dev), size_(size), name_(Opt::name), base_lr_(config.lr) {
  config.validate();
  if (groups.empty()) groups.push_back({1.f, config.weight_decay});
  if (groups.size() > max_param_groups)
    throw config_error(std::to_string(groups.size()) + " parameter groups",
                       "use at most " + std::to_string(max_param_groups));
  if (!element_groups.empty() && element_groups.size() != size)
    throw config_error("FlatOptimizer: " + std::to_string(element_groups.size()) + " group ids for " +
                           std::to_string(size) + " elements",
                       "give one group id per element of the flat, or none");
  for (const auto id : element_groups)
    if (id >= groups.size())
      throw config_error(
          "FlatOptimizer: group id " + std::to_string(id) + " with " + std::to_string(groups.size()) + " groups",
          "ids index the groups given");
  groups_ = std::move(groups);
  for (const std::string_view n : config.state_names()) {
    state_names_.emplace_back(n);
    if (state_allocator) {
      StateStorage st = state_allocator(size);
      state_ptrs_.push_back(st.data);
      state_owners_.push_back(std::move(st.owner));
    } else {
      states_.push_back(make_buffer<float>(dev_, size, zero_init, memory_category::optimizer));
      state_ptrs_.push_back(states_.back().data());
    }
  }
  if (state_names_.size() > Opt::max_states)
    throw config_error(std::string(Opt::name) + " names " + std::to_string(state_names_.size()) +
                           " state buffers but declares max_states = " + std::to_string(Opt::max_states),
                       "make state_names() and max_states agree");
  if (groups_.size() > 1 && size > 0) {
    const std::vector<std::uint8_t> ids = element_groups.empty() ? std::vector<std::uint8_t>(size) : element_groups;
    if constexpr (Dev::host_accessible) {
      // On the host, runs of one group each: every run's pass is the
      // one-group loop, which vectorises (a per-element table lookup
      // does not).
      for (std::size_t i = 0; i < size;) {
        std::size_t j = i;
        while (j < size && ids[j] == ids[i]) ++j;
        runs_.push_back({i, j - i, ids[i]});
        i = j;
      }
    } else {
      ids_ = make_buffer<std::uint8_t>(dev_, size, memory_category::optimizer);
      dev_.copy_from_host(ids_.data(), ids.data(), size);
    }
  }
  impl_ = std::make_unique<Model<Opt>>(std::move(config));
}

template <class Dev>
template <class Opt>
void FlatOptimizer<Dev>::Model<Opt>::step(FlatOptimizer& o, const Pass<float>& p) const {
  o.run(config, p);
}
template <class Dev>
template <class Opt>
void FlatOptimizer<Dev>::Model<Opt>::step(FlatOptimizer& o, const Pass<bf16>& p) const {
  o.run(config, p);
}
template <class Dev>
template <class Opt>
void FlatOptimizer<Dev>::Model<Opt>::step(FlatOptimizer& o, const Pass<fp16>& p) const {
  o.run(config, p);
}

// The built-in optimizers: M(args..., Opt) for each, the arguments after M
// first (as DTRAIN_FOR_EACH_DTYPE).
#define DTRAIN_FOR_EACH_OPTIMIZER(M, ...) M(__VA_ARGS__, AdamW) M(__VA_ARGS__, SGD) M(__VA_ARGS__, Lion)
// The built-in optimizers' passes (every precision; on the host every ISA
// level), compiled once by each backend (train/builtin_templates.hpp gathers
// the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_FLAT_OPTIMIZER_TEMPLATES(X, Dev, Opt)                                  \
  X(struct FlatOptimizer<Dev>::Model<Opt>)                                            \
  X(FlatOptimizer<Dev>::FlatOptimizer(Dev&, Opt, std::size_t, std::vector<GroupRate>, \
                                      const std::vector<std::uint8_t>&, const StateAllocator&))

}  // namespace dtrain
