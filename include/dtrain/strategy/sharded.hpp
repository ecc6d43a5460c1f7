#pragma once
// The pieces FSDP and ZeRO1 are built from, public so a hand-written loop can
// shard its own model:
//
//   ShardGroups    this rank's shard group (ranks that split a unit between
//                  them) and replica group (ranks holding the same shard),
//                  each with its own communicator
//   ShardedParams  the rank's fp32 master shards (and frozen shards); gathers
//                  a unit: cast the shard into its slot of a gathered buffer
//                  in the compute dtype, then all-gather in place
//   ShardReducer   a FIFO pipeline that reduce-scatters a unit's full
//                  gradient over the shard group, all-reduces the shard over
//                  the replica group, and writes or adds it into the fp32
//                  gradient shard
//   ShardedState   the three over one shard group, with the fp32 gradient
//                  shards, their norm and the optimizer's owned flat
//
// Shard arithmetic is the layout's (model/layout.hpp): rank g of a group of G
// holds elements [g*s, (g+1)*s) of a unit's padded segment, s = padded / G,
// stored at offset / G of its shard flat.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dtrain/comm/binding.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/device/buffer.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/reduce.hpp"
#include "dtrain/model/init.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/offload/arena.hpp"
#include "dtrain/strategy/strategy.hpp"

namespace dtrain {

// Ranks are grouped in runs of G consecutive ranks (launchers number the
// ranks of a node consecutively, so a group of LOCAL_WORLD_SIZE is a node):
// shard group = rank / G, position in it = rank % G; the replica group joins
// the ranks at the same position of every shard group.
template <class Dev>
class ShardGroups {
  using binding = CommBinding<Dev>;

 public:
  using comm_type = typename binding::comm_type;

  // Collective over `world`: every rank constructs it with the same group size.
  ShardGroups(World& world, Dev& dev, comm_type& world_comm, int group_size);

  int size() const { return size_; }          // G: ranks that split each unit
  int rank() const { return rank_; }          // g: this rank's shard index
  int replicas() const { return replicas_; }  // shard groups (copies of each shard)
  // Which copy of the shard this rank holds (copy 0 saves it in a checkpoint).
  int replica_index() const { return replica_index_; }
  // Null when the group has one member (nothing to communicate).
  comm_type* shard() const { return shard_; }
  comm_type* replica() const { return replica_; }

  // `local` summed over the shard group, in fp32, identically on every rank
  // (replicas hold equal shards, so a sum over the shard group covers the
  // model once): the squared gradient norm of a sharded model.
  double sum_over_shard(double local);

