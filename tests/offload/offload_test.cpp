// Offload (policy/offload.hpp, offload/arena.hpp) on the host path: the
// offloaded states live in the arena's own host memory and every copy between
// it and the compute device is made, so this is the code a GPU runs, with
// memcpy for cudaMemcpyAsync. For every strategy x {optimizer, param shards}
// x precision x accumulation, training with offload gives parameters
// bit-identical to training without it; checkpoints move between offload
// settings, strategies and world sizes; the host/device memory split equals
// dtrain-estimate's; and what cannot be combined is a clear error.
#define BOOST_TEST_MODULE strategy_offload
#include <filesystem>
#include <mutex>
#include <sstream>
#include <tuple>

#include "strategy/common.hpp"
#include "support/strategy_options.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/train/estimate.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

// Two ranks: HybridShard as two replicated groups of one.
constexpr int ranks = 2;

std::vector<std::int64_t> sizes_for(int accumulate) {
  return accumulate == 1 ? std::vector<std::int64_t>{6} : std::vector<std::int64_t>{5, 3};
}

// AdamW with decay, no decay on biases and norms, clipping that bites: every
// host-side piece of the step (the grouped pass, the norm, the clip
// coefficient) is exercised.
TrainerOptions options_with(offload_kind offload) {
  TrainerOptions o{.seed = 7};
  o.clip.max_norm = 0.5;
  o.param_groups = {no_decay_group()};
  o.offload = offload;
  return o;
}
const AdamW adamw{.lr = 1e-2f, .weight_decay = 0.1f};

// Trains the same batches with and without `offload`; checks losses and
// parameters after every step are equal bit for bit.
template <class Kind, class Prec, int A>
void offload_matches(offload_kind offload, int steps = 3) {
  std::mutex mu;
  std::string failure;
  run_ranks(ranks, [&](World& w) {
    UnevenNet a, b;
    using Tr = Trainer<UnevenNet, Device<Host>, Prec, Accumulate<A>, Strategy<Kind>>;
    Tr plain(w, a, adamw, options_with(offload_kind::none), kind_options<Kind>(1));
    Tr off(w, b, adamw, options_with(offload), kind_options<Kind>(1));
    for (int s = 0; s < steps; ++s) {
      const auto mb = micro_batches(s, w.rank(), sizes_for(A));
      const StepStats p = plain.step(mb), o = off.step(mb);
      std::string at;
      const double d = max_rel_diff(off.parameters(), plain.parameters(), &at);
      const bool same = off.parameters() == plain.parameters() && p.loss == o.loss && p.grad_norm == o.grad_norm &&
                        p.skipped == o.skipped;
      if (!same) {
        std::lock_guard lock(mu);
        failure = "step " + std::to_string(s) + ": loss " + std::to_string(p.loss) + " vs " + std::to_string(o.loss) +
                  ", largest difference " + std::to_string(d) + " at " + at;
        return;
      }
    }
  });
  BOOST_TEST(failure.empty(), Kind::name << " offload=" << offload_name(offload) << " "
                                         << dtype_traits<typename Prec::param_type>::safetensors_name << " A=" << A
                                         << ": " << failure);
}

