#pragma once
// dtrain's umbrella header and the Trainer: a thin composition of the public
// pieces (communicator, a strategy from strategy/, FlatOptimizer, loss
// scaling) for a user model and compile-time policies.
//
//   auto world = dtrain::init();
//   dtrain::Trainer<MyModel, dtrain::Precision<dtrain::bf16>, dtrain::Accumulate<4>>
//       trainer{world, model, dtrain::AdamW{.lr = 3e-4f}};
//   auto stats = trainer.step(micro_batches);   // exactly Accumulate<N> batches
//
// Strategy<DDP | FSDP<FullShard | ShardGradOp | NoShard | HybridShard> | ZeRO1>
// picks where parameters, gradients and optimizer state live; the Trainer
// drives any of them through the TrainingStrategy hooks.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dtrain/checkpoint/safetensors.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/data/loader.hpp"
#include "dtrain/data/sampler.hpp"
#include "dtrain/device/host.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/optimizer.hpp"
#include "dtrain/kernels/reduce.hpp"
#include "dtrain/launch/init.hpp"
#include "dtrain/model/init.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/any_unit.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/optim/config.hpp"
#include "dtrain/optim/flat_optimizer.hpp"
#include "dtrain/optim/schedule.hpp"
#include "dtrain/policy/policies.hpp"
#include "dtrain/strategy/comm_binding.hpp"
#include "dtrain/strategy/ddp.hpp"
#include "dtrain/strategy/fsdp.hpp"
#include "dtrain/strategy/strategy.hpp"
#include "dtrain/strategy/zero1.hpp"
#include "dtrain/version.hpp"
#if DTRAIN_HAS_CUDA
#include "dtrain/strategy/cuda_binding.hpp"
#endif

namespace dtrain {

// Dynamic loss scaling for fp16 (PyTorch GradScaler's defaults): a step whose
// gradients hold inf/NaN is skipped and the scale shrinks; after `window`
// good steps in a row it grows again.
struct LossScaleOptions {
  float initial = 65536.f;
  float growth = 2.f;
  float backoff = 0.5f;
  std::int64_t window = 2000;
};

struct TrainerOptions {
  std::uint64_t seed = 0;                 // parameter initialisation (checked equal on every rank)
  BucketOptions buckets{};                // DDP's gradient buckets
  ShardingOptions sharding{};             // FSDP and ZeRO1: hybrid group size, prefetch depth
  ClipConfig clip{};                      // max_norm 0: no clipping
  std::optional<Schedule> schedule{};     // absent: the optimizer's constant lr
  LrScaling lr_scaling = LrScaling::none; // scales the schedule by the world size
  LossScaleOptions loss_scale{};
};

struct StepStats {
  std::int64_t step = 0;       // optimizer steps taken, this one included
  double loss = 0.0;           // mean loss over every sample of the step, all ranks
  float lr = 0.f;
  double grad_norm = 0.0;      // global L2 norm of the averaged gradient, before clipping
  bool skipped = false;        // fp16: inf/NaN gradients, step not applied
  float loss_scale = 1.f;
  std::int64_t samples = 0;    // samples in the step over all ranks
  double step_ms = 0.0;
  MemoryUsage memory;          // this rank's bytes by category (Trainer::memory())
};

namespace detail {
// A tuple element of units() is either one unit or a range of identical units
// (std::vector<Block>&, std::span<Block>): N transformer blocks, or the
// runtime-sized layers of an MLP. Units are numbered in order, ranges expanded.
template <class E>
concept unit_range = requires(E& e) {
  std::begin(e);
  std::end(e);
  std::rbegin(e);
};

template <class Tuple, class F>
void for_each_unit(Tuple&& units, F&& f) {
  std::size_t i = 0;
  std::apply([&](auto&... elem) {
    ([&](auto& e) {
      if constexpr (unit_range<std::remove_cvref_t<decltype(e)>>)
        for (auto& u : e) f(i++, u);
      else
        f(i++, e);
    }(elem), ...);
  }, units);
}

template <class Tuple, class F>
void for_each_unit_reverse(Tuple&& units, std::size_t count, F&& f) {
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<Tuple>>;
  std::size_t i = count;
  auto visit = [&](auto& e) {
    if constexpr (unit_range<std::remove_cvref_t<decltype(e)>>)
      for (auto it = std::rbegin(e); it != std::rend(e); ++it) f(--i, *it);
    else
      f(--i, e);
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) { (visit(std::get<n - 1 - I>(units)), ...); }(
      std::make_index_sequence<n>{});
}
}  // namespace detail

template <Model M, class... Policies>
class Trainer {
  using P = policies<Policies...>;