 private:
  Dev& dev_;
  int size_;
  int rank_;
  int replicas_;
  int replica_index_;
  std::optional<World> shard_world_, replica_world_;
  std::unique_ptr<comm_type> owned_shard_, owned_replica_;
  comm_type* shard_ = nullptr;
  comm_type* replica_ = nullptr;
  typename Dev::template buffer<float> scalar_;
};

template <class Dev>
ShardGroups<Dev>::ShardGroups(World& world, Dev& dev, comm_type& world_comm, int group_size)
    : dev_(dev),
      size_(group_size),
      rank_(world.rank() % std::max(group_size, 1)),
      replicas_(world.size() / std::max(group_size, 1)),
      replica_index_(world.rank() / std::max(group_size, 1)) {
  if (group_size < 1 || world.size() % group_size != 0)
    throw config_error("a shard group of " + std::to_string(group_size) + " ranks does not divide the world of " +
                           std::to_string(world.size()) + " ranks",
                       "choose a shard group size that divides the world size (HybridShard's shard_group; "
                       "the default, the ranks of one node, needs the same number of ranks on every node)");
  if (size_ > 1 && size_ == world.size()) {
    shard_ = &world_comm;
  } else if (size_ > 1) {
    shard_world_.emplace(world.split(world.rank() / size_, "shard"));
    owned_shard_ = binding::make(*shard_world_, dev);
    shard_ = owned_shard_.get();
  }
  scalar_ = make_buffer<float>(dev, 1);
  if (replicas_ > 1 && replicas_ == world.size()) {
    replica_ = &world_comm;
  } else if (replicas_ > 1) {
    replica_world_.emplace(world.split(rank_, "replica"));
    owned_replica_ = binding::make(*replica_world_, dev);
    replica_ = owned_replica_.get();
  }
}

template <class Dev>
auto ShardGroups<Dev>::sum_over_shard(double local) -> double {
  if (!shard_) return local;
  const float f = static_cast<float>(local);
  dev_.copy_from_host(scalar_.data(), &f, 1);
  auto w = binding::all_reduce(*shard_, dev_, scalar_.span(), reduce_op::sum);
  binding::join(w, dev_);
  float total = 0.f;
  dev_.copy_to_host(&total, scalar_.data(), 1);
  return total;
}

namespace detail {
// FsdpOptions and Zero1Options: the look-ahead of the unit all-gathers.
inline void check_prefetch(const char* options, int prefetch) {
  if (prefetch < 0)
    throw config_error(std::string(options) + "::prefetch = " + std::to_string(prefetch) + " is negative",
                       "set prefetch to 0 (no look-ahead) or more");
}

// Unit-sized scratch (gathered parameters, gradient slots) grows to the
// largest unit it has held and never shrinks: after the first step no
// allocation happens (cudaFree would wait for the whole GPU).
template <class Dev, class E>
void grow_unit_buffer(Dev& dev, typename Dev::template buffer<E>& b, std::size_t n) {
  if (b.size() >= n) return;
  b = {};  // free first: never hold the old and the new block at once
  b = make_buffer<E>(dev, n, memory_category::gathered);
}
}  // namespace detail

template <class Dev, Dtype T>
class ShardedParams {
  using binding = CommBinding<Dev>;
  using work_type = typename binding::work_type;
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  // A unit's all-gathers in flight; join() before reading the gathered buffer.
  struct Gather {
    work_type train, frozen;
    void join(Dev& dev) {
      binding::join(train, dev);
      binding::join(frozen, dev);
    }
  };

  // Where a gather takes this rank's compute-dtype shard from.
  enum class shard_source {
    master,        // cast from the fp32 master shard on the device (no offload)
    device_shard,  // a persistent compute-dtype shard on the device, uploaded after each update
    host_shard,    // uploaded from the host just before the gather (Offload<ParamShards>, ZeRO1)
  };

  // Initialises this rank's shards from the seed, one unit at a time.
  // `master_category`: params when the fp32 shard is the only copy of the
  // parameters at rest (FSDP with fp32 compute), else master. With an
  // offload arena the fp32 shards and the compute-dtype shards the optimizer
  // writes live on the host; `source` says where gathers read.
  ShardedParams(Dev& dev, const ModelLayout& layout, ShardGroups<Dev>& groups, std::uint64_t seed,
                memory_category master_category, bool shard_frozen, OffloadArena<Dev>* offload = nullptr,
                shard_source source = shard_source::master);

  float* master() { return offload_ ? host_master_.data() : master_.data(); }
  std::size_t size() const { return layout_.trainable_flat_size() / layout_.shards(); }
  T* frozen() { return frozen_.data(); }
  bool offloaded() const { return offload_ != nullptr; }
  // Offloaded: the host compute-dtype shards the optimizer pass writes.
  T* param_out() { return offload_ ? host_shard_.data() : nullptr; }

  // The optimizer updated master() (and param_out()).
  void after_update();
  // master() was overwritten (a checkpoint or pretrained weights loaded).
  void after_load();

  // Starts gathering unit u: its trainable segment into train_dst and, when
  // frozen parameters are sharded, its frozen segment into frozen_dst (each
  // the padded size). This rank's shard goes into its own slot of the
  // destination (cast from the master shard, copied from the device shard,
  // or uploaded from the host), so the all-gather runs in place.
  Gather gather(std::size_t u, T* train_dst, T* frozen_dst);

  // Unit u's full values on the host: trainable in fp32 (from the master
  // shards), frozen in T when sharded. Collective over the shard group.
  void read_unit(std::size_t u, std::span<float> train, std::span<T> frozen);