template <class Kind>
void every_case() {
  std::vector<offload_kind> kinds{offload_kind::optimizer};
  if constexpr (detail::is_fsdp<Kind>) kinds.push_back(offload_kind::params);
  for (const offload_kind k : kinds) {
    offload_matches<Kind, Precision<fp32>, 1>(k);
    offload_matches<Kind, Precision<fp32>, 2>(k);
    offload_matches<Kind, Precision<bf16>, 1>(k);
    offload_matches<Kind, Precision<bf16, bf16>, 2>(k);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(ddp_offload_is_bit_identical) { every_case<DDP>(); }
BOOST_AUTO_TEST_CASE(fsdp_full_shard_offload_is_bit_identical) { every_case<FSDP<FullShard>>(); }
BOOST_AUTO_TEST_CASE(fsdp_shard_grad_op_offload_is_bit_identical) { every_case<FSDP<ShardGradOp>>(); }
BOOST_AUTO_TEST_CASE(fsdp_no_shard_offload_is_bit_identical) { every_case<FSDP<NoShard>>(); }
BOOST_AUTO_TEST_CASE(fsdp_hybrid_shard_offload_is_bit_identical) { every_case<FSDP<HybridShard>>(); }
BOOST_AUTO_TEST_CASE(zero1_offload_is_bit_identical) { every_case<ZeRO1>(); }

// fp16's loss scaling: an overflowing step is skipped alike with and without
// offload (the host norm sees the inf), and the scale follows.
BOOST_AUTO_TEST_CASE(fp16_skips_alike_under_offload) {
  offload_matches<FSDP<FullShard>, Precision<fp16>, 1>(offload_kind::params, 4);
  offload_matches<ZeRO1, Precision<fp16>, 2>(offload_kind::optimizer, 4);
}

// The Offload<...> policy sets TrainerOptions::offload.
BOOST_AUTO_TEST_CASE(the_policy_sets_the_offload) {
  run_ranks(1, [](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Device<Host>, Strategy<FSDP<FullShard>>, Offload<ParamShards>> t(w, net, adamw);
    BOOST_TEST((t.offload() == offload_kind::params));
    BOOST_TEST(t.host_memory().master > 0u);
    BOOST_TEST(t.memory().master == 0u);
    UnevenNet other;
    const auto conflicting = [&] {
      TrainerOptions o;
      o.offload = offload_kind::optimizer;
      Trainer<UnevenNet, Device<Host>, Strategy<FSDP<FullShard>>, Offload<ParamShards>> bad(w, other, adamw, o);
    };
    BOOST_CHECK_EXCEPTION(conflicting(), config_error, [](const config_error& e) {
      return std::string(e.what()).find("set the offload in one place") != std::string::npos;
    });
  });
}

// Parameter shards need a strategy that shards parameters: at run time (a
// strategy chosen from a config) the same rule is a config_error naming the fix.
BOOST_AUTO_TEST_CASE(param_offload_with_a_replicating_strategy_is_an_error) {
  run_ranks(1, [](World& w) {
    for (const bool zero1 : {false, true}) {
      UnevenNet net;
      const auto make = [&] {
        TrainerCore<UnevenNet, Host, Precision<fp32>> t(
            w, net, adamw, options_with(offload_kind::params), 1,
            zero1 ? strategy_factory<ZeRO1, Host, float, float>() : strategy_factory<DDP, Host, float, float>());
      };
      BOOST_CHECK_EXCEPTION(make(), config_error, [](const config_error& e) {
        const std::string m = e.what();
        return m.find("offload 'params' with strategy") != std::string::npos &&
               m.find("offloads at most 'optimizer'") != std::string::npos && m.find("fsdp-full") != std::string::npos;
      });
    }
  });
}

namespace {

// `first` steps with one strategy / offload / world size, saved; then the
// rest with another after loading. Returns rank 0's final parameters.
template <class KindA, class KindB>
Params resume_across(offload_kind off_a, int n_a, offload_kind off_b, int n_b, const std::filesystem::path& dir) {
  constexpr int first = 2, total = 4;
  const auto global_rows = [](int step, int rank, int n) {
    // 12 rows per step split over the ranks: the same global batch at any world size.
    const std::int64_t per = 12 / n;
    return std::vector<Batch>{rows_of(step, rank * per, per)};
  };
  std::filesystem::remove_all(dir);
  run_ranks(n_a, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Device<Host>, Strategy<KindA>> t(w, net, adamw, options_with(off_a), kind_options<KindA>(1));
    for (int s = 0; s < first; ++s) t.step(global_rows(s, w.rank(), n_a));
    t.save(dir);
  });
  Params out;
  std::mutex mu;
  run_ranks(n_b, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Device<Host>, Strategy<KindB>> t(w, net, adamw, options_with(off_b), kind_options<KindB>(1));
    t.load(dir);
    for (int s = first; s < total; ++s) t.step(global_rows(s, w.rank(), n_b));
    Params p = t.parameters();
    std::lock_guard lock(mu);
    if (w.rank() == 0) out = std::move(p);
  });
  std::filesystem::remove_all(dir);
  return out;
}

}  // namespace

