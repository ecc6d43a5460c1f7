// own_loop: train_mlp's model on train_mlp's data, trained by a loop written
// here from dtrain's public pieces instead of dtrain::Trainer: the host
// communicator, flat parameters and gradients laid out by ModelLayout, the
// bucketed gradient reducer (DDP) or the sharded parameters and shard reducer
// (ZeRO-1), FlatOptimizer, DistributedSampler and DataLoader.
//
//   dtrain-run --nproc-per-node 2 own_loop strategy=zero1 steps=200 save_params=own.safetensors
//
// It does the Trainer's arithmetic in the Trainer's order, so on the same job
// it ends with the Trainer's parameters to the bit (tests/examples/
// own_loop_test.cpp checks it against train_mlp; docs/own_loop.md walks
// through the loop). What the Trainer adds on top (other precisions, FSDP,
// clipping, schedules, checkpoints) is left out: such keys are refused.

#include <algorithm>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/cli.hpp"
#include "common/report.hpp"
#include "mlp/mlp.hpp"

#include <dtrain/backend/host/comm.hpp>
#include <dtrain/backend/host/comm_binding.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/io/safetensors.hpp>
#include <dtrain/kernels/elementwise.hpp>
#include <dtrain/model/init.hpp>
#include <dtrain/model/layout.hpp>
#include <dtrain/optim/flat_optimizer.hpp>
#include <dtrain/strategy/ddp.hpp>
#include <dtrain/strategy/sharded.hpp>

namespace own_loop {

using namespace dtrain;

constexpr const char* usage = R"(Trains train_mlp's MLP on its synthetic data with a hand-written loop over
dtrain's public pieces (no Trainer), on host ranks, in fp32. strategy is ddp
or zero1. Of the keys every example takes it implements accumulate,
batch_size, steps, optimizer, lr, weight_decay, momentum, seed, num_workers,
log_every, bucket_mb, timeout_s, save_params; a key that would change what is
trained and that the loop does not implement (precision, device, clip,
schedule, checkpoints, ...) must keep its default: it is refused otherwise.
)";

void declare_extra(dtrain::ConfigReader& r, mlp::Config& c) {
  r.add("hidden", c.hidden, "hidden widths, e.g. 256,256");
  r.add("activation", c.activation, "gelu | relu");
  r.add("samples", c.samples, "rows of the synthetic task");
  r.add("features", c.features, "features");
  r.add("classes", c.classes, "classes");
}

// A key this loop does not implement must keep its default: accepting it
// would train a different job than the one asked for.
void validate_extra(const mlp::Config& c) {
  if (c.hidden.empty()) throw config_error("hidden is empty", "give at least one hidden width, e.g. hidden=256");
  if (c.activation != "gelu" && c.activation != "relu")
    throw config_error("activation = '" + c.activation + "' is unknown", "use gelu or relu");
  if (c.strategy != "ddp" && c.strategy != "zero1")
    throw config_error("strategy = '" + c.strategy + "' is not implemented by own_loop",
                       "use ddp or zero1 (train_mlp, through the Trainer, runs every strategy)");
  if (c.accumulate < 1)
    throw config_error("accumulate = " + std::to_string(c.accumulate) + " is not at least 1",
                       "set accumulate=N, the micro-batches per optimizer step");
  if (c.optimizer == "lion")
    throw config_error("optimizer = lion is not implemented by own_loop's hand-written loop",
                       "use adamw or sgd, or train with train_mlp (the Trainer)");
  if (c.no_decay && c.weight_decay > 0)
    throw config_error("no_decay = true (biases and norms without weight decay) is not implemented by own_loop",
                       "pass no_decay=false (own_loop decays every parameter), or train with train_mlp");
  const mlp::Config d;
  const std::pair<const char*, bool> kept[] = {
      {"device", c.device == d.device},
      {"precision", c.precision == d.precision},
      {"schedule", c.schedule == d.schedule},
      {"warmup_steps", c.warmup_steps == d.warmup_steps},
      {"lr_scaling", c.lr_scaling == d.lr_scaling},
      {"clip", c.clip == d.clip},
      {"shard_group", c.shard_group == d.shard_group},
      {"prefetch", c.prefetch == d.prefetch},
      {"activation_checkpointing", c.activation_checkpointing == d.activation_checkpointing},
      {"metrics", c.metrics.empty()},
      {"tensorboard", c.tensorboard.empty()},
      {"save_every", c.save_every == d.save_every},
      {"resume", c.resume.empty()},
      {"init_from", c.init_from.empty()},
      {"dump_batches", c.dump_batches.empty()},
  };
  for (const auto& [key, at_default] : kept)
    if (!at_default)
      throw config_error(std::string(key) + " is not implemented by own_loop's hand-written loop",
                         "leave " + std::string(key) + " at its default, or train with train_mlp (the Trainer)");
}

