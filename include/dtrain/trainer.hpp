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
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/checkpoint/safetensors.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/fault.hpp"
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
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/regression_loss.hpp"
#include "dtrain/nn/transformer.hpp"
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
  // Drop the activations units keep from forward for backward (saved_size)
  // after each unit's forward and recompute them right before its backward:
  // one unit's worth of them in memory instead of every unit's, for one more
  // forward of each such unit; results are bit-identical.
  bool activation_checkpointing = false;
  // Report StepStats::grad_norm every step. It costs a pass over the
  // gradients (and a scalar all-reduce under sharded strategies); false skips
  // it when nothing needs it, and grad_norm is then NaN. Clipping and fp16
  // loss scaling compute it regardless.
  bool grad_norm = true;
};

struct StepStats {
  std::int64_t step = 0;       // optimizer steps taken, this one included
  double loss = 0.0;           // the step's loss: the sum over every counted target (the loss's count), all ranks, divided by their number
  float lr = 0.f;
  double grad_norm = 0.0;      // global L2 norm of the averaged gradient, before clipping
  bool skipped = false;        // fp16: inf/NaN gradients, step not applied
  float loss_scale = 1.f;
  std::int64_t samples = 0;    // samples in the step over all ranks (rows of "x")
  std::int64_t positions = 0;  // samples x sequence length (tokens for a language model)
  double count = 0.0;          // the loss normaliser over all ranks (samples, or targets not ignored)
  double step_ms = 0.0;
  MemoryUsage memory;          // this rank's bytes by category (Trainer::memory())
};


namespace detail {
// Everything the Trainer does, instantiated once per (model, device, strategy
// kind, precision): the micro-batch count per step is a runtime value here, so
// Trainers that differ only in Accumulate<N> share one compiled body (an
// example built for four accumulation counts compiles this once, not four
// times). Users name dtrain::Trainer, never this.
template <Model M, class Dev, class Kind, class Prec>
class TrainerCore {
 public:
  using device_type = Dev;
  using param_type = typename Prec::param_type;
  using reduce_type = typename Prec::reduce_type;
  using strategy_kind = Kind;

 private:
  using T = param_type;
  using R = reduce_type;
  using binding = CommBinding<Dev>;
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  using strategy_type = typename strategy_impl<strategy_kind, Dev, T, R>::type;
  static_assert(TrainingStrategy<strategy_type, T>,
                "dtrain: the strategy class does not satisfy dtrain::TrainingStrategy (strategy/strategy.hpp)");