 public:
  using device_type = typename P::device;
  using param_type = typename P::param_type;
  using reduce_type = typename P::reduce_type;
  using strategy_kind = typename P::strategy;
  static constexpr int accumulate = P::accumulate;

 private:
  using Dev = device_type;
  using T = param_type;
  using R = reduce_type;
  using binding = CommBinding<Dev>;
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  using strategy_type = typename strategy_impl<strategy_kind, Dev, T, R, accumulate>::type;
  static_assert(TrainingStrategy<strategy_type, T>,
                "dtrain: the strategy class does not satisfy dtrain::TrainingStrategy (strategy/strategy.hpp)");

  template <OptimizerConfig Opt>
  Trainer(World& world, M& model, Opt optimizer, TrainerOptions options = {})
      : world_(world),
        model_(model),
        options_(validated(std::move(options), optimizer)),
        dev_(make_device(world)),
        layout_(declared_params(model), strategy_type::shard_count(world, options_.sharding)),
        num_units_(layout_.units().size()),
        comm_(binding::make(world_, dev_)),
        strategy_(make_strategy()),
        optimizer_(dev_, optimizer, strategy_->owned().size) {
    scalar_ = make_buffer<float>(dev_, 2);
    if constexpr (P::precision::loss_scaling) loss_scale_ = options_.loss_scale.initial;
  }

  // One optimizer step over exactly Accumulate<N> micro-batches.
  StepStats step(std::span<const Batch> micro_batches) {
    const auto start = std::chrono::steady_clock::now();
    if (micro_batches.size() != static_cast<std::size_t>(accumulate))
      throw config_error("Trainer::step got " + std::to_string(micro_batches.size()) + " micro-batches but the "
                             "policy is Accumulate<" + std::to_string(accumulate) + ">",
                         "pass exactly Accumulate<N> micro-batches per optimizer step");
    double local_samples = 0;
    for (const Batch& b : micro_batches) {
      check_batch(b);
      local_samples += static_cast<double>(b.rows);
    }
    // The loss normaliser (the step's sample count over all ranks) is first
    // needed by the first backward. With one micro-batch the loss is known by
    // then too and shares that all-reduce: each host collective is a round
    // trip through every rank's progress thread and a point where the ranks
    // wait for each other (one fewer took a 2-rank step on 2 cores from 6.0
    // to 5.3 ms, docs/performance.md).
    double samples = 0, local_loss = 0, loss = 0;
    for (int k = 0; k < accumulate; ++k)
      micro_step(micro_batches[static_cast<std::size_t>(k)], k, [&](double micro_loss) {
        local_loss += micro_loss;
        if (k == 0) {
          if constexpr (accumulate == 1) {
            const auto sums = all_reduce_scalars(std::array{local_samples, local_loss});
            samples = sums[0];
            loss = sums[1];
          } else {
            samples = all_reduce_scalars(std::array{local_samples})[0];
          }
        }
        return static_cast<float>(loss_scale_ / samples);
      });
    strategy_->finish_gradients();
    if constexpr (accumulate > 1) loss = all_reduce_scalars(std::array{local_loss})[0];

    StepStats stats;
    stats.samples = static_cast<std::int64_t>(samples);
    stats.loss = loss / samples;
    apply_optimizer(stats);
    stats.step = step_;
    stats.loss_scale = static_cast<float>(loss_scale_);
    stats.memory = memory();
    stats.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }

  // Every parameter as fp32 on the host, by name ("<unit>.<param>").
  // Collective under sharded strategies: every rank must call it.
  std::map<std::string, std::vector<float>> parameters() {
    std::map<std::string, std::vector<float>> out;
    for (std::size_t u = 0; u < num_units_; ++u) {
      const auto& unit = layout_.units()[u];
      std::vector<float> train(unit.train_size);
      std::vector<T> frozen(unit.frozen_size);
      strategy_->read_unit(u, train, frozen);
      for (const auto& slot : unit.params) {
        const auto n = static_cast<std::size_t>(slot.spec.numel());
        std::vector<float> v(n);
        if (slot.spec.trainable) {
          std::copy_n(train.begin() + static_cast<std::ptrdiff_t>(slot.offset - unit.train_offset), n, v.begin());
        } else {
          const auto at = static_cast<std::ptrdiff_t>(slot.offset - unit.frozen_offset);
          for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(frozen[static_cast<std::size_t>(at) + i]);
        }
        out.emplace(slot.name, std::move(v));
      }
    }
    return out;
  }

  // Rank 0 writes every parameter as F32 to a safetensors file (atomically);
  // every rank must call it (sharded parameters are gathered unit by unit),
  // and the file exists on every rank's return.
  void save_params(const std::filesystem::path& path) {
    const auto params = parameters();
    if (world_.rank() == 0) {
      SafetensorsWriter writer;
      for (const auto& unit : layout_.units())
        for (const auto& slot : unit.params)
          writer.add(slot.name, safetensors_dtype::f32, slot.spec.shape,
                     std::as_bytes(std::span(params.at(slot.name))));
      writer.write(path);
    }
    binding::host_barrier(*comm_, dev_);
  }

  // This rank's memory by category, measured by the device's allocator:
  // current bytes of the persistent categories, the peak of the transient
  // ones (gathered, activations).
  MemoryUsage memory() const {
    MemoryUsage m = dev_.memory_by_category();
    const MemoryUsage peak = dev_.peak_memory_by_category();
    m.gathered = peak.gathered;
    m.activations = peak.activations;
    return m;
  }

  Dev& device() { return dev_; }
  const ModelLayout& layout() const { return layout_; }
  World& world() { return world_; }
  strategy_type& strategy() { return *strategy_; }
  FlatOptimizer<Dev>& optimizer() { return optimizer_; }
  std::int64_t steps_taken() const { return step_; }

 private:
  template <class Opt>
  static TrainerOptions validated(TrainerOptions options, const Opt& optimizer) {
    optimizer.validate();
    options.clip.validate();
    if (options.sharding.prefetch < 0)
      throw config_error("ShardingOptions::prefetch = " + std::to_string(options.sharding.prefetch) +
                             " is negative",
                         "set prefetch to 0 (no look-ahead) or more");
    return options;
  }

  static Dev make_device(World& world) {
    if constexpr (requires { Dev(world.local_rank()); } && !std::is_same_v<Dev, Host>)
      return Dev(world.local_rank());
    else
      return Dev();
  }

  static std::vector<std::vector<ParamSpec>> declared_params(M& model) {
    std::vector<std::vector<ParamSpec>> all;
    detail::for_each_unit(model.units(), [&](std::size_t, auto& unit) { all.push_back(unit.params()); });
    return all;
  }

  std::unique_ptr<strategy_type> make_strategy() {
    if (num_units_ == 0) throw config_error("the model has no units", "return at least one unit from units()");
    check_same_model();
    return std::make_unique<strategy_type>(
        StrategyContext<Dev>{world_, dev_, layout_, *comm_, options_.seed, options_.sharding, options_.buckets});
  }