// Views of a unit's parameters inside a flat buffer laid out by `layout`: a
// parameter of shape [d0, d1, ...] is a [d0, d1 * ...] matrix at its slot's
// offset. (The MLP's parameters are all trainable: no frozen buffer.)
std::vector<MatView<float>> unit_views(const UnitSlots& unit, float* flat) {
  std::vector<MatView<float>> views;
  for (const auto& slot : unit.params) {
    const std::int64_t rows = slot.spec.shape[0];
    views.push_back({flat + slot.offset, rows, slot.spec.numel() / rows});
  }
  return views;
}

// What every strategy below shares: the world, its communicator, the
// device, train_mlp's model and data.
class Job {
 public:
  // [snippet:job]
  Job(const mlp::Config& config, World& w)
      : c(config),
        world(w),
        comm(world),  // collective: every rank constructs it
        model(c, c.features, c.classes),
        data(mlp::synthetic_dataset(c.samples, c.features, c.classes, c.seed)) {
    data.validate(c.classes);
  }
  // [/snippet:job]

  // The model's parameters laid out in one flat buffer, every unit padded to
  // a multiple of `shards`. Ranks that built different models (or took
  // different seeds) fail here, before any collective runs on the layout.
  // [snippet:layout]
  ModelLayout layout(std::size_t shards) {
    std::vector<std::vector<ParamSpec>> units;
    for (const auto& layer : model.layers) units.push_back(layer.params());
    ModelLayout layout(units, shards);
    world.agree("the seed", c.seed);
    world.agree("the model's parameters", layout.signature());  // names the first parameter that differs
    return layout;
  }
  // [/snippet:layout]

  // Sums a host number over every rank, in fp32 as the Trainer does (every
  // rank then holds the same, identically rounded value).
  // [snippet:sum_over_ranks]
  double sum_over_ranks(double value) {
    float v = static_cast<float>(value);
    comm.all_reduce(std::span(&v, 1), reduce_op::sum).wait();
    return v;
  }
  // [/snippet:sum_over_ranks]

  FlatOptimizer<Host> optimizer(std::size_t size) {
    if (c.optimizer == "sgd")
      return FlatOptimizer<Host>(dev, SGD{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay}, size);
    return FlatOptimizer<Host>(dev, AdamW{.lr = c.lr, .weight_decay = c.weight_decay}, size);
  }

  // Rank 0 writes every parameter as F32 under the names train_mlp's
  // save_params uses, the layout's "<unit>.<param>".
  // [snippet:save]
  void save(const ModelLayout& layout, const float* params) {
    if (c.save_params.empty() || world.rank() != 0) return;
    std::vector<float> host(layout.trainable_flat_size());
    dev.copy_to_host(host.data(), params, host.size());
    SafetensorsWriter out;
    for (const auto& unit : layout.units())
      for (const auto& slot : unit.params)
        out.add(slot.name, slot.spec.shape,
                std::span<const float>(host).subspan(slot.offset, static_cast<std::size_t>(slot.spec.numel())));
    out.write(c.save_params);
    std::printf("saved %s\n", c.save_params.c_str());
  }
  // [/snippet:save]

