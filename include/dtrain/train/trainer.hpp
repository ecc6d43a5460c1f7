#pragma once
// The Trainer: the training loop over a user model and a strategy, as an
// orchestrator over parts that each own one concern:
//   UnitPipeline        (train/pipeline.hpp)  a micro-batch through the units
//   StepGuard           (train/step_guard.hpp) loss scale, non-finite policy, clipping
//   OptimizerPlacement  (train/placement.hpp) the optimizer, on the device or offloaded
//   Evaluator           (train/evaluator.hpp) evaluate and predict
//   RankSums            (train/rank_sums.hpp) the step's scalars over ranks
//   CheckpointIO        (checkpoint/state_io.hpp) checkpoints and parameter files
// the strategies reached through AnyStrategy (strategy/), the ranks' checks
// through typed messages (World::agree). The umbrella header
// <dtrain/trainer.hpp> includes all of it.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/checkpoint/state_io.hpp"
#include "dtrain/comm/binding.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/launch/env.hpp"
#include "dtrain/metrics/metric.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/offload/arena.hpp"
#include "dtrain/optim/config.hpp"
#include "dtrain/optim/flat_optimizer.hpp"
#include "dtrain/policy/policies.hpp"
#include "dtrain/strategy/any_strategy.hpp"
#include "dtrain/strategy/strategy.hpp"
#include "dtrain/train/evaluator.hpp"
#include "dtrain/train/model_check.hpp"
#include "dtrain/train/options.hpp"
#include "dtrain/train/pipeline.hpp"
#include "dtrain/train/placement.hpp"
#include "dtrain/train/rank_sums.hpp"
#include "dtrain/train/step_guard.hpp"

namespace dtrain {

// Everything a Trainer does, compiled once per (model, device, precision):
// the strategy is reached through AnyStrategy and the micro-batch count is a
// run-time value, so Trainers that differ only in Strategy<...> or
// Accumulate<N> share this body. Trainer<M, Policies...> is this with its
// strategy and count fixed by the policies; a program that reads them from a
// config file constructs a TrainerCore itself:
//
//   dtrain::TrainerCore<Model, dtrain::Host, dtrain::Precision<dtrain::bf16>> trainer{
//       world, model, dtrain::AdamW{}, options, accumulate,
//       dtrain::strategy_factory<dtrain::FSDP<dtrain::FullShard>, dtrain::Host, dtrain::bf16, float>()};
template <Model M, class Dev, class Prec>
class TrainerCore {
 public:
  using device_type = Dev;
  using precision = Prec;
  using param_type = typename Prec::param_type;
  using reduce_type = typename Prec::reduce_type;

 private:
  using T = param_type;
  using R = reduce_type;
  using binding = CommBinding<Dev>;

 public:
  // `accumulate`: micro-batches per optimizer step (>= 1). `strategy`: see
  // strategy_factory (strategy/any_strategy.hpp).
  template <Optimizer Opt>
  TrainerCore(World& world, M& model, Opt optimizer, TrainerOptions options, int accumulate,
              StrategyFactory<Dev, T> strategy)
      : accumulate_(checked_accumulate(accumulate)),
        world_(world),
        model_(model),
        options_(validated(std::move(options), optimizer)),
        dev_(make_device(world)),
        layout_(declared_params(model), checked_factory(strategy).shard_count(world)),
        comm_(binding::make(world_, dev_)),
        offload_(OptimizerPlacement<Dev, T>::make_arena(dev_, options_, strategy)),
        strategy_(make_strategy(strategy)),
        groups_(plan_groups(layout_, options_.param_groups, optimizer.lr, optimizer.weight_decay)),
        optimizer_(dev_, std::move(optimizer), *strategy_, offload_.get(), layout_, groups_),
        guard_(options_, Prec::loss_scaling),
        state_(guard_.initial_state()),
        sums_(dev_, *comm_),
        pipeline_(model_, dev_, layout_, *strategy_,
                  {.seed = options_.seed,
                   .rank = world_.rank(),
                   .recompute = {.on = options_.activation_checkpointing,
                                 .every = options_.checkpoint_every,
                                 .units = options_.checkpoint_units,
                                 .budget_bytes = options_.checkpoint_budget_bytes}}),
        evaluator_(world_, pipeline_, sums_, model_),
        io_(world_, dev_, layout_, *strategy_, [this] { return optimizer_.state(); }) {}