  // Fails on every rank, naming the first parameter where a rank's model
  // differs from rank 0's (shape, trainability or initialisation) or the
  // seed, before any memory is spent on a wrong model.
  void check_same_model() {
    std::string mine;
    for (const auto& line : layout_.signature()) mine += line + "\n";
    const auto all = world_.all_gather_values("model-signature", mine);
    for (int r = 1; r < world_.size(); ++r) {
      const std::string& theirs = all[static_cast<std::size_t>(r)];
      if (theirs == all[0]) continue;
      std::size_t a = 0, b = 0;
      for (;;) {  // first differing line
        const std::size_t ea = all[0].find('\n', a), eb = theirs.find('\n', b);
        const std::string la = ea == std::string::npos ? "" : all[0].substr(a, ea - a);
        const std::string lb = eb == std::string::npos ? "" : theirs.substr(b, eb - b);
        if (la != lb)
          throw config_error("rank " + std::to_string(r) + " built a different model than rank 0: first difference " +
                                 "at parameter '" + (lb.empty() ? "<missing>" : lb) + "' where rank 0 has '" +
                                 (la.empty() ? "<missing>" : la) + "'",
                             "every rank must construct the same model (same config, same code)");
        a = ea + 1;
        b = eb + 1;
      }
    }
    world_.check_agree("TrainerOptions::seed", std::to_string(options_.seed));
  }

  void check_batch(const Batch& b) const {
    if (b.rows < 1 || b.features < 1 || b.x.size() != static_cast<std::size_t>(b.rows * b.features) ||
        b.y.size() != static_cast<std::size_t>(b.rows))
      throw config_error("a micro-batch has rows=" + std::to_string(b.rows) + ", features=" +
                             std::to_string(b.features) + ", x of " + std::to_string(b.x.size()) + " and y of " +
                             std::to_string(b.y.size()) + " elements",
                         "every micro-batch needs at least one row, x of rows*features and y of rows elements");
  }

  // Sums host scalars over ranks in one collective, in fp32 (as every
  // rank's copy must round alike).
  template <std::size_t N>
  std::array<double, N> all_reduce_scalars(std::array<double, N> values) {
    std::array<float, N> f{};
    for (std::size_t i = 0; i < N; ++i) f[i] = static_cast<float>(values[i]);
    dev_.copy_from_host(scalar_.data(), f.data(), N);
    auto w = binding::all_reduce(*comm_, dev_, scalar_.span().first(N), reduce_op::sum);
    binding::join(w, dev_);
    dev_.copy_to_host(f.data(), scalar_.data(), N);
    for (std::size_t i = 0; i < N; ++i) values[i] = f[i];
    return values;
  }

  template <class E>
  void ensure(buffer<E>& b, std::size_t n) {
    if (b.size() < n) b = make_buffer<E>(dev_, n, memory_category::activations);
  }