  const mlp::Config& c;
  World& world;
  HostCommunicator comm;  // every rank: shared memory within a node, Gloo between nodes
  Host dev;               // this rank's share of the cores
  mlp::Model model;
  Dataset data;
};

// The model's side of a step, as a user's model code has it: forward through
// the layers, the loss, backward in reverse. Layers compute with views into
// the flat parameters and overwrite views of a flat gradient with this
// micro-batch's gradient; Net sums micro-batches into an fp32 accumulator
// laid out the same way, which is what the reducers read.
class Net {
 public:
  Net(Job& job, const ModelLayout& layout, float* params)
      : dev_(job.dev),
        model_(job.model),
        layout_(layout),
        grads_(make_buffer<float>(dev_, layout.trainable_flat_size(), zero_init)),
        summed_(make_buffer<float>(dev_, layout.trainable_flat_size(), zero_init)),
        labels_(make_buffer<std::int32_t>(dev_, static_cast<std::size_t>(job.c.batch_size))),
        rows_(job.c.batch_size) {
    width_.push_back(job.c.features);
    for (const auto& layer : model_.layers) width_.push_back(layer.out_features(width_.back()));
    for (const std::int64_t w : width_) act_.push_back(make_buffer<float>(dev_, static_cast<std::size_t>(rows_ * w)));
    const std::int64_t widest = *std::max_element(width_.begin(), width_.end());
    for (auto& d : dgrad_) d = make_buffer<float>(dev_, static_cast<std::size_t>(rows_ * widest));
    for (const auto& unit : layout.units()) {
      const auto p = unit_views(unit, params);
      params_.emplace_back(p.begin(), p.end());
      grad_views_.push_back(unit_views(unit, grads_.data()));
    }
  }

  // The step's gradient, summed over its micro-batches (padding zero).
  float* grads() { return summed_.data(); }

  // Micro-batch k: returns the sum of its losses. dlogits are scaled by
  // `scale` (1 / the step's loss count over every rank), so the summed
  // gradient is that of the step's mean loss. done(u) runs as soon as unit
  // u's gradient of this micro-batch is in grads().
  // [snippet:forward_backward]
  template <class Done>
  double forward_backward(const Batch& batch, int k, float scale, Done&& done) {
    const std::int64_t rows = batch.rows();
    upload(batch);
    auto act = [&](std::size_t i) { return act_[i].view(rows, width_[i]); };
    const std::size_t units = model_.layers.size();
    for (std::size_t u = 0; u < units; ++u) model_.layers[u].forward<Host, float>(dev_, params_[u], act(u), act(u + 1));
    const double loss = model_.loss.forward<Host, float>(dev_, act(units), on_device_);
    std::size_t cur = 0;
    model_.loss.backward<Host, float>(dev_, act(units), on_device_, dgrad_[cur].view(rows, width_[units]), scale);
    for (std::size_t u = units; u-- > 0; cur = 1 - cur) {
      const MatView<float> dx = u == 0 ? MatView<float>{} : dgrad_[1 - cur].view(rows, width_[u]);
      model_.layers[u].backward<Host, float>(dev_, params_[u], grad_views_[u], act(u), act(u + 1),
                                             dgrad_[cur].view(rows, width_[u + 1]), dx);
      accumulate(u, k);
      done(u);
    }
    return loss;
  }
  // [/snippet:forward_backward]

 private:
  // x into the first activation; the labels the loss reads into device memory.
  void upload(const Batch& batch) {
    if (batch.rows() > rows_)
      throw config_error("a micro-batch of " + std::to_string(batch.rows()) + " rows is larger than batch_size " +
                             std::to_string(rows_),
                         "give the loader the batch_size the model was set up for");
    const auto x = batch.at("x").values<float>();
    dev_.copy_from_host(act_[0].data(), x.data(), x.size());
    const HostTensor& y = batch.at("y");
    const auto labels = y.values<std::int32_t>();
    dev_.copy_from_host(labels_.data(), labels.data(), labels.size());
    on_device_.set(
        "y", DeviceTensor{y.type, y.shape, reinterpret_cast<const std::byte*>(labels_.data()), y.bytes.data(), {}});
  }

