#pragma once
// dtrain's umbrella header and the Trainer: a thin composition of the public
// pieces (communicator, GradReducer, flat parameter storage, optimizer
// functors, loss scaling) for a user model and compile-time policies.
//
//   auto world = dtrain::init();
//   dtrain::Trainer<MyModel, dtrain::Precision<dtrain::bf16>, dtrain::Accumulate<4>>
//       trainer{world, model, dtrain::AdamW{.lr = 3e-4f}};
//   auto stats = trainer.step(micro_batches);   // exactly Accumulate<N> batches

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
#include "dtrain/optim/schedule.hpp"
#include "dtrain/policy/policies.hpp"
#include "dtrain/strategy/comm_binding.hpp"
#include "dtrain/strategy/ddp.hpp"
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
  std::uint64_t seed = 0;                 // parameter initialisation (rank 0's is broadcast)
  BucketOptions buckets{};
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
  static_assert(std::is_same_v<typename P::strategy, DDP>,
                "dtrain: only Strategy<DDP> is available in this version of the Trainer");

 public:
  using device_type = typename P::device;
  using param_type = typename P::param_type;
  using reduce_type = typename P::reduce_type;
  static constexpr int accumulate = P::accumulate;

 private:
  using Dev = device_type;
  using T = param_type;
  using R = reduce_type;
  using binding = CommBinding<Dev>;
  template <class E>
  using buffer = typename Dev::template buffer<E>;
  // Gradients reach the optimizer in fp32; a separate accumulator is needed
  // unless the unit already writes fp32 and nothing is accumulated.
  static constexpr bool separate_accumulator = accumulate > 1 || !std::is_same_v<T, float>;

 public:
  template <OptimizerConfig Opt>
  Trainer(World& world, M& model, Opt optimizer, TrainerOptions options = {})
      : world_(world), model_(model), options_(std::move(options)), optimizer_(optimizer),
        dev_(make_device(world)), layout_(declared_params(model)), num_units_(layout_.units().size()) {
    if (num_units_ == 0) throw config_error("the model has no units", "return at least one unit from units()");
    optimizer.validate();
    options_.clip.validate();
    comm_ = binding::make(world_, dev_);
    check_same_model();
    allocate();
    initialise_and_broadcast();
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
    reducer_->finish();
    if constexpr (accumulate > 1) loss = all_reduce_scalars(std::array{local_loss})[0];

    StepStats stats;
    stats.samples = static_cast<std::int64_t>(samples);
    stats.loss = loss / samples;
    apply_optimizer(stats);
    stats.step = step_;
    stats.loss_scale = static_cast<float>(loss_scale_);
    stats.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return stats;
  }

  // Every parameter as fp32 on the host, by name ("<unit>.<param>").
  std::map<std::string, std::vector<float>> parameters() {
    std::map<std::string, std::vector<float>> out;
    for (const auto& unit : layout_.units())
      for (const auto& slot : unit.params) {
        std::vector<float> v(static_cast<std::size_t>(slot.spec.numel()));
        if (slot.spec.trainable) {
          dev_.copy_to_host(v.data(), master_.data() + slot.offset, v.size());
        } else {
          std::vector<T> raw(v.size());
          dev_.copy_to_host(raw.data(), frozen_.data() + slot.offset, raw.size());
          for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(raw[i]);
        }
        out.emplace(slot.name, std::move(v));
      }
    return out;
  }

  // Rank 0 writes every parameter as F32 to a safetensors file (atomically);
  // the other ranks wait so the file exists when save_params returns.
  void save_params(const std::filesystem::path& path) {
    if (world_.rank() == 0) {
      const auto params = parameters();
      SafetensorsWriter writer;
      for (const auto& unit : layout_.units())
        for (const auto& slot : unit.params)
          writer.add(slot.name, safetensors_dtype::f32, slot.spec.shape,
                     std::as_bytes(std::span(params.at(slot.name))));
      writer.write(path);
    }
    binding::host_barrier(*comm_, dev_);
  }

  Dev& device() { return dev_; }
  const ModelLayout& layout() const { return layout_; }
  World& world() { return world_; }
  std::int64_t steps_taken() const { return step_; }

 private:
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

  // Fails on every rank, naming the first parameter where a rank's model
  // differs from rank 0's, before any memory is spent on a wrong model.
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
  }

  void allocate() {
    const std::size_t n = layout_.trainable_numel();
    master_ = make_buffer<float>(dev_, n);
    frozen_ = make_buffer<T>(dev_, layout_.frozen_numel());
    grads_ = make_buffer<T>(dev_, n);
    if constexpr (!std::is_same_v<T, float>) params_ = make_buffer<T>(dev_, n);
    if constexpr (separate_accumulator) accum_ = make_buffer<float>(dev_, n, zero_init);
    std::visit([&](const auto& opt) {
      if constexpr (std::is_same_v<std::decay_t<decltype(opt)>, AdamW>) {
        state1_ = make_buffer<float>(dev_, n, zero_init);
        state2_ = make_buffer<float>(dev_, n, zero_init);
      } else if (opt.momentum != 0.f) {
        state1_ = make_buffer<float>(dev_, n, zero_init);
      }
    }, optimizer_);
    scalar_ = make_buffer<float>(dev_, 2);
    buckets_ = layout_.buckets(options_.buckets, sizeof(R));

    T* train_base = [&] {
      if constexpr (std::is_same_v<T, float>) return master_.data();
      else return params_.data();
    }();
    for (const auto& unit : layout_.units()) {
      auto& pv = param_views_.emplace_back();
      auto& gv = grad_views_.emplace_back();
      for (const auto& slot : unit.params) {
        const auto& s = slot.spec;
        T* p = (s.trainable ? train_base : frozen_.data()) + slot.offset;
        pv.push_back({p, s.shape[0], s.numel() / s.shape[0]});
        gv.push_back(s.trainable ? MatView<T>{grads_.data() + slot.offset, s.shape[0], s.numel() / s.shape[0]}
                                 : MatView<T>{});
      }
      const_views_.emplace_back(pv.begin(), pv.end());
    }
    reducer_ = std::make_unique<GradReducer<Dev, R>>(dev_, *comm_, buckets_, grads_f32(), n);
  }

  // Every rank initialises from the seed, then rank 0's values are broadcast:
  // replicas are identical even if a user's init differs between ranks.
  void initialise_and_broadcast() {
    std::vector<float> train(layout_.trainable_numel()), frozen(layout_.frozen_numel());
    for (const auto& unit : layout_.units())
      for (const auto& slot : unit.params) {
        auto& dst = slot.spec.trainable ? train : frozen;
        init_values(std::span(dst).subspan(slot.offset, static_cast<std::size_t>(slot.spec.numel())),
                    slot.spec.init, param_seed(options_.seed, slot.unit, slot.index));
      }
    std::vector<T> frozen_t(frozen.size());
    for (std::size_t i = 0; i < frozen.size(); ++i) frozen_t[i] = dtype_cast<T>(frozen[i]);
    dev_.copy_from_host(master_.data(), train.data(), train.size());
    dev_.copy_from_host(frozen_.data(), frozen_t.data(), frozen_t.size());
    auto w1 = binding::broadcast(*comm_, dev_, master_.span(), 0);
    auto w2 = binding::broadcast(*comm_, dev_, frozen_.span(), 0);
    binding::join(w1, dev_);
    binding::join(w2, dev_);
    if constexpr (!std::is_same_v<T, float>)
      dev_.for_each(master_.size(), Cast<float, T>{master_.data(), params_.data()});
  }

  float* grads_f32() {
    if constexpr (separate_accumulator) return accum_.data();
    else return grads_.data();
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
  static void ensure(buffer<E>& b, Dev& dev, std::size_t n) {
    if (b.size() < n) b = make_buffer<E>(dev, n);
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

    for (std::size_t u = 0; u <= num_units_; ++u) ensure(activations_[u], dev_, static_cast<std::size_t>(rows * width[u]));
    for (auto& d : dgrad_) ensure(d, dev_, static_cast<std::size_t>(rows * widest));
    ensure(labels_, dev_, static_cast<std::size_t>(rows));

    if constexpr (std::is_same_v<T, float>) {
      dev_.copy_from_host(activations_[0].data(), batch.x.data(), batch.x.size());
    } else {
      staging_.resize(batch.x.size());
      for (std::size_t i = 0; i < batch.x.size(); ++i) staging_[i] = T(batch.x[i]);
      dev_.copy_from_host(activations_[0].data(), staging_.data(), staging_.size());
    }
    dev_.copy_from_host(labels_.data(), batch.y.data(), batch.y.size());

    auto act = [&](std::size_t u) { return activations_[u].view(rows, width[u]); };
    detail::for_each_unit(units, [&](std::size_t u, auto& unit) {
      unit.template forward<Dev, T>(dev_, const_params(u), act(u), act(u + 1));
    });
    const std::span<const std::int32_t> labels(labels_.data(), static_cast<std::size_t>(rows));
    const MatView<const T> logits = act(num_units_);
    const float dlogit_scale = after_forward(model_.loss.template forward<Dev, T>(dev_, logits, labels));
    std::size_t cur = 0;
    model_.loss.template backward<Dev, T>(dev_, logits, labels, dgrad_[cur].view(rows, width[num_units_]),
                                          dlogit_scale);

    const bool last = k == accumulate - 1;
    detail::for_each_unit_reverse(units, num_units_, [&](std::size_t u, auto& unit) {
      const MatView<T> dx = u == 0 ? MatView<T>{} : dgrad_[1 - cur].view(rows, width[u]);
      unit.template backward<Dev, T>(dev_, const_params(u), std::span<const MatView<T>>(grad_views_[u]), act(u),
                                     act(u + 1), dgrad_[cur].view(rows, width[u + 1]), dx);
      cur = 1 - cur;
      accumulate_unit(u, k);
      if (last) reducer_->unit_done(u);
    });
  }

  std::span<const MatView<const T>> const_params(std::size_t u) const { return const_views_[u]; }

  void accumulate_unit(std::size_t u, int k) {
    if constexpr (separate_accumulator) {
      const auto& slots = layout_.units()[u];
      if (slots.train_size == 0) return;
      float* dst = accum_.data() + slots.train_offset;
      const T* src = grads_.data() + slots.train_offset;
      if (k == 0)
        dev_.for_each(slots.train_size, Cast<T, float>{src, dst});
      else
        dev_.for_each(slots.train_size, AccumulateInto<T>{dst, src});
    }
  }

  void apply_optimizer(StepStats& stats) {
    const std::size_t n = layout_.trainable_numel();
    float* g = grads_f32();
    const double norm2 = n ? dev_.sum(n, SquaredNorm<float>{g}) : 0.0;
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
    const auto grad_scale = static_cast<float>(coef / loss_scale_);
    stats.lr = current_lr();
    ++step_;
    if (n == 0) return;
    T* out = nullptr;
    if constexpr (!std::is_same_v<T, float>) out = params_.data();
    std::visit([&](const auto& opt) {
      if constexpr (std::is_same_v<std::decay_t<decltype(opt)>, AdamW>) {
        const AdamWHyper h{stats.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay};
        dev_.for_each(n, AdamWStep<T>({master_.data(), g, state1_.data(), state2_.data(), out}, h, step_, grad_scale));
      } else {
        const SgdHyper h{stats.lr, opt.momentum, opt.weight_decay, opt.nesterov};
        dev_.for_each(n, SgdStep<T>({master_.data(), g, state1_.data(), out}, h, grad_scale));
      }
    }, optimizer_);
  }

  float current_lr() const {
    const float base = options_.schedule ? (*options_.schedule)(step_)
                                         : std::visit([](const auto& o) { return o.lr; }, optimizer_);
    return scale_lr(base, options_.lr_scaling, world_.size());
  }

  World& world_;
  M& model_;
  TrainerOptions options_;
  std::variant<AdamW, SGD> optimizer_;
  Dev dev_;
  ModelLayout layout_;
  std::size_t num_units_;
  std::unique_ptr<typename binding::comm_type> comm_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<GradReducer<Dev, R>> reducer_;

  buffer<float> master_;   // fp32 master weights of trainable params (and the params when T is fp32)
  buffer<T> params_;       // compute-dtype copy of trainable params (T != fp32 only)
  buffer<T> frozen_;       // frozen params, compute dtype
  buffer<T> grads_;        // what units' backward writes
  buffer<float> accum_;    // fp32 gradient accumulator (separate_accumulator only)
  buffer<float> state1_;   // AdamW exp_avg / SGD momentum
  buffer<float> state2_;   // AdamW exp_avg_sq
  buffer<float> scalar_;   // staging for the scalar all-reduces (sample count, loss)
  std::vector<std::vector<MatView<T>>> param_views_;
  std::vector<std::vector<MatView<T>>> grad_views_;
  std::vector<std::vector<MatView<const T>>> const_views_;
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