// Checkpoints do not record the offload: saved with it, resumed without it
// at another world size and strategy, and the reverse, the parameters are
// those of the same sequence without any offload.
BOOST_AUTO_TEST_CASE(checkpoints_move_between_offload_settings) {
  const auto dir = std::filesystem::temp_directory_path() / ("dtrain_offload_ckpt_" + std::to_string(::getpid()));
  const Params reference = resume_across<FSDP<FullShard>, DDP>(offload_kind::none, 2, offload_kind::none, 3, dir);
  const Params saved_offloaded =
      resume_across<FSDP<FullShard>, DDP>(offload_kind::params, 2, offload_kind::none, 3, dir);
  BOOST_TEST((saved_offloaded == reference), "fsdp-full offload=params x2 -> ddp x3");
  const Params loaded_offloaded =
      resume_across<FSDP<FullShard>, DDP>(offload_kind::none, 2, offload_kind::optimizer, 3, dir);
  BOOST_TEST((loaded_offloaded == reference), "fsdp-full x2 -> ddp offload=optimizer x3");
  const Params zero1 = resume_across<ZeRO1, FSDP<FullShard>>(offload_kind::optimizer, 3, offload_kind::params, 2, dir);
  const Params zero1_reference =
      resume_across<ZeRO1, FSDP<FullShard>>(offload_kind::none, 3, offload_kind::none, 2, dir);
  BOOST_TEST((zero1 == zero1_reference), "zero1 offload=optimizer x3 -> fsdp-full offload=params x2");
}

namespace {

template <class Kind, class Prec>
void memory_matches_estimate(offload_kind offload, int n) {
  std::mutex mu;
  std::vector<std::string> problems;
  run_ranks(n, [&](World& w) {
    UnevenNet net;
    // One parameter group: a GPU keeps a group id per element, the host none.
    TrainerOptions o = options_with(offload);
    o.param_groups.clear();
    Trainer<UnevenNet, Device<Host>, Prec, Accumulate<2>, Strategy<Kind>> t(w, net, adamw, o, kind_options<Kind>(1));
    t.step(micro_batches(0, w.rank(), sizes_for(2)));
    EstimateInputs in;
    in.units = declared_units(net);
    in.compute_bytes = sizeof(typename Prec::param_type);
    in.reduce_bytes = sizeof(typename Prec::reduce_type);
    in.accumulate = 2;
    in.strategy = std::string(Kind::name);
    in.world = n;
    in.shard_group = 1;
    in.offload = offload;
    const MemorySplit e = estimate_memory_split(in);
    const MemoryUsage dev = t.memory(), host = t.host_memory();
    const auto check = [&](const char* where, const MemoryUsage& got, const MemoryUsage& want) {
      const std::array<std::pair<const char*, std::pair<std::size_t, std::size_t>>, 4> rows{{
          {"params", {got.params, want.params}},
          {"grads", {got.grads, want.grads}},
          {"optimizer", {got.optimizer, want.optimizer}},
          {"master", {got.master, want.master}},
      }};
      for (const auto& [name, v] : rows)
        if (v.first != v.second) {
          // A stream, not a chain of std::string +: GCC 12 at -O1 reports a
          // false -Warray-bounds inside the inlined concatenation.
          std::ostringstream line;
          line << Kind::name << " offload=" << offload_name(offload) << " " << where << " " << name << ": measured "
               << v.first << ", estimated " << v.second;
          std::lock_guard lock(mu);
          problems.push_back(line.str());
        }
    };
    check("device", dev, e.device);
    check("host", host, e.host);
  });
  for (const auto& p : problems) BOOST_TEST_ERROR(p);
}

template <class Kind>
void memory_cases() {
  for (const int n : {1, 2}) {
    for (const offload_kind k : {offload_kind::none, offload_kind::optimizer}) {
      memory_matches_estimate<Kind, Precision<fp32>>(k, n);
      memory_matches_estimate<Kind, Precision<bf16>>(k, n);
    }
    if constexpr (detail::is_fsdp<Kind>) {
      memory_matches_estimate<Kind, Precision<fp32>>(offload_kind::params, n);
      memory_matches_estimate<Kind, Precision<bf16>>(offload_kind::params, n);
    }
  }
}

}  // namespace

// Model states measured by the device's and the arena's allocators equal
// the estimate's device and host parts exactly.
BOOST_AUTO_TEST_CASE(memory_split_equals_the_estimate) {
  memory_cases<DDP>();
  memory_cases<FSDP<FullShard>>();
  memory_cases<FSDP<ShardGradOp>>();
  memory_cases<FSDP<NoShard>>();
  memory_cases<FSDP<HybridShard>>();
  memory_cases<ZeRO1>();
}

namespace {
std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}
}  // namespace