  // Layers overwrite their gradient: the first micro-batch's is copied into
  // the accumulator, later ones are added (fp32, as the Trainer sums them).
  void accumulate(std::size_t u, int k) {
    const auto& unit = layout_.units()[u];
    const float* src = grads_.data() + unit.train_offset;
    float* dst = summed_.data() + unit.train_offset;
    if (k == 0)
      dev_.copy(dst, src, unit.train_size);
    else
      dev_.for_each(unit.train_size, AccumulateInto<float>{dst, src});
  }

  Host& dev_;
  mlp::Model& model_;
  const ModelLayout& layout_;
  Host::buffer<float> grads_, summed_;
  Host::buffer<std::int32_t> labels_;
  std::int64_t rows_;
  std::vector<std::int64_t> width_;  // width_[u]: unit u's input width; width_.back(): the classes
  std::vector<Host::buffer<float>> act_;
  Host::buffer<float> dgrad_[2];
  std::vector<std::vector<MatView<const float>>> params_;
  std::vector<std::vector<MatView<float>>> grad_views_;
  DeviceBatch on_device_;
};

// The steps both strategies share. reduce(u) runs when unit u's gradient of
// the step's last micro-batch is summed (the strategy starts its reduction,
// which overlaps the backward of the units below); update(step) then
// finishes the reductions and applies the optimizer.
// [snippet:steps]
template <class Reduce, class Update>
void run_steps(Job& job, Net& net, Reduce&& reduce, Update&& update) {
  const mlp::Config& c = job.c;
  DistributedSampler sampler(job.data.size(), job.world, {.shuffle = true, .seed = c.seed});
  DataLoader loader(job.data, sampler, {.batch_size = c.batch_size, .num_workers = c.num_workers});
  std::vector<Batch> micro(static_cast<std::size_t>(c.accumulate));
  const int last = c.accumulate - 1;
  for (std::int64_t step = 1; step <= c.steps; ++step) {
    double count = 0, loss = 0;
    for (Batch& b : micro) {
      b = loader.next();
      count += job.model.loss.count(b);
    }
    count = job.sum_over_ranks(count);  // the loss normaliser: every rank's samples
    const auto scale = static_cast<float>(1.0 / count);
    for (int k = 0; k <= last; ++k)
      loss += net.forward_backward(micro[static_cast<std::size_t>(k)], k, scale, [&](std::size_t u) {
        if (k == last) reduce(u);
      });
    update(step);
    loss = job.sum_over_ranks(loss) / count;
    if (job.world.rank() == 0 && (step == 1 || step % c.log_every == 0 || step == c.steps))
      std::printf("step %5lld/%lld | loss %.4f\n", static_cast<long long>(step), static_cast<long long>(c.steps), loss);
  }
}
// [/snippet:steps]

// DDP: every rank holds the whole model; each bucket of the summed gradient
// is all-reduced as soon as backward has finished its units.
// [snippet:ddp]
void train_ddp(Job& job) {
  const ModelLayout layout = job.layout(1);
  const std::size_t n = layout.trainable_flat_size();
  auto params = make_buffer<float>(job.dev, n);  // fp32: the master weights are the parameters
  // Every rank draws the initial values from the seed, then rank 0's are
  // broadcast, so the replicas start identical.
  std::vector<float> init(n);
  for (const auto& unit : layout.units())
    init_unit_values(unit, job.c.seed, std::span(init).subspan(unit.train_offset, unit.train_padded), {});
  job.dev.copy_from_host(params.data(), init.data(), n);
  job.comm.broadcast(params.span(), 0).wait();

  Net net(job, layout, params.data());
  const BucketOptions buckets{.bucket_bytes = static_cast<std::size_t>(job.c.bucket_mb * (1 << 20))};
  GradReducer<Host> reducer(job.dev, job.comm, layout.buckets(buckets, sizeof(float)), net.grads(), n);
  FlatOptimizer<Host> optimizer = job.optimizer(n);
  run_steps(
      job, net, [&](std::size_t u) { reducer.unit_done(u); },
      [&](std::int64_t step) {
        reducer.finish();  // grads(): the sum over every rank
        optimizer.step(params.data(), net.grads(), static_cast<float*>(nullptr), {.lr = job.c.lr, .step = step});
      });
  job.save(layout, params.data());
}
// [/snippet:ddp]