 private:
  // In-place all-gather of `full` (n elements) whose slice g*s..(g+1)*s is ours.
  template <class E>
  work_type all_gather(E* full, std::size_t s, std::size_t n) {
    if (!groups_.shard()) return {};
    const std::size_t g = static_cast<std::size_t>(groups_.rank());
    return binding::all_gather(*groups_.shard(), dev_, std::span<const E>(full + g * s, s), std::span<E>(full, n));
  }

  Dev& dev_;
  const ModelLayout& layout_;
  ShardGroups<Dev>& groups_;
  bool shard_frozen_;
  OffloadArena<Dev>* offload_;
  shard_source source_;
  buffer<float> master_;              // this rank's fp32 shards of every unit, one flat (padding zero); not offloaded
  buffer<T> frozen_;                  // this rank's frozen shards (FSDP), compute dtype
  OffloadBuffer<float> host_master_;  // offloaded: the fp32 shards
  OffloadBuffer<T> host_shard_;       // offloaded: their compute-dtype copy (the optimizer's param_out)
  buffer<T> device_shard_;            // shard_source::device_shard: that copy on the device
};

template <class Dev, Dtype T>
ShardedParams<Dev, T>::ShardedParams(Dev& dev, const ModelLayout& layout, ShardGroups<Dev>& groups, std::uint64_t seed,
                                     memory_category master_category, bool shard_frozen, OffloadArena<Dev>* offload,
                                     shard_source source)
    : dev_(dev),
      layout_(layout),
      groups_(groups),
      shard_frozen_(shard_frozen),
      offload_(offload),
      source_(offload ? source : shard_source::master) {
  if (offload && source == shard_source::master)
    throw error("ShardedParams: an offloaded master shard cannot be cast on the device",
                "pass shard_source::device_shard or host_shard with an offload arena");
  const std::size_t G = layout.shards();
  const std::size_t n = layout.trainable_flat_size() / G;
  if (offload_) {
    host_master_ = offload_->template allocate<float>(n, memory_category::master);
    host_shard_ = offload_->template allocate<T>(n, memory_category::params);
    if (source_ == shard_source::device_shard) device_shard_ = make_buffer<T>(dev, n, memory_category::params);
  } else {
    master_ = make_buffer<float>(dev, n, master_category);
  }
  if (shard_frozen) frozen_ = make_buffer<T>(dev, layout.frozen_flat_size() / G, memory_category::params);
  const std::size_t g = static_cast<std::size_t>(groups.rank());
  std::vector<float> train, frozen;
  std::vector<T> frozen_t;
  for (const auto& unit : layout.units()) {
    train.resize(unit.train_padded);
    frozen.resize(unit.frozen_padded);
    init_unit_values(unit, seed, train, frozen);
    const std::size_t s = unit.train_padded / G;
    if (offload_) {
      if (s) std::memcpy(host_master_.data() + unit.train_offset / G, train.data() + g * s, s * sizeof(float));
    } else {
      dev.copy_from_host(master_.data() + unit.train_offset / G, train.data() + g * s, s);
    }
    if (!shard_frozen) continue;
    const std::size_t f = unit.frozen_padded / G;
    frozen_t.resize(f);
    for (std::size_t i = 0; i < f; ++i) frozen_t[i] = dtype_cast<T>(frozen[g * f + i]);
    dev.copy_from_host(frozen_.data() + unit.frozen_offset / G, frozen_t.data(), f);
  }
  if (offload_) after_load();
}

template <class Dev, Dtype T>
auto ShardedParams<Dev, T>::after_update() -> void {
  if (source_ == shard_source::device_shard) offload_->to_device(device_shard_.data(), host_shard_.data(), size());
}

template <class Dev, Dtype T>
auto ShardedParams<Dev, T>::after_load() -> void {
  if (!offload_) return;
  offload_->wait_to_host();  // no upload still reads the host shards
  if (const std::size_t n = size())
    offload_->host().for_each(n, Cast<float, T>{host_master_.data(), host_shard_.data()});
  after_update();
}

template <class Dev, Dtype T>
auto ShardedParams<Dev, T>::gather(std::size_t u, T* train_dst, T* frozen_dst) -> Gather {
  const auto& unit = layout_.units()[u];
  const std::size_t G = layout_.shards(), g = static_cast<std::size_t>(groups_.rank());
  Gather out;
  if (const std::size_t s = unit.train_padded / G) {
    const std::size_t at = unit.train_offset / G;
    switch (source_) {
      case shard_source::master: dev_.for_each(s, Cast<float, T>{master_.data() + at, train_dst + g * s}); break;
      case shard_source::device_shard: dev_.copy(train_dst + g * s, device_shard_.data() + at, s); break;
      case shard_source::host_shard: offload_->to_device(train_dst + g * s, host_shard_.data() + at, s); break;
    }
    out.train = all_gather(train_dst, s, unit.train_padded);
  }
  if (const std::size_t f = unit.frozen_padded / G; shard_frozen_ && f) {
    dev_.copy(frozen_dst + g * f, frozen_.data() + unit.frozen_offset / G, f);
    out.frozen = all_gather(frozen_dst, f, unit.frozen_padded);
  }
  return out;
}

template <class Dev, Dtype T>
auto ShardedParams<Dev, T>::read_unit(std::size_t u, std::span<float> train, std::span<T> frozen) -> void {
  const auto& unit = layout_.units()[u];
  const std::size_t G = layout_.shards(), g = static_cast<std::size_t>(groups_.rank());
  if (const std::size_t s = unit.train_padded / G) {
    auto full = make_buffer<float>(dev_, unit.train_padded);
    if (offload_)
      offload_->to_device(full.data() + g * s, host_master_.data() + unit.train_offset / G, s);
    else
      dev_.copy(full.data() + g * s, master_.data() + unit.train_offset / G, s);
    auto w = all_gather(full.data(), s, unit.train_padded);
    binding::join(w, dev_);
    dev_.copy_to_host(train.data(), full.data(), unit.train_size);
  }
  if (const std::size_t f = unit.frozen_padded / G; shard_frozen_ && f) {
    auto full = make_buffer<T>(dev_, unit.frozen_padded);
    dev_.copy(full.data() + g * f, frozen_.data() + unit.frozen_offset / G, f);
    auto w = all_gather(full.data(), f, unit.frozen_padded);
    binding::join(w, dev_);
    dev_.copy_to_host(frozen.data(), full.data(), unit.frozen_size);
  }
}

// Reduces unit gradients into the rank's fp32 gradient shard, in the reduce
// dtype R, as a FIFO pipeline:
//   reduce_scatter over the shard group (unit's padded gradient -> shard)
//   all_reduce of the shard over the replica group (HybridShard, NoShard)
//   shard -> fp32 gradient shard: micro-batch 0 writes, later ones add.
// The head advances whenever its collective is done, without blocking, so a
// unit's reduction overlaps the backward of the units before it. Every
// communicator sees its collectives in unit order on every rank.
namespace detail {
// ShardReducer::max_in_flight (below), outside the template: the memory
// estimate (train/estimate.hpp) counts these slots with no device to name.
inline constexpr std::size_t shard_reducer_max_in_flight = 2;
}  // namespace detail

template <class Dev, Dtype R>
class ShardReducer {
  using binding = CommBinding<Dev>;
  using work_type = typename binding::work_type;
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  // Slots (unit-sized gradient buffers) in flight at most: two, so a unit's
  // reduction overlaps the backward of the unit before it. The same on every
  // device, and a contract rather than a backend's knob: the memory estimate
  // (train/estimate.hpp) counts these slots.
  static constexpr std::size_t max_in_flight = detail::shard_reducer_max_in_flight;