// offload_dir: the optimizer state in files on a local disk, the same
// arithmetic: bit-identical to host memory and to no offload; the files are
// unlinked from the start (the directory stays empty), the bytes are those
// the estimate predicts, and a checkpoint saved so loads without it.
BOOST_AUTO_TEST_CASE(optimizer_state_on_disk_is_bit_identical) {
  const auto dir = fresh_dir("dtrain_offload_state");
  const auto ckpt = std::filesystem::temp_directory_path() / ("dtrain_offload_disk_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(ckpt);
  std::mutex mu;
  std::string failure;
  run_ranks(ranks, [&](World& w) {
    UnevenNet a, b;
    TrainerOptions on_disk = options_with(offload_kind::params);
    on_disk.offload_dir = dir;
    Trainer<UnevenNet, Device<Host>, Accumulate<2>, Strategy<FSDP<FullShard>>> plain(
        w, a, adamw, options_with(offload_kind::none), kind_options<FSDP<FullShard>>(1));
    Trainer<UnevenNet, Device<Host>, Accumulate<2>, Strategy<FSDP<FullShard>>> disk(w, b, adamw, on_disk,
                                                                                    kind_options<FSDP<FullShard>>(1));
    for (int s = 0; s < 3; ++s) {
      const auto mb = micro_batches(s, w.rank(), sizes_for(2));
      plain.step(mb);
      disk.step(mb);
      if (disk.parameters() != plain.parameters()) {
        std::lock_guard lock(mu);
        failure = "parameters differ after step " + std::to_string(s);
      }
    }
    EstimateInputs in;
    in.units = declared_units(b);
    in.accumulate = 2;
    in.strategy = "fsdp-full";
    in.world = ranks;
    in.offload = offload_kind::params;
    in.state_on_disk = true;
    const MemorySplit e = estimate_memory_split(in);
    if (disk.offload_disk_bytes() != e.disk || disk.host_memory().optimizer != 0 || e.disk == 0) {
      std::lock_guard lock(mu);
      failure += " disk bytes " + std::to_string(disk.offload_disk_bytes()) + ", estimated " + std::to_string(e.disk);
    }
    disk.save(ckpt);
  });
  BOOST_TEST(failure.empty(), failure);
  BOOST_TEST(std::filesystem::is_empty(dir), "the state files are unlinked from the start");
  // Loaded without the disk: the same parameters as the run that saved it.
  run_ranks(1, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Device<Host>, Strategy<DDP>> t(w, net, adamw, options_with(offload_kind::none));
    t.load(ckpt);
    BOOST_TEST(t.steps_taken() == 3);
  });
  std::filesystem::remove_all(ckpt);
  std::filesystem::remove_all(dir);
}

// A missing directory, or one with too little space, fails before step 1
// with one line naming the directory, the bytes and the fix.
BOOST_AUTO_TEST_CASE(a_bad_offload_directory_is_a_clear_error) {
  run_ranks(1, [](World& w) {
    UnevenNet net;
    TrainerOptions o = options_with(offload_kind::optimizer);
    o.offload_dir = "/nonexistent/dtrain-offload";
    const auto missing = [&] { Trainer<UnevenNet, Device<Host>> t(w, net, adamw, o); };
    BOOST_CHECK_EXCEPTION(missing(), config_error, [](const config_error& e) {
      const std::string m = e.what();
      return m.find("offload directory '/nonexistent/dtrain-offload' does not exist") != std::string::npos &&
             m.find("offload=nvme:DIR") != std::string::npos;
    });
    TrainerOptions not_offloaded;
    not_offloaded.offload_dir = "/tmp";
    const auto without = [&] { Trainer<UnevenNet, Device<Host>> t(w, net, adamw, not_offloaded); };
    BOOST_CHECK_EXCEPTION(without(), config_error, [](const config_error& e) {
      return std::string(e.what()).find("but nothing is offloaded") != std::string::npos;
    });
  });
  Host host(1);
  OffloadArena<Host> arena(host, offload_kind::optimizer);
  arena.use_state_dir(std::filesystem::temp_directory_path());
  const std::size_t too_much = std::numeric_limits<std::size_t>::max() / 2;
  BOOST_CHECK_EXCEPTION(arena.check_state_space(too_much), config_error, [&](const config_error& e) {
    const std::string m = e.what();
    return m.find("bytes free, and this rank's optimizer state needs " + std::to_string(too_much)) != std::string::npos;
  });
}