  template <OptimizerConfig Opt>
  TrainerCore(World& world, M& model, Opt optimizer, TrainerOptions options, int accumulate)
      : accumulate_(accumulate),
        world_(world),
        model_(model),
        options_(validated(std::move(options), optimizer)),
        dev_(make_device(world)),
        layout_(declared_params(model), strategy_type::shard_count(world, options_.sharding)),
        num_units_(layout_.units().size()),
        comm_(binding::make(world_, dev_)),
        strategy_(make_strategy()),
        optimizer_(dev_, optimizer, strategy_->owned().size) {
    scalar_ = make_buffer<float>(dev_, max_scalars);
    if constexpr (Prec::loss_scaling) loss_scale_ = options_.loss_scale.initial;
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
    for (int k = 0; k < accumulate_; ++k)
      micro_step(micro_batches[static_cast<std::size_t>(k)], k, [&](double micro_loss) {
        local_loss += micro_loss;
        if (k == 0) {
          std::array<double, 4> sums{};
          if (accumulate_ == 1) {
            sums = all_reduce_scalars(std::array{local_count, local_samples, local_positions, local_loss});
            loss = sums[3];
          } else {
            const auto three = all_reduce_scalars(std::array{local_count, local_samples, local_positions});
            std::copy(three.begin(), three.end(), sums.begin());
          }
          count = sums[0], samples = sums[1], positions = sums[2];
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
    stats.loss_scale = static_cast<float>(loss_scale_);
    stats.memory = memory();
    stats.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }

  // The mean loss over `batches` (their summed losses over every rank,
  // divided by the loss's count), forward only: no gradient, no update.
  // Collective: every rank calls it with its own batches.
  double evaluate(std::span<const Batch> batches) {
    double sum = 0, count = 0;
    for (const Batch& b : batches) {
      count += model_.loss.count(b);
      micro_step(b, accumulate_ - 1, [&](double loss) { return sum += loss, 0.f; }, false);
    }
    const auto totals = all_reduce_scalars(std::array{sum, count});
    if (totals[1] <= 0)
      throw config_error("Trainer::evaluate: the batches count no targets on any rank",
                         "evaluate on batches with targets");
    return totals[0] / totals[1];
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

  // Every parameter as F32 in one safetensors file (atomically), the names
  // "<unit>.<param>" and the units' shapes: rank 0 streams it to disk while
  // the units are gathered one by one, so no rank holds the whole model.
  // Collective: every rank calls it; the file exists on every rank's return.
  void save_params(const std::filesystem::path& path) {
    std::string error;
    stream_parameters(path, error);
    agree(error, "could not write " + detail::quoted_path(path));
  }

  // Writes a resumable checkpoint to `dir` (a new directory, or one a save
  // that died left without an index): every rank writes what it owns, rank 0
  // commits the index last. Collective: every rank calls it with the same
  // dir. A directory that holds a checkpoint is never overwritten.
  void save(const std::filesystem::path& dir, const SaveOptions& options = {}) {
    if (is_checkpoint(dir))
      throw checkpoint_error(detail::quoted_path(dir) + " already holds a checkpoint (step " +
                                 std::to_string(checkpoint_info(dir).step) + ")",
                             "save to a new directory (train_mlp uses <checkpoint_dir>/step-<n>), or remove it "
                             "first: dtrain never overwrites a complete checkpoint");
    CheckpointInfo info = describe();
    info.metadata = options.metadata;
    if (options.sampler) {
      info.sampler = SamplerProgress::of(*options.sampler);
      world_.check_agree("the sampler position saved in " + dir.string(),
                         std::to_string(info.sampler->epoch) + ":" + std::to_string(info.sampler->global_position));
    }
    if (world_.rank() == 0) {
      std::filesystem::create_directories(dir);
      detail::clear_partial_save(dir);
    }
    world_.barrier("checkpoint-dir");
    std::string error;
    nlohmann::json mine;
    try {
      const Ownership own = strategy_->ownership();
      const bool writes = std::ranges::any_of(own.trainable, &OwnedRange::writer) ||
                          std::ranges::any_of(own.frozen, &OwnedRange::writer);
      mine["written"] = detail::write_rank_file(dir, world_.rank(), world_.size(), layout_, own,
                                                writes ? host_state() : HostState<T>{}, options.consolidated);
    } catch (const std::exception& e) {
      error = e.what();
    }
    fault::hit(fault::point::save);
    if (options.consolidated) mine["model"] = stream_parameters(dir / checkpoint_model_name, error);
    mine["error"] = error;
    const auto all = world_.all_gather_values("checkpoint-files", mine.dump());
    std::vector<nlohmann::json> ranks;
    for (const auto& text : all) ranks.push_back(nlohmann::json::parse(text));
    for (std::size_t r = 0; r < ranks.size(); ++r)
      if (const auto e = ranks[r].at("error").get<std::string>(); !e.empty())
        throw checkpoint_error("rank " + std::to_string(r) + " could not write its part of checkpoint " +
                                   detail::quoted_path(dir) + ": " + e,
                               "check free disk space and permissions on every rank (all ranks write to the same "
                               "directory: a shared file system across nodes); the previous checkpoint is untouched");
    std::string committed;
    if (world_.rank() == 0) {
      try {
        commit_index(dir, info, ranks);
      } catch (const std::exception& e) {
        committed = e.what();
      }
    }
    const auto status = world_.all_gather_values("checkpoint-commit", committed);
    if (!status[0].empty())
      throw checkpoint_error("rank 0 could not commit checkpoint " + detail::quoted_path(dir) + ": " + status[0],
                             "check free disk space and permissions; the previous checkpoint is untouched");
  }

  // Restores a checkpoint saved by any strategy at any world size: checks
  // that it was made for this model (naming the first tensor that differs)
  // before touching anything, reads and verifies what this rank owns, and
  // only then replaces parameters, optimizer state, step and loss scale.
  // Collective. Restore the sampler with info.sampler->state_for(sampler).
  CheckpointInfo load(const std::filesystem::path& dir, const LoadOptions& options = {}) {
    const CheckpointIndex index = detail::parse_index(dir);
    check_checkpoint_model(index);
    const auto states = optimizer_.state();
    std::vector<std::string> names;
    for (const auto& st : states) names.emplace_back(st.name);
    if (options.optimizer_state && index.info.optimizer_states != names)
      throw config_error("checkpoint " + detail::quoted_path(dir) + " holds " + index.info.optimizer +
                             " state (" + join(index.info.optimizer_states) + ") but this trainer's optimizer keeps (" +
                             join(names) + ")",
                         "train with the checkpoint's optimizer, or load with LoadOptions{.optimizer_state = false} "
                         "to keep this trainer's fresh optimizer state");
    // Every owned element is read from the checkpoint: sized buffers, not a copy of the current state.
    HostState<T> state = host_state(false);
    std::string error;
    try {
      read_owned(index, state, options.optimizer_state);
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree(error, "could not load checkpoint " + detail::quoted_path(dir));
    put_host_state(state, options.optimizer_state);
    step_ = index.info.step;
    loss_scale_ = index.info.loss_scale;
    good_steps_ = index.info.good_steps;
    return index.info;
  }

  // Parameters from a safetensors file (F32, BF16 or F16 tensors named
  // "<unit>.<param>", or renamed through options.rename), at any world size
  // and strategy: every rank reads only the elements it owns. Optimizer
  // state and step are left alone. Collective.
  LoadParamsReport load_params(const std::filesystem::path& file, const LoadParamsOptions& options = {}) {
    const auto source = SafetensorsFile::open(file);
    LoadParamsReport report;
    std::map<std::string, std::string> from;  // model name -> file name
    for (const auto& name : source.names()) {
      const auto it = options.rename.find(name);
      from[it == options.rename.end() ? name : it->second] = name;
    }
    std::map<std::string, bool> used;
    for (const auto& unit : layout_.units())
      for (const auto& slot : unit.params) {
        const auto it = from.find(slot.name);
        if (it == from.end()) {
          report.missing.push_back(slot.name);
          continue;
        }
        used[it->second] = true;
        const auto t = source.tensor(it->second);
        const bool floating = t.dtype == safetensors_dtype::f32 || t.dtype == safetensors_dtype::bf16 ||
                              t.dtype == safetensors_dtype::f16;
        if (t.shape != slot.spec.shape || !floating)
          report.mismatched.push_back(slot.name + ": " + shape_text(t.shape) + " " +
                                      std::string(safetensors_name(t.dtype)) + " in the file, " +
                                      shape_text(slot.spec.shape) + " in the model");
        else
          report.loaded.push_back(slot.name);
      }
    for (const auto& name : source.names())
      if (!used.contains(name)) report.unexpected.push_back(name);
    if (options.strict && (!report.missing.empty() || !report.unexpected.empty() || !report.mismatched.empty()))
      throw config_error(detail::quoted_path(file) + " does not match this model:" +
                             (report.missing.empty() ? "" : " missing " + join(report.missing) + ";") +
                             (report.unexpected.empty() ? "" : " unexpected " + join(report.unexpected) + ";") +
                             (report.mismatched.empty() ? "" : " mis-shaped " + join(report.mismatched) + ";"),
                         "map the file's names with LoadParamsOptions::rename, or load what matches with "
                         "strict = false (train_mlp: init_strict=false)");
    HostState<T> state = host_state();
    std::string error;
    try {
      const std::map<std::string, bool> wanted = [&] {
        std::map<std::string, bool> m;
        for (const auto& n : report.loaded) m[n] = true;
        return m;
      }();
      const Ownership own = strategy_->ownership();
      for (bool frozen : {false, true})
        for (const auto& p : detail::owned_pieces(layout_, frozen ? own.frozen : own.trainable, frozen, false)) {
          if (!wanted.contains(p.slot->name)) continue;
          const auto t = source.tensor(from.at(p.slot->name));
          const std::size_t elem = element_size(t.dtype);
          const auto bytes = t.bytes.subspan(p.tensor_begin * elem, p.count * elem);
          const std::string what = "tensor '" + from.at(p.slot->name) + "' of " + detail::quoted_path(file);
          if (frozen)
            detail::convert_into(bytes, t.dtype, state.frozen.data() + p.local, p.count, what);
          else
            detail::convert_into(bytes, t.dtype, state.master.data() + p.local, p.count, what);
        }
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree(error, "could not load parameters from " + detail::quoted_path(file));
    put_host_state(state, false);
    return report;
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
  const TrainerOptions& options() const { return options_; }
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
        StrategyContext<Dev>{.world = world_,
                             .dev = dev_,
                             .layout = layout_,
                             .comm = *comm_,
                             .seed = options_.seed,
                             .accumulate = accumulate_,
                             .sharding = options_.sharding,
                             .buckets = options_.buckets});
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
    detail::for_each_unit(units, [&](std::size_t u, auto& unit) { saved[u] = saved_size_of(unit, shape, width[u]); });
    const bool recompute = options_.activation_checkpointing;
    for (std::size_t u = 0; u < num_units_; ++u)
      if (saved[u] > 0) ensure(recompute ? saved_[0] : saved_[u], static_cast<std::size_t>(saved[u]));
    auto ctx = [&](std::size_t u) {
      buffer<T>& b = recompute ? saved_[0] : saved_[u];
      return UnitContext<T>{shape, saved[u] > 0 ? b.view(1, saved[u]) : MatView<T>{}};
    };

    const DeviceBatch on_device = upload(batch, input_unit);
    auto act = [&](std::size_t u) { return activations_[u].view(rows, width[u]); };
    auto& s = *strategy_;
    auto forward = [&](std::size_t u, auto& unit) {
      if constexpr (InputUnit<std::remove_cvref_t<decltype(unit)>, Dev, T>)
        unit.template forward<Dev, T>(dev_, s.params(u), on_device, act(u + 1), ctx(u));
      else if constexpr (detail::context_unit<std::remove_cvref_t<decltype(unit)>, Dev, T>)
        unit.template forward<Dev, T>(dev_, s.params(u), act(u), act(u + 1), ctx(u));
      else
        unit.template forward<Dev, T>(dev_, s.params(u), act(u), act(u + 1));
    };
    detail::for_each_unit(units, [&](std::size_t u, auto& unit) {
      s.before_forward(u, k);
      forward(u, unit);
      s.after_forward(u, k);
      if (u == 0) fault::hit(fault::point::forward);
    });
    const MatView<const T> logits = act(num_units_);
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
      using U = std::remove_cvref_t<decltype(unit)>;
      if constexpr (InputUnit<U, Dev, T>)
        unit.template backward<Dev, T>(dev_, s.params(u), s.grads(u), on_device, act(u + 1), dy, ctx(u));
      else if constexpr (detail::context_unit<U, Dev, T>)
        unit.template backward<Dev, T>(dev_, s.params(u), s.grads(u), act(u), act(u + 1), dy, dx, ctx(u));
      else
        unit.template backward<Dev, T>(dev_, s.params(u), s.grads(u), act(u), act(u + 1), dy, dx);
      s.after_backward(u, k);
      if (u + 1 == num_units_) fault::hit(fault::point::backward);
      cur = 1 - cur;
    });
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
    optimizer_.step(owned.master, owned.grad, owned.param_out,
                    {stats.lr, step_, static_cast<float>(coef / loss_scale_)});
    strategy_->after_optimizer();
  }

  // --- checkpoints -----------------------------------------------------------

  static std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
    return out.empty() ? "none" : out;
  }
  static std::string shape_text(const std::vector<std::int64_t>& shape) { return detail::shape_string(shape); }

  // The non-tensor state of this trainer, as a checkpoint records it.
  CheckpointInfo describe() {
    CheckpointInfo info;
    info.step = step_;
    info.loss_scale = loss_scale_;
    info.good_steps = good_steps_;
    info.seed = options_.seed;
    info.world_size = world_.size();
    info.strategy = std::string(strategy_kind::name);
    info.param_dtype = std::string(dtype_traits<T>::safetensors_name);
    info.reduce_dtype = std::string(dtype_traits<R>::safetensors_name);
    info.optimizer = std::visit([](const auto& c) { return std::string(c.name); }, optimizer_.config());
    for (const auto& st : optimizer_.state()) info.optimizer_states.emplace_back(st.name);
    return info;
  }

  // Host buffers shaped like this rank's owned state, holding a copy of it
  // (or left unfilled when the caller overwrites every element).
  HostState<T> host_state(bool copy = true) {
    HostState<T> s;
    const OwnedFlat<T> owned = strategy_->owned();
    s.master.resize(owned.size);
    if (copy) dev_.copy_to_host(s.master.data(), owned.master, owned.size);
    for (const auto& st : optimizer_.state()) {
      auto& [name, values] = s.optimizer.emplace_back(std::string(st.name), std::vector<float>(owned.size));
      if (copy) dev_.copy_to_host(values.data(), st.data, owned.size);
    }
    const std::span<T> frozen = strategy_->frozen_storage();
    s.frozen.resize(frozen.size());
    if (copy) dev_.copy_to_host(s.frozen.data(), frozen.data(), frozen.size());
    return s;
  }

  void put_host_state(const HostState<T>& s, bool optimizer_state) {
    const OwnedFlat<T> owned = strategy_->owned();
    dev_.copy_from_host(owned.master, s.master.data(), owned.size);
    if (optimizer_state) {
      const auto states = optimizer_.state();
      for (std::size_t i = 0; i < states.size(); ++i)
        dev_.copy_from_host(states[i].data, s.optimizer[i].second.data(), owned.size);
    }
    const std::span<T> frozen = strategy_->frozen_storage();
    dev_.copy_from_host(frozen.data(), s.frozen.data(), frozen.size());
    strategy_->after_load();
  }

  // Throws on every rank when `error` (this rank's) or any other rank's is set.
  void agree(const std::string& error, const std::string& what) {
    const auto all = world_.all_gather_values("checkpoint-agree", error);
    for (int r = 0; r < world_.size(); ++r)
      if (!all[static_cast<std::size_t>(r)].empty())
        throw checkpoint_error("rank " + std::to_string(r) + " " + what + ": " + all[static_cast<std::size_t>(r)],
                               "nothing was changed; fix the cause named above (or load an older checkpoint)");
  }
  // Every parameter in F32 to `path`, gathered unit by unit; rank 0 streams
  // the file and returns its pieces (for a checkpoint's index). Every rank
  // takes part in every gather, even after rank 0 failed (`error` then holds
  // why), so no rank is left waiting in a collective.
  nlohmann::json stream_parameters(const std::filesystem::path& path, std::string& error) {
    std::optional<SafetensorsStreamWriter> out;
    if (world_.rank() == 0 && error.empty()) {
      std::vector<SafetensorsEntry> entries;
      for (const auto& unit : layout_.units())
        for (const auto& slot : unit.params) entries.push_back({slot.name, safetensors_dtype::f32, slot.spec.shape});
      try {
        out.emplace(path, std::move(entries));
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    nlohmann::json pieces = nlohmann::json::object();
    for (std::size_t u = 0; u < num_units_; ++u) {
      const auto& unit = layout_.units()[u];
      std::vector<float> train(unit.train_size);
      std::vector<T> frozen(unit.frozen_size);
      strategy_->read_unit(u, train, frozen);
      if (!out || !error.empty()) continue;
      try {
        std::vector<float> widened;  // a frozen parameter in fp32
        for (const auto& slot : unit.params) {
          const auto n = static_cast<std::size_t>(slot.spec.numel());
          std::span<const float> v;
          if (slot.spec.trainable) {
            v = std::span(train).subspan(slot.offset - unit.train_offset, n);
          } else {
            widened.resize(n);
            for (std::size_t i = 0; i < n; ++i) widened[i] = static_cast<float>(frozen[slot.offset - unit.frozen_offset + i]);
            v = widened;
          }
          const auto bytes = std::as_bytes(v);
          out->write(bytes);
          pieces[slot.name]["param"].push_back(detail::piece_json(
              {path.filename().string(), slot.name, 0, n, safetensors_dtype::f32, crc32c(bytes)}));
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (!out || !error.empty()) return nlohmann::json::object();
    try {
      out->commit();
      return {{"pieces", pieces}, {"file", path.filename().string()}, {"bytes", std::filesystem::file_size(path)}};
    } catch (const std::exception& e) {
      error = e.what();
      return nlohmann::json::object();
    }
  }

  // Rank 0: merges every rank's pieces into the index and commits it.
  void commit_index(const std::filesystem::path& dir, const CheckpointInfo& info,
                    const std::vector<nlohmann::json>& ranks) {
    CheckpointIndex index;
    index.info = info;
    for (const auto& unit : layout_.units())
      for (const auto& slot : unit.params) {
        index.order.push_back(slot.name);
        index.tensors[slot.name] = {slot.spec.shape, slot.spec.trainable, {}};
      }
    for (const auto& r : ranks) {
      if (r.contains("written")) detail::merge_written(index, r.at("written"));
      if (r.contains("model")) detail::merge_written(index, r.at("model"));
    }
    detail::sort_pieces(index);
    const std::string text = detail::index_text(index);
    detail::write_file_atomically(dir / checkpoint_index_name,
                                  std::array{std::as_bytes(std::span(text.data(), text.size()))});
  }

  // The checkpoint must hold exactly this model's tensors, in this order,
  // with the same shapes and trainability; the first difference is named.
  void check_checkpoint_model(const CheckpointIndex& index) const {
    std::vector<const ParamSlot*> mine;
    for (const auto& unit : layout_.units())
      for (const auto& slot : unit.params) mine.push_back(&slot);
    const std::string where = "checkpoint " + detail::quoted_path(index.info.dir) + " was saved for a different model: ";
    const char* fix = "load it into the model it was saved from (same config and code), or take only matching "
                      "weights with load_params from a consolidated model.safetensors";
    for (std::size_t i = 0; i < std::max(mine.size(), index.order.size()); ++i) {
      if (i >= mine.size())
        throw config_error(where + "it has tensor '" + index.order[i] + "' that this model lacks", fix);
      const ParamSlot& slot = *mine[i];
      if (i >= index.order.size() || index.order[i] != slot.name)
        throw config_error(where + "this model's tensor '" + slot.name + "' " +
                               (index.tensors.contains(slot.name) ? "is at another position in it"
                                                                   : "is not in it" + std::string(i < index.order.size() ? " (it has '" + index.order[i] + "' there)" : "")),
                           fix);
      const CheckpointTensor& t = index.tensors.at(slot.name);
      if (t.shape != slot.spec.shape)
        throw config_error(where + "tensor '" + slot.name + "' is " + shape_text(t.shape) + " in the checkpoint and " +
                               shape_text(slot.spec.shape) + " in this model",
                           fix);
      if (t.trainable != slot.spec.trainable)
        throw config_error(where + "tensor '" + slot.name + "' is " + (t.trainable ? "trainable" : "frozen") +
                               " in the checkpoint and " + (slot.spec.trainable ? "trainable" : "frozen") +
                               " in this model",
                           fix);
      for (const auto& [kind, list] : t.pieces)
        for (const auto& p : list)
          if (p.dtype != safetensors_dtype::f32 && p.dtype != safetensors_dtype::bf16 &&
              p.dtype != safetensors_dtype::f16)
            throw config_error(where + "tensor '" + slot.name + "' has " + kind + " of dtype " +
                                   std::string(safetensors_name(p.dtype)),
                               fix);
    }
  }

  // Fills `state` with what this rank owns, from the checkpoint's pieces.
  void read_owned(const CheckpointIndex& index, HostState<T>& state, bool optimizer_state) {
    detail::PieceReader reader(index.info.dir, index.files);
    const Ownership own = strategy_->ownership();
    auto pieces_of = [&](const std::string& tensor, const std::string& kind) -> const std::vector<CheckpointPiece>& {
      static const std::vector<CheckpointPiece> none;
      const auto& t = index.tensors.at(tensor);
      const auto it = t.pieces.find(kind);
      return it == t.pieces.end() ? none : it->second;
    };
    for (const auto& p : detail::owned_pieces(layout_, own.trainable, false, false)) {
      const std::string& name = p.slot->name;
      detail::read_elements(reader, name, "param", pieces_of(name, "param"), p.tensor_begin, p.count,
                            state.master.data() + p.local);
      if (optimizer_state)
        for (auto& [kind, values] : state.optimizer)
          detail::read_elements(reader, name, kind, pieces_of(name, kind), p.tensor_begin, p.count,
                                values.data() + p.local);
    }
    for (const auto& p : detail::owned_pieces(layout_, own.frozen, true, false))
      detail::read_elements(reader, p.slot->name, "param", pieces_of(p.slot->name, "param"), p.tensor_begin,
                            p.count, state.frozen.data() + p.local);
  }

  float current_lr() const {
    const float base = options_.schedule ? (*options_.schedule)(step_) : optimizer_.base_lr();
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
  std::unique_ptr<strategy_type> strategy_;
  FlatOptimizer<Dev> optimizer_;

  // Staging for the scalar all-reduces: at most the micro-batch count,
  // samples, positions and loss of a step in one collective.
  static constexpr std::size_t max_scalars = 4;
  buffer<float> scalar_;
  std::vector<std::int64_t> width_;  // width_[u]: the input width of unit u; width_.back(): the logits
  std::vector<buffer<T>> activations_;
  std::vector<buffer<T>> saved_;  // per unit, or [0] shared under activation checkpointing
  buffer<T> dgrad_[2];
  std::map<std::string, buffer<std::byte>, std::less<>> uploads_;  // the batch's tensors on the device
  std::vector<T> staging_;

  double loss_scale_ = 1.0;
  std::int64_t good_steps_ = 0;
  std::int64_t step_ = 0;
};
}  // namespace detail

template <Model M, class... Policies>
class Trainer
    : public detail::TrainerCore<M, typename policies<Policies...>::device, typename policies<Policies...>::strategy,
                                 typename policies<Policies...>::precision> {
  using P = policies<Policies...>;
  using Core = detail::TrainerCore<M, typename P::device, typename P::strategy, typename P::precision>;

 public:
  static constexpr int accumulate = P::accumulate;

  template <OptimizerConfig Opt>
  Trainer(World& world, M& model, Opt optimizer, TrainerOptions options = {})
      : Core(world, model, std::move(optimizer), std::move(options), accumulate) {}
};

}  // namespace dtrain