  // `grad_shard`: the fp32 gradient shards, on the device, or on the host
  // when `offload` is given: each reduced shard then travels to the host as
  // its reduction completes and is written or added there (through a host
  // staging copy in R, unless R is fp32 and nothing accumulates).
  ShardReducer(Dev& dev, const ModelLayout& layout, ShardGroups<Dev>& groups, float* grad_shard,
               OffloadArena<Dev>* offload = nullptr, int accumulate = 1);

  // A buffer of unit u's padded size for its full gradient; waits for the
  // reduction that last used it. Slots take turns (reductions finish in the
  // order they started, so the turn's slot is the first to come free): which
  // units share a slot, and so how far each grows, does not depend on when
  // collectives finish, and the reported memory is the same run to run.
  R* input(std::size_t u);

  // Starts reducing micro-batch k's gradient of unit u, written into input(u).
  void submit(std::size_t u, int k);

  // Starts reducing micro-batch k's gradient of unit u from `full`, the
  // unit's padded gradient (padding zero) in a buffer the caller leaves
  // untouched until drain(); the reduced shard lands in `shard` (the unit's
  // shard size) on its way to the fp32 gradient shard. No slot is used.
  void submit(std::size_t u, int k, const R* full, R* shard);

  // Moves finished reductions along without blocking.
  void poll() { advance(false); }
  // Completes every reduction: the fp32 gradient shard is final.
  void drain();