  // One optimizer step over exactly Accumulate<N> micro-batches.
  //
  // Uneven data: a rank that has run out of batches keeps calling step()
  // with empty micro-batches (x with B = 0 rows) while any other rank has
  // data. It runs the same collectives as the others, contributes zero
  // gradients and a zero count to the loss normaliser, so the update is the
  // one the remaining data alone gives. The first step in which no rank has
  // a sample changes nothing and reports samples == 0 on every rank: the
  // signal for all of them to stop together (docs/reliability.md, "Uneven data").
  StepStats step(std::span<const Batch> micro_batches) {
    const auto start = std::chrono::steady_clock::now();
    const std::uint64_t waited_before = collective_wait_ns();
    if (micro_batches.size() != static_cast<std::size_t>(accumulate_))
      throw config_error("Trainer::step got " + std::to_string(micro_batches.size()) +
                             " micro-batches but the "
                             "policy is Accumulate<" +
                             std::to_string(accumulate_) + ">",
                         "pass exactly Accumulate<N> micro-batches per optimizer step");
    // The loss normaliser: what the loss counts (samples, or targets not
    // ignored) over every micro-batch and rank, known from the host batches
    // before any compute, so uneven micro-batches weigh exactly right.
    double local_count = 0, local_samples = 0, local_positions = 0;
    detail::take_loss_metrics(model_.loss);  // the loss's figures from this step's forwards only
    for (const Batch& b : micro_batches) {
      const SeqShape shape = pipeline_.check_batch(b);
      local_count += model_.loss.count(b);
      local_samples += static_cast<double>(shape.batch);
      local_positions += static_cast<double>(shape.rows());
    }
    // The normaliser is first needed by the first backward. With one
    // micro-batch the loss is known by then too and shares that all-reduce:
    // each host collective is a round trip through every rank's progress
    // thread and a point where the ranks wait for each other (one fewer took
    // a 2-rank step on 2 cores from 6.0 to 5.3 ms, docs/performance.md).
    // The stop request (preemption) rides along: every rank learns in this
    // step whether any rank asked, at no extra collective.
    double count = 0, samples = 0, positions = 0, local_loss = 0, loss = 0;
    bool stop_agreed = false;
    for (int k = 0; k < accumulate_; ++k)
      pipeline_.train(micro_batches[static_cast<std::size_t>(k)], state_.step + 1, k, [&](double micro_loss) {
        local_loss += micro_loss;
        if (k == 0) {
          const double stop = stop_request_ ? 1.0 : 0.0;
          std::array<double, 5> all{};
          if (accumulate_ == 1) {
            all = sums_.sum_step(std::array{local_count, local_samples, local_positions, stop, local_loss});
            loss = all[4];
          } else {
            const auto four = sums_.sum_step(std::array{local_count, local_samples, local_positions, stop});
            std::copy(four.begin(), four.end(), all.begin());
          }
          count = all[0], samples = all[1], positions = all[2];
          stop_agreed = all[3] > 0;
          if (count <= 0 && samples > 0)
            throw config_error("the step's loss counts no targets on any rank (every target ignored, or zero weights)",
                               "check the batches' targets: a step needs at least one target to learn from");
        }
        return count > 0 ? static_cast<float>(state_.loss_scale / count) : 0.f;
      });
    strategy_->finish_gradients();
    if (accumulate_ > 1) loss = sums_.sum_step(std::array{local_loss})[0];

    StepStats stats;
    stats.samples = static_cast<std::int64_t>(samples);
    stats.positions = static_cast<std::int64_t>(positions);
    stats.count = count;
    if (samples > 0) {
      stats.loss = loss / count;
      update(stats);
    } else {  // every rank has run out: nothing to learn from, no update, the step is not counted
      stats.loss = stats.grad_norm = std::numeric_limits<double>::quiet_NaN();
      stats.lr = current_lr();
    }
    stats.metrics = loss_metrics();
    stats.step = state_.step;
    stats.stop_requested = stop_agreed;
    stats.loss_scale = static_cast<float>(state_.loss_scale);
    stats.memory = memory();
    stats.host_memory = host_memory();
    stats.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    stats.wait_ms = static_cast<double>(collective_wait_ns() - waited_before) / 1e6;
    return stats;
  }

  // Forward only over `batches` (no gradient, no update): the mean loss
  // (their summed losses over every rank, divided by the loss's count) and
  // each metric's value (metrics/metric.hpp: a metric sees every batch with
  // the model's output and adds named sums; they are summed over ranks),
  // and the loss's own figures (LossMetricSums) beside them. Collective:
  // every rank calls it with its own batches (possibly none).
  EvalResult evaluate(std::span<const Batch> batches, std::span<const Metric> metrics = {}) {
    detail::take_loss_metrics(model_.loss);
    EvalResult r = evaluator_.evaluate(batches, metrics, state_.step + 1);
    for (const StepStats::Metric& m : loss_metrics()) r.metrics[m.name] = m.value;
    return r;
  }

