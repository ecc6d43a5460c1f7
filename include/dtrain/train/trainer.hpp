#pragma once
// The Trainer: the training loop over a user model and a strategy. Each step
// runs the micro-batches' forward and backward through the strategy's hooks,
// the loss normaliser, loss scaling, clipping and the optimizer over what the
// strategy owns. Checkpoints and parameter files are CheckpointIO's
// (checkpoint/state_io.hpp); the strategies are strategy/'s, reached through
// AnyStrategy; the umbrella header <dtrain/trainer.hpp> includes all of it.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/checkpoint/state_io.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/fault.hpp"
#include "dtrain/core/tensor.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/launch/env.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/optim/config.hpp"
#include "dtrain/optim/flat_optimizer.hpp"
#include "dtrain/policy/policies.hpp"
#include "dtrain/strategy/any_strategy.hpp"
#include "dtrain/strategy/comm_binding.hpp"
#include "dtrain/strategy/offload.hpp"
#include "dtrain/strategy/strategy.hpp"
#include "dtrain/train/evaluation.hpp"
#include "dtrain/train/options.hpp"
#if DTRAIN_HAS_CUDA
#include "dtrain/strategy/cuda_binding.hpp"
#include "dtrain/strategy/cuda_offload.hpp"
#endif

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
  template <class E>
  using buffer = typename Dev::template buffer<E>;

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
        num_units_(layout_.units().size()),
        comm_(binding::make(world_, dev_)),
        offload_(make_offload(strategy)),
        strategy_(make_strategy(strategy)),
        groups_(plan_groups(layout_, options_.param_groups, optimizer.lr, optimizer.weight_decay)),
        io_(world_, dev_, layout_, *strategy_, [this] { return optimizer_state(); }) {
    make_optimizer(std::move(optimizer));
    scalar_ = make_buffer<float>(dev_, max_scalars);
    if constexpr (Prec::loss_scaling) loss_scale_ = options_.loss_scale.initial;
    plan_ties();
  }

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
      throw config_error("Trainer::step got " + std::to_string(micro_batches.size()) + " micro-batches but the "
                             "policy is Accumulate<" + std::to_string(accumulate_) + ">",
                         "pass exactly Accumulate<N> micro-batches per optimizer step");
    // The loss normaliser: what the loss counts (samples, or targets not
    // ignored) over every micro-batch and rank, known from the host batches
    // before any compute, so uneven micro-batches weigh exactly right.
    double local_count = 0, local_samples = 0, local_positions = 0;
    for (const Batch& b : micro_batches) {
      const SeqShape shape = check_batch(b);
      local_count += model_.loss.count(b);
      local_samples += static_cast<double>(shape.batch);
      local_positions += static_cast<double>(shape.rows());
    }
    // The normaliser is first needed by the first backward. With one
    // micro-batch the loss is known by then too and shares that all-reduce:
    // each host collective is a round trip through every rank's progress
    // thread and a point where the ranks wait for each other (one fewer took
    // a 2-rank step on 2 cores from 6.0 to 5.3 ms, docs/performance.md).
    double count = 0, samples = 0, positions = 0, local_loss = 0, loss = 0;
    bool stop_agreed = false;
    for (int k = 0; k < accumulate_; ++k)
      micro_step(micro_batches[static_cast<std::size_t>(k)], k, [&](double micro_loss) {
        local_loss += micro_loss;
        if (k == 0) {
          // The stop request (preemption) rides along: every rank learns in
          // this step whether any rank asked, at no extra collective.
          const double stop = stop_request_ ? 1.0 : 0.0;
          std::array<double, 5> sums{};
          if (accumulate_ == 1) {
            sums = all_reduce_scalars(std::array{local_count, local_samples, local_positions, stop, local_loss});
            loss = sums[4];
          } else {
            const auto four = all_reduce_scalars(std::array{local_count, local_samples, local_positions, stop});
            std::copy(four.begin(), four.end(), sums.begin());
          }
          count = sums[0], samples = sums[1], positions = sums[2];
          stop_agreed = sums[3] > 0;
          if (count <= 0 && samples > 0)
            throw config_error("the step's loss counts no targets on any rank (every target ignored, or zero weights)",
                               "check the batches' targets: a step needs at least one target to learn from");
        }
        return count > 0 ? static_cast<float>(loss_scale_ / count) : 0.f;
      });
    strategy_->finish_gradients();
    if (accumulate_ > 1) loss = all_reduce_scalars(std::array{local_loss})[0];

    StepStats stats;
    stats.samples = static_cast<std::int64_t>(samples);
    stats.positions = static_cast<std::int64_t>(positions);
    stats.count = count;
    if (samples > 0) {
      stats.loss = loss / count;
      apply_optimizer(stats);
    } else {  // every rank has run out: nothing to learn from, no update, the step is not counted
      stats.loss = stats.grad_norm = std::numeric_limits<double>::quiet_NaN();
      stats.lr = current_lr();
    }
    stats.step = step_;
    stats.stop_requested = stop_agreed;
    stats.loss_scale = static_cast<float>(loss_scale_);
    stats.memory = memory();
    stats.host_memory = host_memory();
    stats.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    stats.wait_ms = static_cast<double>(collective_wait_ns() - waited_before) / 1e6;
    return stats;
  }

  // Forward only over `batches` (no gradient, no update): the mean loss
  // (their summed losses over every rank, divided by the loss's count) and
  // each metric's value. A metric sees every batch with the model's output
  // (EvalBatch) and adds named sums to MetricSums; evaluate sums them over
  // ranks, so EvalResult::metrics holds sum / count over all the data.
  // Collective: every rank calls it with its own batches (possibly none).
  EvalResult evaluate(std::span<const Batch> batches, std::span<const Metric> metrics = {}) {
    double sum = 0, count = 0;
    MetricSums sums;
    // Sharded strategies gather parameters in every forward: every rank runs
    // as many forwards as the rank with the most batches, the others on
    // empty batches (0 rows, shaped like a real one) that count nothing.
    const std::vector<Batch> padding = evaluation_padding(batches);
    for (const Batch& b : padding) {
      double ignored = 0;
      run_forward(b, nullptr, [&](double loss) { return ignored += loss, 0.f; });
    }
    for (const Batch& b : batches) {
      const double c = model_.loss.count(b);
      double batch_loss = 0;
      std::vector<float> outputs;
      run_forward(b, metrics.empty() ? nullptr : &outputs, [&](double loss) { return batch_loss = loss, 0.f; });
      sum += batch_loss;
      count += c;
      if (metrics.empty()) continue;
      const std::int64_t width = width_.back();
      const EvalBatch eb{b, outputs, width > 0 ? static_cast<std::int64_t>(outputs.size()) / width : 0, width,
                         batch_loss, c};
      for (const Metric& m : metrics) m(eb, sums);
    }
    // The metrics' names over all ranks (a rank without batches has none),
    // then every sum and count in one all-reduce.
    std::vector<std::string> names;
    if (!metrics.empty()) {
      for (const std::string& joined : world_.all_gather_values("eval-metric-names", sums.joined_names()))
        for (std::string& n : MetricSums::split_names(joined))
          if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
      std::sort(names.begin(), names.end());
    }
    std::vector<double> values{sum, count};
    for (const std::string& n : names) {
      const auto [s_, c_] = sums.get(n);
      values.push_back(s_);
      values.push_back(c_);
    }
    values = all_reduce_values(std::move(values));
    if (values[1] <= 0)
      throw config_error("Trainer::evaluate: the batches count no targets on any rank",
                         "evaluate on batches with targets");
    EvalResult r;
    r.loss = values[0] / values[1];
    r.count = values[1];
    for (std::size_t i = 0; i < names.size(); ++i) {
      const double c = values[3 + 2 * i];
      r.metrics[names[i]] = c > 0 ? values[2 + 2 * i] / c : std::numeric_limits<double>::quiet_NaN();
    }
    return r;
  }

  // The model's output for one batch (the loss's input: logits for a
  // language model), [rows, width] row-major as fp32 on the host, forward
  // only: no gradient, no loss, no optimizer. The batch needs no targets.
  // Collective like evaluate.
  std::vector<float> predict(const Batch& batch) {
    std::vector<float> out;
    run_forward(batch, &out, nullptr);
    return out;
  }
  // The same, under its earlier name.
  std::vector<float> logits(const Batch& batch) { return predict(batch); }

  // Every parameter as fp32 on the host, by name ("<unit>.<param>").
  // Collective under sharded strategies: every rank must call it.
  std::map<std::string, std::vector<float>> parameters() { return io_.parameters(); }

  // f(slot, values) for every parameter in layout order, fp32 on the host,
  // one unit gathered at a time. Collective; every rank's f sees all.
  template <class F>
  void visit_parameters(F&& f) {
    io_.visit_parameters(std::forward<F>(f));
  }

  // Every parameter as F32 in one safetensors file (atomically), the names
  // "<unit>.<param>": rank 0 streams it while the units are gathered one by
  // one, so no rank holds the whole model. Collective.
  void save_params(const std::filesystem::path& path) { io_.save_params(path); }

  // Writes a resumable checkpoint to `dir` (a new directory, or one a save
  // that died left without an index): every rank writes what it owns, rank 0
  // commits the index last. Collective: every rank calls it with the same
  // dir. A directory that holds a checkpoint is never overwritten.
  void save(const std::filesystem::path& dir, const SaveOptions& options = {}) {
    io_.save(dir, options, describe());
  }

  // Restores a checkpoint saved by any strategy at any world size (checked
  // against this model before anything changes). Collective. Restore the
  // sampler with info.sampler->state_for(sampler).
  CheckpointInfo load(const std::filesystem::path& dir, const LoadOptions& options = {}) {
    CheckpointInfo info = io_.load(dir, options);
    step_ = info.step;
    loss_scale_ = info.loss_scale;
    good_steps_ = info.good_steps;
    return info;
  }

  // Parameters from a safetensors file (F32, BF16 or F16 tensors named
  // "<unit>.<param>", or renamed through options.rename), at any world size
  // and strategy. Optimizer state and step are left alone. Collective.
  LoadParamsReport load_params(const std::filesystem::path& file, const LoadParamsOptions& options = {}) {
    return io_.load_params(file, options);
  }

  // The same from several files, a model tensor made of one or more file
  // tensors (how dtrain/hf reads a transformers checkpoint). Collective.
  LoadParamsReport load_params(const ParamSources& sources, const LoadParamsOptions& options = {}) {
    return io_.load_params(sources, options);
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
  // The offloaded states' host memory by category (zero without offload):
  // what Offload<...> moved off the compute device, counted apart from it.
  MemoryUsage host_memory() const { return offload_ ? offload_->memory() : MemoryUsage{}; }
  // Asks every rank to stop: the next step's StepStats::stop_requested is
  // true on every rank if any rank asked before it (dtrain::fit's preemption).
  void request_stop(bool stop = true) { stop_request_ = stop; }

  // What is offloaded (TrainerOptions::offload).
  offload_kind offload() const { return options_.offload; }
  // Bytes of optimizer state in files (TrainerOptions::offload_dir), else 0.
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
  std::vector<OptimizerStateView> optimizer_state() {
    return host_optimizer_ ? host_optimizer_->state() : optimizer_->state();
  }
  std::string_view optimizer_name() const { return host_optimizer_ ? host_optimizer_->name() : optimizer_->name(); }
  // The parameter groups as resolved against the model: groups()[0] is the
  // default group, then TrainerOptions::param_groups in order.
  const std::vector<GroupSettings>& param_groups() const { return groups_.groups; }
  std::int64_t steps_taken() const { return step_; }

 private:
  template <class Opt>
  static TrainerOptions validated(TrainerOptions options, const Opt& optimizer) {
    optimizer.validate();
    options.clip.validate();
    return options;
  }

  // The optimizer over the strategy's owned flat, with every element's
  // parameter group when there is more than one: on the compute device, or
  // on the offload arena's host when the strategy keeps the flat there.
  template <class Opt>
  void make_optimizer(Opt optimizer) {
    const OwnedFlat<T> owned = strategy_->owned();
    std::vector<GroupRate> rates;
    for (const GroupSettings& g : groups_.groups)
      rates.push_back({static_cast<float>(static_cast<double>(g.lr) / optimizer.lr), g.weight_decay});
    std::vector<std::uint8_t> ids;
    if (groups_.size() > 1) ids = element_groups(layout_, groups_, strategy_->ownership().trainable, owned.size);
    if (owned.on_host && offload_->state_on_disk()) {
      offload_->check_state_space(optimizer.state_names().size() * owned.size * sizeof(float));
      host_optimizer_.emplace(offload_->host(), std::move(optimizer), owned.size, std::move(rates), ids,
                              [this](std::size_t n) { return offload_->allocate_state_file(n); });
    } else if (owned.on_host)
      host_optimizer_.emplace(offload_->host(), std::move(optimizer), owned.size, std::move(rates), ids);
    else
      optimizer_.emplace(dev_, std::move(optimizer), owned.size, std::move(rates), ids);
  }

  // The arena for TrainerOptions::offload, checked against what the
  // strategy can offload.
  std::unique_ptr<OffloadArena<Dev>> make_offload(const StrategyFactory<Dev, T>& factory) {
    const offload_kind want = options_.offload;
    if (want == offload_kind::none && !options_.offload_dir.empty())
      throw config_error("TrainerOptions::offload_dir is set ('" + options_.offload_dir.string() +
                             "') but nothing is offloaded",
                         "set TrainerOptions::offload (optimizer or params) too, or clear offload_dir");
    if (want == offload_kind::none) return nullptr;
    if (static_cast<int>(want) > static_cast<int>(factory.max_offload)) {
      const std::string have = factory.max_offload == offload_kind::none
                                   ? std::string("offloads nothing")
                                   : "offloads at most '" + std::string(offload_name(factory.max_offload)) + "'";
      throw config_error("offload '" + std::string(offload_name(want)) + "' with strategy '" +
                             std::string(factory.name) + "', which " + have,
                         want == offload_kind::params
                             ? "offload parameter shards with a strategy that shards parameters (fsdp-full, "
                               "fsdp-grad-op, fsdp-no-shard, fsdp-hybrid), or offload only the optimizer state"
                             : "use a strategy that declares max_offload (ddp, zero1 and the fsdp modes do)");
    }
    auto arena = std::make_unique<OffloadArena<Dev>>(dev_, want);
    if (!options_.offload_dir.empty()) arena->use_state_dir(options_.offload_dir);
    return arena;
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
    if (num_units_ == 0) throw config_error("the model has no units", "return at least one unit from units()");
    check_same_model();
    return factory.make(StrategyContext<Dev>{.world = world_,
                                             .dev = dev_,
                                             .layout = layout_,
                                             .comm = *comm_,
                                             .seed = options_.seed,
                                             .accumulate = accumulate_,
                                             .offload = offload_.get()});
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

  // The sequence shape of a micro-batch, from its input "x": float features
  // [B, F] (B rows) or [B, T, F] (B*T rows), or integer ids [B, T] read by an
  // input unit.
  SeqShape check_batch(const Batch& b) const {
    const HostTensor& x = b.at("x");
    const bool floating = is_floating(x.type);
    // B = 0 is a rank with no data left (uneven data, see step()); every
    // other extent must be positive.
    const bool extents_ok = !x.shape.empty() && x.shape[0] >= 0 &&
                            std::all_of(x.shape.begin() + 1, x.shape.end(), [](std::int64_t e) { return e >= 1; });
    if (!extents_ok || (floating && x.shape.size() < 2))
      throw config_error("a micro-batch's input x is " + shape_text(x.shape) + " " + std::string(element_name(x.type)),
                         "give x as float features [B, F] or [B, T, F], or integer ids [B, T] for a model whose "
                         "first unit is an input unit (nn::Embedding), with B >= 0 (0: this rank has no data left)");
    if (static_cast<std::int64_t>(x.bytes.size()) != x.numel() * static_cast<std::int64_t>(element_bytes(x.type)))
      throw config_error("a micro-batch's input x " + shape_text(x.shape) + " holds " + std::to_string(x.bytes.size()) +
                             " bytes",
                         "build batch tensors with HostTensor::of(values, shape)");
    // The sequence length: the extents between B and the feature width (ids have none).
    std::int64_t seq = 1;
    for (std::size_t i = 1; i + (floating ? 1 : 0) < x.shape.size(); ++i) seq *= x.shape[i];
    return {x.shape[0], seq};
  }

  // The empty batches this rank adds to its evaluation so that every rank
  // runs the same number of forwards: each 0 rows of a batch of this rank,
  // or of the description rank 0 (or the first rank with batches) gives.
  std::vector<Batch> evaluation_padding(std::span<const Batch> batches) {
    const auto empty_like = [](const Batch& b) {
      Batch out;
      for (const auto& [name, t] : b.tensors) {
        std::vector<std::int64_t> shape = t.shape;
        if (!shape.empty()) shape[0] = 0;
        out.set(name, HostTensor{t.type, std::move(shape), {}});
      }
      return out;
    };
    // "count|name type d0 d1 ...;..." of this rank's first batch (a stream:
    // GCC 12 at -O3 warns, falsely, on these string concatenations).
    std::ostringstream text;
    text << batches.size() << '|';
    if (!batches.empty())
      for (const auto& [name, t] : batches[0].tensors) {
        text << name << ' ' << static_cast<int>(t.type);
        for (const auto d : t.shape) text << ' ' << d;
        text << ';';
      }
    const std::string mine = text.str();
    const std::vector<std::string> all = world_.all_gather_values("eval-batches", mine);
    std::size_t most = 0;
    std::string model;
    for (const std::string& a : all) {
      const std::size_t n = std::stoull(a.substr(0, a.find('|')));
      most = std::max(most, n);
      if (model.empty() && n > 0) model = a.substr(a.find('|') + 1);
    }
    if (most == batches.size()) return {};
    Batch shape;
    if (!batches.empty()) {
      shape = empty_like(batches[0]);
    } else {
      for (std::size_t a = 0, b; (b = model.find(';', a)) != std::string::npos; a = b + 1) {
        std::istringstream in(model.substr(a, b - a));
        std::string name;
        int type = 0;
        in >> name >> type;
        std::vector<std::int64_t> dims;
        for (std::int64_t d; in >> d;) dims.push_back(d);
        if (!dims.empty()) dims[0] = 0;
        shape.set(name, HostTensor{static_cast<element_type>(type), std::move(dims), {}});
      }
    }
    return std::vector<Batch>(most - batches.size(), shape);
  }

  // A forward of one batch: its output copied to *outputs when that is set,
  // then the loss (given to on_loss) unless on_loss is null.
  template <class OnLoss>
  void run_forward(const Batch& batch, std::vector<float>* outputs, OnLoss&& on_loss) {
    logits_out_ = outputs;
    logits_only_ = std::is_null_pointer_v<std::remove_cvref_t<OnLoss>>;
    const auto reset = [&] { logits_out_ = nullptr, logits_only_ = false; };
    try {
      if constexpr (std::is_null_pointer_v<std::remove_cvref_t<OnLoss>>)
        micro_step(batch, accumulate_ - 1, [](double) { return 0.f; }, false);
      else
        micro_step(batch, accumulate_ - 1, on_loss, false);
    } catch (...) {
      reset();
      throw;
    }
    reset();
  }

  // Sums any number of host values over ranks (evaluations: not per step).
  std::vector<double> all_reduce_values(std::vector<double> values) {
    std::vector<float> f(values.begin(), values.end());
    buffer<float> staging = make_buffer<float>(dev_, f.size());
    dev_.copy_from_host(staging.data(), f.data(), f.size());
    auto w = binding::all_reduce(*comm_, dev_, staging.span(), reduce_op::sum);
    binding::join(w, dev_);
    dev_.copy_to_host(f.data(), staging.data(), f.size());
    for (std::size_t i = 0; i < f.size(); ++i) values[i] = f[i];
    return values;
  }

  // Sums host scalars over ranks in one collective, in fp32 (as every
  // rank's copy must round alike).
  template <std::size_t N>
  std::array<double, N> all_reduce_scalars(std::array<double, N> values) {
    static_assert(N <= max_scalars, "all_reduce_scalars: raise max_scalars, the size of the staging buffer");
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
  // runs between the two and returns the dlogits scale. Without `backward`,
  // the forward only (an evaluation).
  template <class AfterForward>
  void micro_step(const Batch& batch, int k, AfterForward&& after_forward, bool backward = true) {
    auto units = model_.units();
    const SeqShape shape = check_batch(batch);
    const std::int64_t rows = shape.rows();
    const HostTensor& x = batch.at("x");
    const bool input_unit = first_is_input_unit();
    if (!input_unit && !is_floating(x.type))
      throw config_error("the batch's x holds " + std::string(element_name(x.type)) + " ids " + shape_text(x.shape) +
                             " but the model's first unit reads float features",
                         "start the model with an input unit (nn::Embedding) to read token ids, or give x as float "
                         "features [B, F]");
    // Every unit's width follows from the input width alone: worked out once.
    const std::int64_t in_width = input_unit ? 0 : x.shape.back();
    if (width_.empty() || width_[0] != in_width) {
      width_.assign(1, in_width);
      detail::for_each_unit(units, [&](std::size_t, auto& u) { width_.push_back(u.out_features(width_.back())); });
      activations_.resize(num_units_ + 1);
      saved_.resize(num_units_);
    }
    const auto& width = width_;
    const std::int64_t widest = *std::max_element(width.begin(), width.end());
    for (std::size_t u = input_unit ? 1 : 0; u <= num_units_; ++u)
      ensure(activations_[u], static_cast<std::size_t>(rows * width[u]));
    for (auto& d : dgrad_) ensure(d, static_cast<std::size_t>(rows * widest));

    // What units keep from forward for backward: a buffer each, or with
    // activation checkpointing one buffer every unit takes in turn.
    std::vector<std::int64_t> saved(num_units_);
    detail::for_each_unit(units, [&](std::size_t u, auto& unit) { saved[u] = saved_size_of<T>(unit, dev_, shape, width[u]); });
    const bool recompute = options_.activation_checkpointing;
    for (std::size_t u = 0; u < num_units_; ++u)
      if (saved[u] > 0) ensure(recompute ? saved_[0] : saved_[u], static_cast<std::size_t>(saved[u]));
    // A training forward's random stream: seed, rank, step, micro-batch, unit.
    const std::uint64_t micro_stream = detail::derive_stream(
        detail::derive_stream(detail::derive_stream(options_.seed, static_cast<std::uint64_t>(world_.rank())),
                              static_cast<std::uint64_t>(step_ + 1)),
        static_cast<std::uint64_t>(k));
    const DeviceBatch on_device = upload(batch, input_unit);
    auto ctx = [&](std::size_t u) {
      buffer<T>& b = recompute ? saved_[0] : saved_[u];
      return UnitContext<T>{shape, saved[u] > 0 ? b.view(1, saved[u]) : MatView<T>{}, backward,
                            detail::derive_stream(micro_stream, u), &on_device};
    };

    auto act = [&](std::size_t u) { return activations_[u].view(rows, width[u]); };
    AnyStrategy<T>& s = *strategy_;
    auto forward = [&](std::size_t u, auto& unit) {
      copy_tied_values(u);
      detail::unit_forward<Dev, T>(unit, dev_, unit_params(u), on_device, act(u), act(u + 1), ctx(u));
    };
    detail::for_each_unit(units, [&](std::size_t u, auto& unit) {
      s.before_forward(u, k);
      forward(u, unit);
      s.after_forward(u, k);
      if (u == 0) fault::hit(fault::point::forward);
    });
    const MatView<const T> logits = act(num_units_);
    if (logits_out_ != nullptr) {
      std::vector<T> host(static_cast<std::size_t>(logits.size()));
      dev_.copy_to_host(host.data(), logits.data, host.size());
      logits_out_->assign(host.size(), 0.f);
      for (std::size_t i = 0; i < host.size(); ++i) (*logits_out_)[i] = static_cast<float>(host[i]);
    }
    if (logits_only_) return;
    const float dlogit_scale = after_forward(model_.loss.template forward<Dev, T>(dev_, logits, on_device));
    if (!backward) return;
    std::size_t cur = 0;
    model_.loss.template backward<Dev, T>(dev_, logits, on_device, dgrad_[cur].view(rows, width[num_units_]),
                                          dlogit_scale);

    detail::for_each_unit_reverse(units, num_units_, [&](std::size_t u, auto& unit) {
      const MatView<T> dx = u == 0 ? MatView<T>{} : dgrad_[1 - cur].view(rows, width[u]);
      const MatView<const T> dy = dgrad_[cur].view(rows, width[u + 1]);
      s.before_backward(u, k);
      // Deterministic kernels: the recomputed activations (and output) are
      // bit-identical to the first forward's.
      if (recompute && saved[u] > 0) forward(u, unit);
      detail::unit_backward<Dev, T>(unit, dev_, unit_params(u), unit_grads(u), on_device, act(u), act(u + 1), dy, dx,
                                    ctx(u));
      add_tied_grads(u);
      s.after_backward(u, k);
      if (u + 1 == num_units_) fault::hit(fault::point::backward);
      cur = 1 - cur;
    });
  }

  // Tied parameters (ModelLayout::ties()): a unit with ties gets its views
  // in declaration order, the ties' from Trainer-held buffers: `value`, the
  // owner's values copied when the owner's unit runs forward (every
  // strategy's views of a unit are valid then, gathered or not), and `grad`,
  // where the tied unit's backward writes, added into the owner's gradient
  // right after the owner's backward, before the strategy accumulates or
  // reduces it. One stored weight, one gradient, one optimizer state.
  struct TieBuffers {
    buffer<T> value;
    buffer<T> grad;  // empty when the owner is frozen
  };

  void plan_ties() {
    const auto& ties = layout_.ties();
    if (ties.empty()) return;
    plan_.resize(num_units_);
    spliced_params_.resize(num_units_);
    spliced_grads_.resize(num_units_);
    // A unit's plan, by declaration index: the tie's -1 - t, or (numbered
    // below) the position among the strategy's stored views.
    constexpr std::ptrdiff_t stored = std::numeric_limits<std::ptrdiff_t>::max();
    for (std::size_t t = 0; t < ties.size(); ++t) {
      const TiedSlot& tie = ties[t];
      const auto n = static_cast<std::size_t>(tie.spec.numel());
      TieBuffers& b = tie_buffers_.emplace_back();
      b.value = make_buffer<T>(dev_, n, memory_category::gathered);
      if (tie.spec.trainable) b.grad = make_buffer<T>(dev_, n, memory_category::grads);
      auto& plan = plan_[tie.unit];
      if (plan.empty()) plan.assign(layout_.units()[tie.unit].params.size(), stored);
      plan.push_back(stored);  // one more declared parameter
    }
    for (std::size_t t = 0; t < ties.size(); ++t) plan_[ties[t].unit][ties[t].index] = -1 - static_cast<std::ptrdiff_t>(t);
    for (auto& plan : plan_) {
      std::ptrdiff_t next = 0;
      for (auto& i : plan)
        if (i == stored) i = next++;
    }
  }

  static MatView<T> tie_view(const TiedSlot& tie, buffer<T>& b) {
    if (b.size() == 0) return {};
    const std::int64_t rows = tie.spec.shape[0];
    return {b.data(), rows, tie.spec.numel() / rows};
  }

  // Unit u's views in declaration order: the strategy's stored ones, with
  // each tie's view (tie_of(t)) at its index; the stored ones themselves for
  // a unit without ties.
  template <class E, class TieOf>
  std::span<const MatView<E>> spliced(std::size_t u, std::span<const MatView<E>> stored,
                                      std::vector<std::vector<MatView<E>>>& out, TieOf tie_of) {
    if (plan_.empty() || plan_[u].empty()) return stored;
    auto& views = out[u];
    views.clear();
    for (const std::ptrdiff_t i : plan_[u])
      views.push_back(i >= 0 ? stored[static_cast<std::size_t>(i)] : tie_of(static_cast<std::size_t>(-1 - i)));
    return views;
  }

  UnitParams<const T> unit_params(std::size_t u) {
    return spliced<const T>(u, strategy_->params(u), spliced_params_, [&](std::size_t t) {
      return MatView<const T>(tie_view(layout_.ties()[t], tie_buffers_[t].value));
    });
  }

  UnitParams<T> unit_grads(std::size_t u) {
    return spliced<T>(u, strategy_->grads(u), spliced_grads_,
                      [&](std::size_t t) { return tie_view(layout_.ties()[t], tie_buffers_[t].grad); });
  }

  void copy_tied_values(std::size_t u) {
    const auto& ties = layout_.ties();
    for (std::size_t t = 0; t < ties.size(); ++t)
      if (ties[t].owner_unit == u)
        dev_.copy(tie_buffers_[t].value.data(), strategy_->params(u)[ties[t].owner_position].data,
                  tie_buffers_[t].value.size());
  }

  void add_tied_grads(std::size_t u) {
    const auto& ties = layout_.ties();
    for (std::size_t t = 0; t < ties.size(); ++t)
      if (ties[t].owner_unit == u && tie_buffers_[t].grad.size() != 0)
        dev_.for_each(tie_buffers_[t].grad.size(),
                      AddInto<T>{strategy_->grads(u)[ties[t].owner_position].data, tie_buffers_[t].grad.data()});
  }

  bool first_is_input_unit() {
    bool input = false;
    detail::for_each_unit(model_.units(), [&](std::size_t u, auto& unit) {
      if (u == 0) input = InputUnit<std::remove_cvref_t<decltype(unit)>, Dev, T>;
    });
    return input;
  }

  // The batch's tensors on the device. Without an input unit x goes to the
  // first activation in the compute dtype instead.
  DeviceBatch upload(const Batch& batch, bool input_unit) {
    DeviceBatch out;
    for (const auto& [name, t] : batch.tensors) {
      if (name == "x" && !input_unit) {
        upload_input(t);
        continue;
      }
      auto& dst = uploads_[name];
      ensure(dst, t.bytes.size());
      dev_.copy_from_host(dst.data(), t.bytes.data(), t.bytes.size());
      out.set(name, DeviceTensor{t.type, t.shape, dst.data(), t.bytes.data(), {}});
    }
    return out;
  }

  void upload_input(const HostTensor& x) {
    const auto n = static_cast<std::size_t>(x.numel());
    if (x.type == element_type_of<T>()) {
      dev_.copy_from_host(activations_[0].data(), x.values<T>().data(), n);
      return;
    }
    staging_.resize(n);
    const auto convert = [&](auto values) {
      for (std::size_t i = 0; i < n; ++i) staging_[i] = dtype_cast<T>(static_cast<float>(values[i]));
    };
    if (x.type == element_type::f32) convert(x.values<float>());
    else if (x.type == element_type::bf16) convert(x.values<bf16>());
    else convert(x.values<fp16>());
    dev_.copy_from_host(activations_[0].data(), staging_.data(), n);
  }

  void apply_optimizer(StepStats& stats) {
    const bool norm_needed = options_.grad_norm || options_.clip.max_norm > 0 || Prec::loss_scaling;
    const double norm2 = norm_needed ? strategy_->grad_norm_squared() : std::numeric_limits<double>::quiet_NaN();
    stats.grad_norm = std::sqrt(norm2) / loss_scale_;
    // The loss and the norm are the same on every rank: all decide alike.
    if (!Prec::loss_scaling && (!std::isfinite(stats.loss) || (norm_needed && !std::isfinite(norm2)))) {
      if (options_.on_nonfinite == nonfinite_policy::skip) {
        stats.skipped = true;
        stats.lr = current_lr();
        return;
      }
      throw nonfinite_error("step " + std::to_string(step_ + 1) + " has a non-finite " +
                                (std::isfinite(stats.loss) ? "gradient norm" : "loss") + " (loss " +
                                std::to_string(stats.loss) + "); " + first_nonfinite_unit(),
                            "look for a bad batch or a too high learning rate, then resume from the last "
                            "checkpoint; TrainerOptions::on_nonfinite = skip (the examples' on_nonfinite=skip) "
                            "skips such steps instead");
    }
    if constexpr (Prec::loss_scaling) {
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
    const OptimizerStep s{stats.lr, step_, static_cast<float>(coef / loss_scale_)};
    if (host_optimizer_) {
      host_optimizer_->step(owned.master, owned.grad, owned.param_out, s);
      if (offload_->state_on_disk()) offload_->after_state_pass();
    } else {
      optimizer_->step(owned.master, owned.grad, owned.param_out, s);
    }
    strategy_->after_optimizer();
  }

  // Where the gradient first holds inf or NaN, over every rank's owned
  // elements in layout order: "the first non-finite gradient is in unit U
  // (<param>)". Collective.
  std::string first_nonfinite_unit() {
    const OwnedFlat<T> owned = strategy_->owned();
    std::vector<float> grad(owned.size);
    if (owned.on_host) std::copy_n(owned.grad, owned.size, grad.data());
    else if (owned.size) dev_.copy_to_host(grad.data(), owned.grad, owned.size);
    // Ordered by unit, then by position in the unit (the flat itself holds
    // the units in reverse order).
    constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
    std::size_t first = none;
    std::string name;
    for (const OwnedRange& r : strategy_->ownership().trainable) {
      const auto& unit = layout_.units()[r.unit];
      for (std::size_t i = 0; i < r.count; ++i)
        if (!std::isfinite(grad[r.offset + i])) {
          const std::size_t at = unit.train_offset + r.begin + i;
          const std::size_t key = (r.unit << 40) + r.begin + i;
          if (key < first) {
            first = key;
            name.clear();
            for (const auto& slot : unit.params)
              if (slot.spec.trainable && slot.offset <= at && at < slot.offset + static_cast<std::size_t>(slot.spec.numel()))
                name = slot.name;
          }
          break;
        }
    }
    const auto all = world_.all_gather_values("nonfinite-unit", std::to_string(first) + " " + name);
    std::size_t best = none;
    std::string best_name;
    for (const std::string& v : all) {
      const auto space = v.find(' ');
      const std::size_t key = std::stoull(v.substr(0, space));
      if (key < best) best = key, best_name = v.substr(space + 1);
    }
    if (best == none) return "every gradient element is finite (the loss is not)";
    return "the first non-finite gradient is in " + best_name;
  }

  // The non-tensor state of this trainer, as a checkpoint records it.
  CheckpointInfo describe() {
    CheckpointInfo info;
    info.step = step_;
    info.loss_scale = loss_scale_;
    info.good_steps = good_steps_;
    info.seed = options_.seed;
    info.world_size = world_.size();
    info.strategy = std::string(strategy_->name());
    info.param_dtype = std::string(dtype_traits<T>::safetensors_name);
    info.reduce_dtype = std::string(dtype_traits<R>::safetensors_name);
    info.optimizer = std::string(optimizer_name());
    for (const auto& st : optimizer_state()) info.optimizer_states.emplace_back(st.name);
    for (const GroupSettings& g : groups_.groups) info.param_groups.push_back({g.name, g.lr, g.weight_decay, g.params});
    return info;
  }

  float current_lr() const {
    const float base =
        options_.schedule ? (*options_.schedule)(step_) : (host_optimizer_ ? host_optimizer_->base_lr() : optimizer_->base_lr());
    return scale_lr(base, options_.lr_scaling, world_.size());
  }

  int accumulate_;  // micro-batches per optimizer step
  World& world_;
  M& model_;
  TrainerOptions options_;
  Dev dev_;
  ModelLayout layout_;
  std::size_t num_units_;
  std::unique_ptr<typename binding::comm_type> comm_;  // the whole world's (scalars; strategies build on it)
  std::unique_ptr<OffloadArena<Dev>> offload_;  // TrainerOptions::offload: the host side (outlives its buffers)
  std::unique_ptr<AnyStrategy<T>> strategy_;
  GroupPlan groups_;
  CheckpointIO<Dev, T> io_;  // checkpoints and parameter files, through strategy_ and optimizer_state()
  std::optional<FlatOptimizer<Dev>> optimizer_;    // on the compute device
  std::optional<FlatOptimizer<Host>> host_optimizer_;  // offloaded: on offload_'s host

  // Staging for the scalar all-reduces: at most the micro-batch count,
  // samples, positions and loss of a step in one collective.
  static constexpr std::size_t max_scalars = 5;
  buffer<float> scalar_;
  std::vector<float>* logits_out_ = nullptr;  // set while a forward copies the output out (run_forward)
  bool logits_only_ = false;                  // predict(): no loss after the output
  std::vector<std::int64_t> width_;  // width_[u]: the input width of unit u; width_.back(): the logits
  std::vector<buffer<T>> activations_;
  std::vector<buffer<T>> saved_;  // per unit, or [0] shared under activation checkpointing
  buffer<T> dgrad_[2];
  std::map<std::string, buffer<std::byte>, std::less<>> uploads_;  // the batch's tensors on the device
  std::vector<T> staging_;
  std::vector<TieBuffers> tie_buffers_;  // one per layout_.ties()
  std::vector<std::vector<std::ptrdiff_t>> plan_;  // per unit with ties: stored position, or -1 - tie
  std::vector<std::vector<MatView<const T>>> spliced_params_;
  std::vector<std::vector<MatView<T>>> spliced_grads_;

  double loss_scale_ = 1.0;
  bool stop_request_ = false;
  std::int64_t good_steps_ = 0;
  std::int64_t step_ = 0;
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
class Trainer : public TrainerCore<M, typename policies<Policies...>::device, typename policies<Policies...>::precision> {
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