// ZeRO-1: parameters and gradients replicated, the fp32 master weights and
// the optimizer state split between the ranks. Each unit's summed gradient
// is reduce-scattered into this rank's gradient shard; the optimizer updates
// the shard; an all-gather puts every rank's updated shard into the
// replicated parameters.
// [snippet:zero1]
void train_zero1(Job& job) {
  const int W = job.world.size();
  const ModelLayout layout = job.layout(static_cast<std::size_t>(W));  // every unit padded to a multiple of W
  ShardGroups<Host> groups(job.world, job.dev, job.comm, W);           // one shard group: every rank
  // This rank's shard of every unit, drawn from the seed unit by unit.
  ShardedParams<Host, float> master(job.dev, layout, groups, job.c.seed, memory_category::master, false);
  auto grad_shard = make_buffer<float>(job.dev, master.size(), zero_init);
  ShardReducer<Host, float> reducer(job.dev, layout, groups, grad_shard.data());
  auto params = make_buffer<float>(job.dev, layout.trainable_flat_size());  // replicated, what units read
  // Each rank casts its shard into its slot of a unit's parameters and the
  // all-gather fills the others, in place; every unit in flight at once.
  auto gather = [&] {
    std::vector<ShardedParams<Host, float>::Gather> gathers;
    for (std::size_t u = 0; u < layout.units().size(); ++u)
      gathers.push_back(master.gather(u, params.data() + layout.units()[u].train_offset, nullptr));
    for (auto& g : gathers) g.join(job.dev);
  };
  gather();

  Net net(job, layout, params.data());
  FlatOptimizer<Host> optimizer = job.optimizer(master.size());  // state for the shard only
  run_steps(
      job, net,
      [&](std::size_t u) {
        const UnitSlots& unit = layout.units()[u];
        if (unit.train_size == 0) return;  // an activation: nothing to reduce
        reducer.submit(u, 0, net.grads() + unit.train_offset, grad_shard.data() + unit.train_offset / W);
      },
      [&](std::int64_t step) {
        reducer.drain();  // grad_shard: this rank's shard of the sum over every rank
        optimizer.step(master.master(), grad_shard.data(), static_cast<float*>(nullptr),
                       {.lr = job.c.lr, .step = step});
        gather();
      });
  job.save(layout, params.data());  // fp32: the gathered parameters are the master weights
}
// [/snippet:zero1]

// [snippet:train]
void train(const mlp::Config& c, World& world) {
  Job job(c, world);
  if (world.rank() == 0)
    std::printf("own_loop: %d rank(s), strategy=%s accumulate=%d batch=%lld/rank, transport %s\n", world.size(),
                c.strategy.c_str(), c.accumulate, static_cast<long long>(c.batch_size), job.comm.description().c_str());
  try {
    if (c.strategy == "zero1")
      train_zero1(job);
    else
      train_ddp(job);
  } catch (const std::exception& e) {
    examples::report_failure(e);  // while the communicator stands: see common/report.hpp
    throw;
  }
}
// [/snippet:train]

}  // namespace own_loop

// [snippet:main]
int main(int argc, char** argv) {
  try {
    const mlp::Config c = examples::parse_cli<mlp::Config>(argc, argv, "own_loop", own_loop::usage,
                                                           own_loop::declare_extra, own_loop::validate_extra);
    dtrain::World world = examples::init_world(c);
    own_loop::train(c, world);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    examples::report_failure(e);
    return examples::exit_status(e);
  }
}
// [/snippet:main]