  // The model's output for one batch (the loss's input: logits for a
  // language model), [rows, width] row-major as fp32 on the host, forward
  // only: no gradient, no loss, no optimizer. The batch needs no targets.
  // Collective like evaluate.
  std::vector<float> predict(const Batch& batch) { return evaluator_.predict(batch, state_.step + 1); }

  // Each sequence's log-probability of its targets (batch tensor "y" [S, T]
  // of token ids, -100 off the scored tokens), summed over its scored
  // tokens, and how many it has: forward only, like predict. With
  // {.adapters = false} the model runs without its LoRA adapters: the
  // frozen base, DPO's reference with no second copy. Collective.
  nn::SequenceLogps sequence_logps(const Batch& batch, const SequenceLogpsOptions& o = {}) {
    return evaluator_.sequence_logps(batch, state_.step + 1, o);
  }

  // The loss's own figures since they were last taken, each summed over the
  // ranks and divided by their summed count (one all-reduce; none, and no
  // collective, for a loss without figures). Collective.
  std::vector<StepStats::Metric> loss_metrics() {
    const LossMetricSums m = detail::take_loss_metrics(model_.loss);
    if (m.sums.empty()) return {};
    std::vector<double> local{m.count};
    for (const LossSum& v : m.sums) local.insert(local.end(), {v.sum, v.count, v.square_sum});
    const std::vector<double> all = sums_.sum(std::move(local));
    std::vector<StepStats::Metric> out;
    for (std::size_t i = 0; i < m.sums.size(); ++i) {
      const LossSum& v = m.sums[i];
      const double sum = all[3 * i + 1], n = v.count >= 0 ? all[3 * i + 2] : all[0], sq = all[3 * i + 3];
      double value = n > 0 ? sum / n : 0.0;
      if (v.square_sum >= 0) value = n > 1 ? std::sqrt(std::max(0.0, (sq - sum * sum / n) / (n - 1))) : 0.0;
      out.push_back({v.name, value, v.logged, v.label});
    }
    return out;
  }

  // The model's output rows `rows` of `batch` (sequence b's position t is
  // row b * T + t), [rows.size(), width] as fp32, forward only. With
  // {.cache_positions = N} the forward runs with a key-value cache of N
  // positions per sequence (the batch's rows are new tokens at its
  // "position_ids"; the cache persists between calls until
  // release_kv_cache): dtrain::generate (train/generate.hpp) drives it.
  // Collective.
  std::vector<float> decode(const Batch& batch, std::span<const std::int64_t> rows, DecodeOptions mode = {}) {
    return evaluator_.decode(batch, state_.step + 1, rows, mode);
  }
  void release_kv_cache() { evaluator_.release_kv_cache(); }

  // ---- checkpoints and parameter files (CheckpointIO; all collective) ----

  // Every parameter as fp32 on the host, by name ("<unit>.<param>").
  std::map<std::string, std::vector<float>> parameters() { return io_.parameters(); }
  // f(slot, values) for every parameter in layout order, fp32 on the host,
  // one unit gathered at a time; every rank's f sees all.
  template <class F>
  void visit_parameters(F&& f) {
    io_.visit_parameters(std::forward<F>(f));
  }
  // Every parameter as F32 in one safetensors file (atomically), streamed by
  // rank 0 while the units are gathered one by one.
  void save_params(const std::filesystem::path& path) { io_.save_params(path); }
  // A resumable checkpoint in `dir` (a new directory, or one a save that died
  // left without an index): every rank writes what it owns, rank 0 commits
  // the index last. A directory that holds a checkpoint is never overwritten.
  void save(const std::filesystem::path& dir, const SaveOptions& options = {}) { io_.save(dir, options, describe()); }
  // Restores a checkpoint saved by any strategy at any world size (checked
  // against this model before anything changes). Restore the sampler with
  // info.sampler->state_for(sampler).
  CheckpointInfo load(const std::filesystem::path& dir, const LoadOptions& options = {}) {
    CheckpointInfo info = io_.load(dir, options);
    state_ = {info.step, info.loss_scale, info.good_steps};
    return info;
  }
  // Parameters from a safetensors file (F32, BF16 or F16 tensors named
  // "<unit>.<param>", or renamed through options.rename), or from several
  // files (how dtrain/hf reads a transformers checkpoint), at any world size
  // and strategy. Optimizer state and step are left alone.
  LoadParamsReport load_params(const std::filesystem::path& file, const LoadParamsOptions& options = {}) {
    return io_.load_params(file, options);
  }
  LoadParamsReport load_params(const ParamSources& sources, const LoadParamsOptions& options = {}) {
    return io_.load_params(sources, options);
  }