 private:
  struct Slot {
    buffer<R> input;   // the unit's full padded gradient
    buffer<R> output;  // its reduced shard
    std::ptrdiff_t unit = -1;
    bool busy = false;
  };
  struct Pending {
    std::size_t unit;
    int k;
    std::ptrdiff_t slot;  // -1: external input
    const R* input;
    R* shard;  // where the reduced shard lands (input's own storage when G == 1)
    work_type work{};
    bool replicated = false;  // the replica all-reduce was issued
  };

  void start(Pending p);

  // Issues replica all-reduces in FIFO order as far as their reduce-scatters
  // allow, then finishes from the head while that needs no waiting. With
  // `block`, finishes the head whatever it takes.
  void advance(bool block);
  void advance_head() { advance(true); }

  void replicate(Pending& p);

  void finish(Pending& p);

  // The same arithmetic on the host: the shard comes down first.
  void finish_on_host(const Pending& p, std::size_t s, float* dst);

  Dev& dev_;
  const ModelLayout& layout_;
  ShardGroups<Dev>& groups_;
  float* grad_shard_;
  OffloadArena<Dev>* offload_;
  OffloadBuffer<R> host_staging_;  // offloaded, R != fp32 or accumulating: reduced shards on the host
  std::vector<Slot> slots_;
  std::size_t slot_count_ = 1;  // slots taking turns: max_in_flight, or fewer units with gradients
  std::size_t turn_ = 0;        // slot submissions so far
  std::deque<Pending> pending_;
};

template <class Dev, Dtype R>
ShardReducer<Dev, R>::ShardReducer(Dev& dev, const ModelLayout& layout, ShardGroups<Dev>& groups, float* grad_shard,
                                   OffloadArena<Dev>* offload, int accumulate)
    : dev_(dev), layout_(layout), groups_(groups), grad_shard_(grad_shard), offload_(offload) {
  const auto trainable_units = static_cast<std::size_t>(
      std::ranges::count_if(layout.units(), [](const auto& unit) { return unit.train_size > 0; }));
  slot_count_ = std::clamp<std::size_t>(trainable_units, 1, max_in_flight);
  if (offload_ && (!std::is_same_v<R, float> || accumulate > 1))
    host_staging_ =
        offload_->template allocate<R>(layout.trainable_flat_size() / layout.shards(), memory_category::grads);
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::input(std::size_t u) -> R* {
  advance(false);
  const std::size_t i = turn_ % slot_count_;
  if (slots_.size() <= i) slots_.resize(i + 1);
  while (slots_[i].busy) advance_head();
  const auto& unit = layout_.units()[u];
  Slot& slot = slots_[i];
  detail::grow_unit_buffer<Dev, R>(dev_, slot.input, unit.train_padded);
  detail::grow_unit_buffer<Dev, R>(dev_, slot.output, unit.train_padded / layout_.shards());
  slot.unit = static_cast<std::ptrdiff_t>(u);
  return slot.input.data();
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::submit(std::size_t u, int k) -> void {
  const auto& unit = layout_.units()[u];
  const std::size_t i = turn_ % slot_count_;
  if (i < slots_.size() && slots_[i].unit == static_cast<std::ptrdiff_t>(u) && !slots_[i].busy) {
    Slot& slot = slots_[i];
    slot.busy = true;
    ++turn_;
    dev_.zero(slot.input.data() + unit.train_size, unit.train_padded - unit.train_size);  // padding
    start({u, k, static_cast<std::ptrdiff_t>(i), slot.input.data(), slot.output.data()});
    return;
  }
  throw error("ShardReducer::submit(" + std::to_string(u) + ") without input(" + std::to_string(u) + ")",
              "call input(u), write the unit's gradient there, then submit(u, k)");
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::submit(std::size_t u, int k, const R* full, R* shard) -> void {
  if (groups_.size() == 1 && groups_.replica())
    throw error("ShardReducer: an external gradient cannot be all-reduced in place",
                "use input(u) for replicated shards");
  start({u, k, -1, full, shard});
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::drain() -> void {
  while (!pending_.empty()) advance_head();
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::start(Pending p) -> void {
  const auto& unit = layout_.units()[p.unit];
  const std::size_t s = unit.train_padded / layout_.shards();
  if (groups_.shard())
    p.work = binding::reduce_scatter(*groups_.shard(), dev_, std::span<const R>(p.input, unit.train_padded),
                                     std::span<R>(p.shard, s), reduce_op::sum);
  else
    p.shard = const_cast<R*>(p.input);  // a group of one: the gradient is the shard
  pending_.push_back(p);
  advance(false);
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::advance(bool block) -> void {
  if (groups_.replica())
    for (Pending& p : pending_) {
      if (p.replicated) continue;
      if (!binding::ready(p.work) && !(block && &p == &pending_.front())) break;
      replicate(p);
    }
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    // Not yet replicated: its reduce-scatter finished after the loop above
    // looked, and the all-reduce must still be issued (in order) first.
    if (groups_.replica() && !p.replicated) return;
    if (!block && !binding::done(p.work)) return;
    finish(p);
    pending_.pop_front();
    block = false;
  }
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::replicate(Pending& p) -> void {
  const std::size_t s = layout_.units()[p.unit].train_padded / layout_.shards();
  if (groups_.shard()) binding::then(p.work, *groups_.replica());
  p.work = binding::all_reduce(*groups_.replica(), dev_, std::span<R>(p.shard, s), reduce_op::sum);
  p.replicated = true;
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::finish(Pending& p) -> void {
  binding::join(p.work, dev_);
  const auto& unit = layout_.units()[p.unit];
  const std::size_t s = unit.train_padded / layout_.shards();
  float* dst = grad_shard_ + unit.train_offset / layout_.shards();
  if (offload_) {
    finish_on_host(p, s, dst);
  } else if (p.k == 0) {
    dev_.for_each(s, Cast<R, float>{p.shard, dst});
  } else {
    dev_.for_each(s, AccumulateInto<R>{dst, p.shard});
  }
  if (p.slot >= 0) {
    slots_[static_cast<std::size_t>(p.slot)].busy = false;
    slots_[static_cast<std::size_t>(p.slot)].unit = -1;
  }
}

template <class Dev, Dtype R>
auto ShardReducer<Dev, R>::finish_on_host(const Pending& p, std::size_t s, float* dst) -> void {
  if constexpr (std::is_same_v<R, float>) {
    if (p.k == 0 && host_staging_.size() == 0) {
      offload_->to_host(dst, p.shard, s);
      offload_->wait_to_host();
      return;
    }
  }
  R* staged = host_staging_.data() + (dst - grad_shard_);
  offload_->to_host(staged, p.shard, s);
  offload_->wait_to_host();
  if (p.k == 0)
    offload_->host().for_each(s, Cast<R, float>{staged, dst});
  else
    offload_->host().for_each(s, AccumulateInto<R>{dst, staged});
}

// What FSDP and ZeRO1 build a step on: this rank's shard groups, its fp32
// master shards (ShardedParams), its fp32 gradient shards (on the device,
// or on the offload arena's host) and the ShardReducer that fills them;
// the gradient's squared norm and the owned flat the optimizer updates
// over them. Members in construction order: groups before the shards that
// split over them, the gradient shards before the reducer that writes them.
template <class Dev, Dtype T, Dtype R>
class ShardedState {
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  using shard_source = typename ShardedParams<Dev, T>::shard_source;

  // A shard group of `group_size` ranks; `master_category`, `shard_frozen`
  // and `source` as ShardedParams takes them, `accumulate` as ShardReducer.
  ShardedState(const StrategyContext<Dev>& ctx, int group_size, memory_category master_category, bool shard_frozen,
               shard_source source, int accumulate = 1)
      : groups(ctx.world, ctx.dev, ctx.comm, group_size),
        offload(ctx.offload),
        params(ctx.dev, ctx.layout, groups, ctx.seed, master_category, shard_frozen, ctx.offload, source),
        grad_shard(offload ? buffer<float>{}
                           : make_buffer<float>(ctx.dev, params.size(), zero_init, memory_category::grads)),
        host_grad(offload ? offload->template allocate<float>(params.size(), memory_category::grads, true)
                          : OffloadBuffer<float>{}),
        reducer(ctx.dev, ctx.layout, groups, grad_data(), ctx.offload, accumulate) {}

  // The fp32 gradient shards, wherever they are.
  float* grad_data() { return offload ? host_grad.data() : grad_shard.data(); }
  // The squared L2 norm of the model's gradient: this rank's shards, summed
  // over the shard group.
  double grad_norm_squared(Dev& dev);
  // What the optimizer updates on this rank.
  OwnedFlat<T> owned();

  ShardGroups<Dev> groups;
  OffloadArena<Dev>* offload;
  ShardedParams<Dev, T> params;
  buffer<float> grad_shard;        // fp32 gradient shards, the optimizer's gradient
  OffloadBuffer<float> host_grad;  // the same on the host, offloaded
  ShardReducer<Dev, R> reducer;
};

template <class Dev, Dtype T, Dtype R>
auto ShardedState<Dev, T, R>::grad_norm_squared(Dev& dev) -> double {
  const std::size_t n = params.size();
  double local = 0.0;
  if (n && offload)
    local = offload->host().sum(n, SquaredNorm<float>{host_grad.data()});
  else if (n)
    local = dev.sum(n, SquaredNorm<float>{grad_shard.data()});
  return groups.sum_over_shard(local);
}

template <class Dev, Dtype T, Dtype R>
auto ShardedState<Dev, T, R>::owned() -> OwnedFlat<T> {
  return {params.master(), grad_data(), params.param_out(), params.size(), offload != nullptr};
}

namespace detail {

// The order in which one micro-batch uses its units: forward 0..U-1, then
// backward U-1..0; position p < U is unit p's forward, p >= U unit
// (2U-1-p)'s backward. Sharded strategies gather ahead along it.
inline std::size_t use_position(std::size_t units, std::size_t u, bool backward) {
  return backward ? 2 * units - 1 - u : u;
}

// Calls issue(v) for the next `depth` units with parameters after position
// `pos` (wrapping into the next micro-batch's forward when `wrap`) that
// need(v); stops at the first issue that returns false (no buffer free).
template <class Need, class Issue>
void look_ahead(const ModelLayout& layout, std::size_t pos, bool wrap, int depth, Need&& need, Issue&& issue) {
  const std::size_t U = layout.units().size();
  const std::size_t end = wrap ? 3 * U : 2 * U;
  int seen = 0;
  for (std::size_t p = pos + 1; p < end && seen < depth; ++p) {
    const std::size_t q = p % (2 * U);
    const std::size_t v = q < U ? q : 2 * U - 1 - q;
    if (!layout.units()[v].has_params()) continue;
    ++seen;
    if (need(v) && !issue(v)) return;
  }
}

}  // namespace detail

// The built-in instances a backend compiles once (train/builtin_templates.hpp
// gathers the lists, backend/<name>/train_instances.hpp applies them).
#define DTRAIN_SHARD_GROUPS_TEMPLATES(X, Dev) X(class ShardGroups<Dev>)
#define DTRAIN_SHARDED_TEMPLATES(X, Dev, T) X(class ShardedParams<Dev, T>) X(class ShardReducer<Dev, T>)

}  // namespace dtrain