  // Forward and backward of one micro-batch. after_forward(its summed loss)
  // runs between the two and returns the dlogits scale.
  template <class AfterForward>
  void micro_step(const Batch& batch, int k, AfterForward&& after_forward) {
    auto units = model_.units();
    const std::int64_t rows = batch.rows;
    // Every unit's width follows from the input width alone: worked out once.
    if (width_.empty() || width_[0] != batch.features) {
      width_.assign(1, batch.features);
      detail::for_each_unit(units, [&](std::size_t, auto& u) { width_.push_back(u.out_features(width_.back())); });
      activations_.resize(num_units_ + 1);
    }
    const auto& width = width_;
    const std::int64_t widest = *std::max_element(width.begin(), width.end());

    for (std::size_t u = 0; u <= num_units_; ++u) ensure(activations_[u], static_cast<std::size_t>(rows * width[u]));
    for (auto& d : dgrad_) ensure(d, static_cast<std::size_t>(rows * widest));
    ensure(labels_, static_cast<std::size_t>(rows));

    if constexpr (std::is_same_v<T, float>) {
      dev_.copy_from_host(activations_[0].data(), batch.x.data(), batch.x.size());
    } else {
      staging_.resize(batch.x.size());
      for (std::size_t i = 0; i < batch.x.size(); ++i) staging_[i] = T(batch.x[i]);
      dev_.copy_from_host(activations_[0].data(), staging_.data(), staging_.size());
    }
    dev_.copy_from_host(labels_.data(), batch.y.data(), batch.y.size());

    auto act = [&](std::size_t u) { return activations_[u].view(rows, width[u]); };
    auto& s = *strategy_;
    detail::for_each_unit(units, [&](std::size_t u, auto& unit) {
      s.before_forward(u, k);
      unit.template forward<Dev, T>(dev_, s.params(u), act(u), act(u + 1));
      s.after_forward(u, k);
    });
    const std::span<const std::int32_t> labels(labels_.data(), static_cast<std::size_t>(rows));
    const MatView<const T> logits = act(num_units_);
    const float dlogit_scale = after_forward(model_.loss.template forward<Dev, T>(dev_, logits, labels));
    std::size_t cur = 0;
    model_.loss.template backward<Dev, T>(dev_, logits, labels, dgrad_[cur].view(rows, width[num_units_]),
                                          dlogit_scale);

    detail::for_each_unit_reverse(units, num_units_, [&](std::size_t u, auto& unit) {
      const MatView<T> dx = u == 0 ? MatView<T>{} : dgrad_[1 - cur].view(rows, width[u]);
      s.before_backward(u, k);
      unit.template backward<Dev, T>(dev_, s.params(u), s.grads(u), act(u), act(u + 1),
                                     dgrad_[cur].view(rows, width[u + 1]), dx);
      s.after_backward(u, k);
      cur = 1 - cur;
    });
  }

  void apply_optimizer(StepStats& stats) {
    const double norm2 = strategy_->grad_norm_squared();
    stats.grad_norm = std::sqrt(norm2) / loss_scale_;
    if constexpr (P::precision::loss_scaling) {
      if (!std::isfinite(norm2)) {
        stats.skipped = true;
        loss_scale_ *= options_.loss_scale.backoff;
        good_steps_ = 0;
        stats.lr = current_lr();
        return;
      }
      if (++good_steps_ == options_.loss_scale.window) {
        loss_scale_ *= options_.loss_scale.growth;
        good_steps_ = 0;
      }
    }
    const double max_norm = options_.clip.max_norm;
    const double coef = max_norm > 0 && stats.grad_norm > max_norm ? max_norm / (stats.grad_norm + 1e-6) : 1.0;
    stats.lr = current_lr();
    ++step_;
    const OwnedFlat<T> owned = strategy_->owned();
    optimizer_.step(owned.master, owned.grad, owned.param_out,
                    {stats.lr, step_, static_cast<float>(coef / loss_scale_)});
    strategy_->after_optimizer();
  }

  float current_lr() const {
    const float base = options_.schedule ? (*options_.schedule)(step_) : optimizer_.base_lr();
    return scale_lr(base, options_.lr_scaling, world_.size());
  }

  World& world_;
  M& model_;
  TrainerOptions options_;
  Dev dev_;
  ModelLayout layout_;
  std::size_t num_units_;
  std::unique_ptr<typename binding::comm_type> comm_;  // the whole world's (scalars; strategies build on it)
  std::unique_ptr<strategy_type> strategy_;
  FlatOptimizer<Dev> optimizer_;

  buffer<float> scalar_;  // staging for the scalar all-reduces (sample count, loss)
  std::vector<std::int64_t> width_;  // width_[u]: the input width of unit u; width_.back(): the logits
  std::vector<buffer<T>> activations_;
  buffer<T> dgrad_[2];
  buffer<std::int32_t> labels_;
  std::vector<T> staging_;

  double loss_scale_ = 1.0;
  std::int64_t good_steps_ = 0;
  std::int64_t step_ = 0;
};

}  // namespace dtrain