  // ---- what it holds ----

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
  // The offloaded states' host memory by category (zero without offload).
  MemoryUsage host_memory() const { return offload_ ? offload_->memory() : MemoryUsage{}; }
  // Asks every rank to stop: the next step's StepStats::stop_requested is
  // true on every rank if any rank asked before it (dtrain::fit's preemption).
  void request_stop(bool stop = true) { stop_request_ = stop; }
  // What is offloaded (TrainerOptions::offload), and the bytes of optimizer
  // state in files (TrainerOptions::offload_dir; 0 otherwise).
  offload_kind offload() const { return options_.offload; }
  std::size_t offload_disk_bytes() const { return offload_ ? offload_->disk_bytes() : 0; }

  Dev& device() { return dev_; }
  const ModelLayout& layout() const { return layout_; }
  const TrainerOptions& options() const { return options_; }
  World& world() { return world_; }
  // The strategy behind its hooks (Trainer::strategy() gives the class itself).
  AnyStrategy<T>& strategy() { return *strategy_; }
  std::string_view strategy_name() const { return strategy_->name(); }
  int micro_batches() const { return accumulate_; }
  // The optimizer's state buffers (on the host when offloaded).
  std::vector<OptimizerStateView> optimizer_state() { return optimizer_.state(); }
  std::string_view optimizer_name() const { return optimizer_.name(); }
  // The parameter groups as resolved against the model: groups()[0] is the
  // default group, then TrainerOptions::param_groups in order.
  const std::vector<GroupSettings>& param_groups() const { return groups_.groups; }
  std::int64_t steps_taken() const { return state_.step; }

 private:
  // The guard's verdict, then the optimizer's pass over the owned flat.
  void update(StepStats& stats) {
    const StepDecision d = guard_.decide(stats.loss, state_, world_, dev_, layout_, *strategy_);
    stats.grad_norm = d.grad_norm;
    stats.lr = current_lr();
    if (!d.apply) {
      stats.skipped = true;
      return;
    }
    ++state_.step;
    optimizer_.step({stats.lr, state_.step, d.grad_scale});
    strategy_->after_optimizer();
  }

  float current_lr() const {
    const float base = options_.schedule ? (*options_.schedule)(state_.step) : optimizer_.base_lr();
    return scale_lr(base, options_.lr_scaling, world_.size());
  }

  // The non-tensor state of this trainer, as a checkpoint records it.
  CheckpointInfo describe() {
    CheckpointInfo info;
    info.step = state_.step;
    info.loss_scale = state_.loss_scale;
    info.good_steps = state_.good_steps;
    info.seed = options_.seed;
    info.world_size = world_.size();
    info.strategy = std::string(strategy_->name());
    info.param_dtype = std::string(dtype_traits<T>::safetensors_name);
    info.reduce_dtype = std::string(dtype_traits<R>::safetensors_name);
    info.optimizer = std::string(optimizer_.name());
    for (const auto& st : optimizer_.state()) info.optimizer_states.emplace_back(st.name);
    for (const GroupSettings& g : groups_.groups) info.param_groups.push_back({g.name, g.lr, g.weight_decay, g.params});
    return info;
  }

  template <class Opt>
  static TrainerOptions validated(TrainerOptions options, const Opt& optimizer) {
    optimizer.validate();
    options.clip.validate();
    return options;
  }

  static int checked_accumulate(int accumulate) {
    if (accumulate < 1)
      throw config_error("the trainer's micro-batch count is " + std::to_string(accumulate),
                         "accumulate over 1 or more micro-batches per optimizer step");
    return accumulate;
  }

  static const StrategyFactory<Dev, T>& checked_factory(const StrategyFactory<Dev, T>& f) {
    if (!f.shard_count || !f.make)
      throw config_error("the trainer was given an empty StrategyFactory",
                         "make it with dtrain::strategy_factory<Kind, Dev, T, R>(options)");
    return f;
  }

  static Dev make_device(World& world) {
    check_launch_device<Dev>();  // a host trainer under dtrain-run --nproc-per-node gpu
    if constexpr (requires { binding::device_for(world); })
      return Dev(binding::device_for(world));
    else if constexpr (requires { Dev(world.local_rank()); } && !std::is_same_v<Dev, Host>)
      return Dev(world.local_rank());
    else
      return Dev();
  }

