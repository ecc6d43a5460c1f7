#pragma once
// DDP: every rank holds the whole model; gradients are summed across ranks
// bucket by bucket while backward still runs on earlier units.
//
// Data flow of one optimizer step (Accumulate<A> micro-batches):
//   k < A   forward all units -> loss -> backward in reverse; each unit's
//           gradient (compute dtype T) is added into the fp32 accumulator
//   k = A-1 as soon as the units of a bucket are done, the bucket's slice is
//           cast to the reduce dtype R (if R != fp32) and all-reduced (sum)
//           asynchronously; only this last micro-batch communicates
//   step    join the buckets; the Trainer unscales, (fp16) skips on inf/NaN
//           and clips; one fused optimizer pass over the flat fp32 master
//           weights also writes the compute-dtype copy.
// The Trainer folds the loss normaliser (global sample count) and the loss
// scale into dlogits, so the summed gradient is exactly the gradient of the
// mean loss over all samples of all ranks and micro-batches.
//
// Offload<OptimizerState> (offload/arena.hpp): the fp32 master weights and
// the optimizer state live on the host, the compute-dtype parameters (fp32
// too) on the device; the all-reduced gradient goes down once it is final,
// and the updated parameters go up after the host's optimizer pass.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "dtrain/comm/binding.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/reduce.hpp"
#include "dtrain/model/init.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/policy/strategy.hpp"
#include "dtrain/strategy/strategy.hpp"

namespace dtrain {

// Reduces a flat fp32 gradient buffer across ranks, one collective per
// bucket, started as soon as backward has finished the bucket's last unit.
// Public so a hand-written training loop can use it without the Trainer.
template <class Dev, Dtype R = float>
class GradReducer {
 public:
  using binding = CommBinding<Dev>;

  // grads: the fp32 flat gradient laid out as in ModelLayout (reverse unit
  // order). When R is not fp32 the reducer owns a staging buffer in R.
  GradReducer(Dev& dev, typename binding::comm_type& comm, std::vector<Bucket> buckets, float* grads,
              std::size_t numel);

  // Backward finished unit u of the communicating micro-batch.
  void unit_done(std::size_t u);

  // Waits for every bucket; afterwards grads holds the sum over ranks.
  void finish();

 private:
  void launch(const Bucket& b);

  Dev& dev_;
  typename binding::comm_type& comm_;
  std::vector<Bucket> buckets_;
  float* grads_;
  typename Dev::template buffer<R> staging_;
  std::vector<typename binding::work_type> works_;
  std::size_t next_ = 0;
};

template <class Dev, Dtype R>
GradReducer<Dev, R>::GradReducer(Dev& dev, typename binding::comm_type& comm, std::vector<Bucket> buckets, float* grads,
                                 [[maybe_unused]] std::size_t numel)
    : dev_(dev), comm_(comm), buckets_(std::move(buckets)), grads_(grads) {
  if constexpr (!std::is_same_v<R, float>) staging_ = make_buffer<R>(dev_, numel, memory_category::grads);
}

template <class Dev, Dtype R>
auto GradReducer<Dev, R>::unit_done(std::size_t u) -> void {
  while (next_ < buckets_.size() && buckets_[next_].last_unit == u) launch(buckets_[next_++]);
}

template <class Dev, Dtype R>
auto GradReducer<Dev, R>::finish() -> void {
  for (auto& w : works_) binding::join(w, dev_);
  if constexpr (!std::is_same_v<R, float>)
    for (const Bucket& b : buckets_)
      dev_.for_each(b.size, Cast<R, float>{staging_.data() + b.offset, grads_ + b.offset});
  works_.clear();
  next_ = 0;
}

template <class Dev, Dtype R>
auto GradReducer<Dev, R>::launch(const Bucket& b) -> void {
  if (b.size == 0) return;
  if constexpr (std::is_same_v<R, float>) {
    works_.push_back(binding::all_reduce(comm_, dev_, std::span<float>(grads_ + b.offset, b.size), reduce_op::sum));
  } else {
    dev_.for_each(b.size, Cast<float, R>{grads_ + b.offset, staging_.data() + b.offset});
    works_.push_back(
        binding::all_reduce(comm_, dev_, std::span<R>(staging_.data() + b.offset, b.size), reduce_op::sum));
  }
}

namespace detail {

// The full-model gradient storage DDP and ZeRO1 share: what each unit's
// backward writes (T) and, when T is not fp32 or micro-batches accumulate, an
// fp32 accumulator beside it. Laid out like the layout's trainable flat.
template <class Dev, Dtype T>
class FullGradients {
 public:
  // Gradients reach reductions and the optimizer in fp32; a separate
  // accumulator is needed unless the unit already writes fp32 and nothing is
  // accumulated.
  FullGradients(Dev& dev, const ModelLayout& layout, int accumulate);