  static std::vector<std::vector<ParamSpec>> declared_params(M& model) {
    std::vector<std::vector<ParamSpec>> all;
    detail::for_each_unit(model.units(), [&](std::size_t, auto& unit) { all.push_back(unit.params()); });
    return all;
  }

  std::unique_ptr<AnyStrategy<T>> make_strategy(const StrategyFactory<Dev, T>& factory) {
    if (layout_.units().empty()) throw config_error("the model has no units", "return at least one unit from units()");
    check_same_model(world_, layout_, options_.seed);
    return factory.make(StrategyContext<Dev>{.world = world_,
                                             .dev = dev_,
                                             .layout = layout_,
                                             .comm = *comm_,
                                             .seed = options_.seed,
                                             .accumulate = accumulate_,
                                             .offload = offload_.get()});
  }

  int accumulate_;  // micro-batches per optimizer step
  World& world_;
  M& model_;
  TrainerOptions options_;
  Dev dev_;
  ModelLayout layout_;
  std::unique_ptr<typename binding::comm_type> comm_;  // the whole world's (scalars; strategies build on it)
  std::unique_ptr<OffloadArena<Dev>> offload_;         // TrainerOptions::offload: the host side (outlives its buffers)
  std::unique_ptr<AnyStrategy<T>> strategy_;
  GroupPlan groups_;
  OptimizerPlacement<Dev, T> optimizer_;
  StepGuard<Dev, T> guard_;
  TrainState state_;
  RankSums<Dev> sums_;
  UnitPipeline<M, Dev, T> pipeline_;
  Evaluator<M, Dev, T> evaluator_;
  CheckpointIO<Dev, T> io_;
  bool stop_request_ = false;
};

// The Trainer a program names: the policies fix the device, strategy,
// precision and micro-batch count at compile time (policy/policies.hpp).
//
//   auto world = dtrain::init();
//   dtrain::Trainer<MyModel, dtrain::Strategy<dtrain::FSDP<>>, dtrain::Precision<dtrain::bf16>,
//                   dtrain::Accumulate<4>> trainer{world, model, dtrain::AdamW{.lr = 3e-4f}, {},
//                                                  dtrain::FsdpOptions{.prefetch = 2}};
//   auto stats = trainer.step(micro_batches);   // exactly Accumulate<N> batches
template <Model M, class... Policies>
class Trainer
    : public TrainerCore<M, typename policies<Policies...>::device, typename policies<Policies...>::precision> {
  using P = policies<Policies...>;
  using Core = TrainerCore<M, typename P::device, typename P::precision>;
  using T = typename P::param_type;
  using R = typename P::reduce_type;

 public:
  using strategy_kind = typename P::strategy;
  // The strategy class strategy_impl names for this kind, device and dtypes.
  using strategy_type = typename strategy_impl<strategy_kind, typename P::device, T, R>::type;
  // Its options (FsdpOptions, DdpOptions, ...; NoStrategyOptions if none).
  using strategy_options = strategy_options_t<strategy_type>;
  static constexpr int accumulate = P::accumulate;

  template <Optimizer Opt>
  Trainer(World& world, M& model, Opt optimizer, TrainerOptions options = {}, strategy_options strategy = {})
      : Core(world, model, std::move(optimizer), with_offload(std::move(options)), accumulate,
             strategy_factory<strategy_kind, typename P::device, T, R>(std::move(strategy))) {}

  // The strategy object itself, with its own accessors.
  strategy_type& strategy() { return static_cast<StrategyModel<strategy_type, T>&>(Core::strategy()).impl(); }

 private:
  static constexpr detail::offload_strategy_diagnostic<
      std::is_same_v<strategy_type, detail::missing_strategy> ? offload_kind::none : P::offload,
      strategy_max_offload<strategy_type>()>
      offload_check{};

  // Offload<...> in the policies sets TrainerOptions::offload.
  static TrainerOptions with_offload(TrainerOptions options) {
    if constexpr (P::offload != offload_kind::none) {
      if (options.offload != offload_kind::none && options.offload != P::offload)
        throw config_error("TrainerOptions::offload = '" + std::string(offload_name(options.offload)) +
                               "' but the policies say Offload<" + std::string(offload_name(P::offload)) + ">",
                           "set the offload in one place: the Offload<...> policy or TrainerOptions::offload");
      options.offload = P::offload;
    }
    return options;
  }
};

}  // namespace dtrain