  T* compute() { return grads_.data(); }
  // The fp32 gradient (the accumulator, or the unit-written buffer itself
  // when that is fp32 already and nothing accumulates).
  float* f32();

  // Micro-batch k's gradient of unit u: the first one is written, later ones added.
  void accumulate(std::size_t u, int k);

 private:
  Dev& dev_;
  const ModelLayout& layout_;
  bool separate_;
  typename Dev::template buffer<T> grads_;
  typename Dev::template buffer<float> accum_;
};

template <class Dev, Dtype T>
FullGradients<Dev, T>::FullGradients(Dev& dev, const ModelLayout& layout, int accumulate)
    : dev_(dev), layout_(layout), separate_(accumulate > 1 || !std::is_same_v<T, float>) {
  const std::size_t n = layout.trainable_flat_size();
  grads_ = make_buffer<T>(dev, n, zero_init, memory_category::grads);  // zero padding, never written
  if (separate_) accum_ = make_buffer<float>(dev, n, zero_init, memory_category::grads);
}

template <class Dev, Dtype T>
auto FullGradients<Dev, T>::f32() -> float* {
  if constexpr (std::is_same_v<T, float>)
    if (!separate_) return grads_.data();
  return accum_.data();
}

template <class Dev, Dtype T>
auto FullGradients<Dev, T>::accumulate(std::size_t u, int k) -> void {
  if (!separate_) return;
  const auto& unit = layout_.units()[u];
  if (unit.train_size == 0) return;
  float* dst = accum_.data() + unit.train_offset;
  const T* src = grads_.data() + unit.train_offset;
  if (k == 0)
    dev_.for_each(unit.train_size, Cast<T, float>{src, dst});
  else
    dev_.for_each(unit.train_size, AccumulateInto<T>{dst, src});
}

}  // namespace detail

// Strategy<DDP>'s options: the gradient buckets (PyTorch DDP's bucket_cap_mb
// and its small first bucket).
using DdpOptions = BucketOptions;

template <class Dev, Dtype T, Dtype R>
class DdpStrategy {
  using binding = CommBinding<Dev>;
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  using options = DdpOptions;
  static constexpr offload_kind max_offload = offload_kind::optimizer;

  static std::size_t shard_count(const World&, const options& o);

  DdpStrategy(const StrategyContext<Dev>& ctx, const options& opts);

  void before_forward(std::size_t, int) {}
  void after_forward(std::size_t, int) {}
  void before_backward(std::size_t, int) {}
  void after_backward(std::size_t u, int k);
  UnitParams<const T> params(std::size_t u) const { return const_views_[u]; }
  UnitParams<T> grads(std::size_t u) const { return grad_views_[u]; }

  void finish_gradients();
  double grad_norm_squared();
  OwnedFlat<T> owned();
  void after_optimizer();
  std::span<T> frozen_storage() { return frozen_.span(); }
  void after_load();

  void read_unit(std::size_t u, std::span<float> train, std::span<T> frozen);

  // Every rank holds everything; rank 0 is the replica that saves it.
  Ownership ownership() const { return replicated_ownership(layout_, rank_); }

 private:
  T* compute_params();

  // Every rank initialises from the seed, then rank 0's values are broadcast:
  // replicas are identical even if a rank's initialisation differed.
  void initialise_and_broadcast(std::uint64_t seed);

  Dev& dev_;
  const ModelLayout& layout_;
  typename binding::comm_type& comm_;
  int rank_;
  int last_micro_batch_;
  OffloadArena<Dev>* offload_;
  detail::FullGradients<Dev, T> grads_;
  buffer<float> master_;              // fp32 master weights (the parameters themselves when T is fp32); not offloaded
  buffer<T> params_;                  // compute-dtype copy (T != fp32, or offloaded)
  OffloadBuffer<float> host_master_;  // offloaded: the master weights
  OffloadBuffer<T> host_params_;      // offloaded: the optimizer's compute-dtype output, uploaded
  OffloadBuffer<float> host_grad_;    // offloaded: the all-reduced fp32 gradient
  buffer<T> frozen_;                  // frozen parameters, compute dtype
  std::unique_ptr<GradReducer<Dev, R>> reducer_;
  std::vector<std::vector<MatView<T>>> views_;
  std::vector<std::vector<MatView<T>>> grad_views_;
  std::vector<std::vector<MatView<const T>>> const_views_;
};

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::shard_count(const World&, const options& o) -> std::size_t {
  if (o.bucket_bytes == 0 || o.first_bucket_bytes == 0)
    throw config_error("DdpOptions: a bucket of 0 bytes", "give first_bucket_bytes and bucket_bytes > 0");
  return 1;
}

template <class Dev, Dtype T, Dtype R>
DdpStrategy<Dev, T, R>::DdpStrategy(const StrategyContext<Dev>& ctx, const options& opts)
    : dev_(ctx.dev),
      layout_(ctx.layout),
      comm_(ctx.comm),
      rank_(ctx.world.rank()),
      last_micro_batch_(ctx.accumulate - 1),
      offload_(ctx.offload),
      grads_(dev_, layout_, ctx.accumulate) {
  const std::size_t n = layout_.trainable_flat_size();
  if (offload_) {
    // The master weights, a compute-dtype copy for the upload and the
    // gradient live on the host; the device keeps the parameters.
    host_master_ = offload_->template allocate<float>(n, memory_category::master);
    host_params_ = offload_->template allocate<T>(n, memory_category::params);
    host_grad_ = offload_->template allocate<float>(n, memory_category::grads, true);
    params_ = make_buffer<T>(dev_, n, memory_category::params);
  } else {
    // With fp32 compute the master weights are the parameters.
    master_ = make_buffer<float>(dev_, n, std::is_same_v<T, float> ? memory_category::params : memory_category::master);
    if constexpr (!std::is_same_v<T, float>) params_ = make_buffer<T>(dev_, n, memory_category::params);
  }
  frozen_ = make_buffer<T>(dev_, layout_.frozen_flat_size(), memory_category::params);
  for (const auto& unit : layout_.units()) {
    auto& pv = views_.emplace_back();
    detail::unit_views(unit, compute_params() + unit.train_offset, frozen_.data() + unit.frozen_offset, pv,
                       &grad_views_.emplace_back(), grads_.compute() + unit.train_offset);
    const_views_.push_back(detail::as_const(pv));
  }
  reducer_ = std::make_unique<GradReducer<Dev, R>>(dev_, comm_, layout_.buckets(opts, sizeof(R)), grads_.f32(), n);
  initialise_and_broadcast(ctx.seed);
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::after_backward(std::size_t u, int k) -> void {
  grads_.accumulate(u, k);
  if (k == last_micro_batch_) reducer_->unit_done(u);  // only the last micro-batch communicates
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::finish_gradients() -> void {
  reducer_->finish();
  if (offload_) {
    offload_->to_host(host_grad_.data(), grads_.f32(), layout_.trainable_flat_size());
    offload_->wait_to_host();
  }
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::grad_norm_squared() -> double {
  const std::size_t n = layout_.trainable_flat_size();
  if (n && offload_) return offload_->host().sum(n, SquaredNorm<float>{host_grad_.data()});
  return n ? dev_.sum(n, SquaredNorm<float>{grads_.f32()}) : 0.0;
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::owned() -> OwnedFlat<T> {
  const std::size_t n = layout_.trainable_flat_size();
  if (offload_) return {host_master_.data(), host_grad_.data(), host_params_.data(), n, true};
  T* out = nullptr;
  if constexpr (!std::is_same_v<T, float>) out = params_.data();
  return {master_.data(), grads_.f32(), out, n};
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::after_optimizer() -> void {
  if (offload_) offload_->to_device(params_.data(), host_params_.data(), layout_.trainable_flat_size());
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::after_load() -> void {
  const std::size_t n = layout_.trainable_flat_size();
  if (offload_) {
    offload_->wait_to_host();  // no upload still reads host_params_
    if (n) offload_->host().for_each(n, Cast<float, T>{host_master_.data(), host_params_.data()});
    offload_->to_device(params_.data(), host_params_.data(), n);
    return;
  }
  if constexpr (!std::is_same_v<T, float>)
    dev_.for_each(master_.size(), Cast<float, T>{master_.data(), params_.data()});
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::read_unit(std::size_t u, std::span<float> train, std::span<T> frozen) -> void {
  const auto& unit = layout_.units()[u];
  if (offload_)
    std::copy_n(host_master_.data() + unit.train_offset, unit.train_size, train.data());
  else
    dev_.copy_to_host(train.data(), master_.data() + unit.train_offset, unit.train_size);
  dev_.copy_to_host(frozen.data(), frozen_.data() + unit.frozen_offset, unit.frozen_size);
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::compute_params() -> T* {
  if constexpr (std::is_same_v<T, float>) {
    if (!offload_) return master_.data();
  }
  return params_.data();
}

template <class Dev, Dtype T, Dtype R>
auto DdpStrategy<Dev, T, R>::initialise_and_broadcast(std::uint64_t seed) -> void {
  std::vector<float> train(layout_.trainable_flat_size()), frozen(layout_.frozen_flat_size());
  for (const auto& unit : layout_.units())
    init_unit_values(unit, seed, std::span(train).subspan(unit.train_offset, unit.train_padded),
                     std::span(frozen).subspan(unit.frozen_offset, unit.frozen_padded));
  std::vector<T> frozen_t(frozen.size());
  for (std::size_t i = 0; i < frozen.size(); ++i) frozen_t[i] = dtype_cast<T>(frozen[i]);
  // Offloaded, the broadcast goes through a transient device buffer.
  buffer<float> staging;
  if (offload_) staging = make_buffer<float>(dev_, train.size());
  buffer<float>& master = offload_ ? staging : master_;
  dev_.copy_from_host(master.data(), train.data(), train.size());
  dev_.copy_from_host(frozen_.data(), frozen_t.data(), frozen_t.size());
  auto w1 = binding::broadcast(comm_, dev_, master.span(), 0);
  auto w2 = binding::broadcast(comm_, dev_, frozen_.span(), 0);
  binding::join(w1, dev_);
  binding::join(w2, dev_);
  if (offload_) {
    dev_.copy_to_host(host_master_.data(), staging.data(), train.size());
    after_load();
    return;
  }
  if constexpr (!std::is_same_v<T, float>)
    dev_.for_each(master_.size(), Cast<float, T>{master_.data(), params_.data()});
}

template <class Dev, class T, class R>
struct strategy_impl<DDP, Dev, T, R> {
  using type = DdpStrategy<Dev, T, R>;
};

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_DDP_TEMPLATES(X, Dev, T, R) X(class DdpStrategy<Dev, T, R>)
#define DTRAIN_DDP_PART_TEMPLATES(X, Dev, T) X(class GradReducer<Dev, T>) X(class detail::FullGradients<Dev, T>)

}  // namespace dtrain
