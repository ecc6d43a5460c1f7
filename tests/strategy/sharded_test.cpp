// Every FSDP variant and ZeRO1 match DDP step by step; under sharding,
// replicas stay identical, accumulation equals the whole batch, frozen
// parameters stay frozen and an fp16 overflow skips the step. On the host
// path, with ranks as threads of this process over real Gloo communicators.
#define BOOST_TEST_MODULE strategy_sharded
#include <functional>
#include <mutex>
#include <sstream>

#include "common.hpp"
#include "support/strategy_options.hpp"
#include <boost/test/unit_test.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

// HybridShard's group for n ranks: replicated pairs at 2, one group at 3,
// two groups of two at 4 (the case a node boundary makes).
int hybrid_group(int n) { return n == 4 ? 2 : n == 3 ? 3 : 1; }

// Trains DDP and strategy S side by side on the same batches and returns the
// largest relative parameter difference seen after any step; also checks
// that every rank reads the same parameters from S (replicas identical).
template <class Kind, int A, class Prec, class Opt>
double versus_ddp(int n, Opt opt, int steps, std::string& where, TrainerOptions o = {.seed = 42}) {
  static_assert(A == 1 || A == 2 || A == 4);
  const std::vector<std::int64_t> all{5, 3, 8, 2};  // uneven micro-batches
  const std::vector<std::int64_t> sizes =
      A == 1 ? std::vector<std::int64_t>{6} : std::vector<std::int64_t>(all.begin(), all.begin() + A);
  Worst worst;
  std::vector<Params> last(static_cast<std::size_t>(n));
  run_ranks(n, [&, o](World& w) mutable {
    UnevenNet a, b;
    Trainer<UnevenNet, Device<Host>, Prec, Accumulate<A>> ddp(w, a, opt, o);
    Trainer<UnevenNet, Device<Host>, Prec, Accumulate<A>, Strategy<Kind>> sharded(w, b, opt, o,
                                                                                  kind_options<Kind>(hybrid_group(n)));
    for (int s = 0; s < steps; ++s) {
      const auto mb = micro_batches(s, w.rank(), sizes);
      const auto st_ddp = ddp.step(mb);
      const auto st = sharded.step(mb);
      require(st.skipped == st_ddp.skipped, "skip decisions differ at step " + std::to_string(s));
      std::string at;
      const double d = max_rel_diff(sharded.parameters(), ddp.parameters(), &at);
      worst.update(d, "step " + std::to_string(s) + " " + at);
    }
    last[static_cast<std::size_t>(w.rank())] = sharded.parameters();
  });
  for (int r = 1; r < n; ++r)
    BOOST_TEST((last[static_cast<std::size_t>(r)] == last[0]), "rank " << r << " reads other parameters than rank 0");
  where = worst.where;
  return worst.diff;
}

template <class Kind>
void matches_ddp_fp32() {
  for (int n : {1, 2, 3, 4})
    for (bool adam : {false, true}) {
      std::string where;
      double d1 = 0, d4 = 0;
      if (adam) {
        d1 = versus_ddp<Kind, 1, Precision<fp32>>(n, AdamW{.lr = 1e-2f}, 3, where);
        BOOST_TEST(d1 <= 1e-5, Kind::name << " AdamW n=" << n << " A=1: " << d1 << " at " << where);
        d4 = versus_ddp<Kind, 4, Precision<fp32>>(n, AdamW{.lr = 1e-2f}, 3, where);
        BOOST_TEST(d4 <= 1e-5, Kind::name << " AdamW n=" << n << " A=4: " << d4 << " at " << where);
      } else {
        d1 = versus_ddp<Kind, 1, Precision<fp32>>(n, SGD{.lr = 0.1f, .momentum = 0.9f}, 3, where);
        BOOST_TEST(d1 <= 1e-5, Kind::name << " SGD n=" << n << " A=1: " << d1 << " at " << where);
        d4 = versus_ddp<Kind, 4, Precision<fp32>>(n, SGD{.lr = 0.1f, .momentum = 0.9f}, 3, where);
        BOOST_TEST(d4 <= 1e-5, Kind::name << " SGD n=" << n << " A=4: " << d4 << " at " << where);
      }
      BOOST_TEST_MESSAGE(Kind::name << (adam ? " AdamW" : " SGD") << " n=" << n << ": max rel diff " << d1 << " (A=1), "
                                    << d4 << " (A=4)");
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(fsdp_full_shard_matches_ddp) { matches_ddp_fp32<FSDP<FullShard>>(); }
BOOST_AUTO_TEST_CASE(fsdp_shard_grad_op_matches_ddp) { matches_ddp_fp32<FSDP<ShardGradOp>>(); }
BOOST_AUTO_TEST_CASE(fsdp_no_shard_matches_ddp) { matches_ddp_fp32<FSDP<NoShard>>(); }
BOOST_AUTO_TEST_CASE(fsdp_hybrid_shard_matches_ddp) { matches_ddp_fp32<FSDP<HybridShard>>(); }
BOOST_AUTO_TEST_CASE(zero1_matches_ddp) { matches_ddp_fp32<ZeRO1>(); }

namespace {

// Every sharded strategy, in one place.
template <class F>
void for_each_strategy(F&& f) {
  f(std::type_identity<FSDP<FullShard>>{});
  f(std::type_identity<FSDP<ShardGradOp>>{});
  f(std::type_identity<FSDP<NoShard>>{});
  f(std::type_identity<FSDP<HybridShard>>{});
  f(std::type_identity<ZeRO1>{});
}

template <class Kind, class... Ps>
using Sharded = Trainer<UnevenNet, Device<Host>, Strategy<Kind>, Ps...>;

}  // namespace

// Sharded strategies match DDP in mixed precision. With the fp32 reduce
// dtype every strategy reduces the same fp32 values as DDP: measured
// bit-identical, asserted to 1e-5. With the reduce dtype equal to a 16-bit compute dtype and Accumulate<4>,
// sharded strategies round each micro-batch's reduced gradient (DDP rounds the
// accumulated sum once per step): 3 AdamW steps at lr 1e-2 then differ by up
// to 2.8e-3 relative in bf16 (stated tolerance 5e-3) and 6.4e-6 in fp16
// (stated 5e-5).
BOOST_AUTO_TEST_CASE(mixed_precision_matches_ddp_within_stated_tolerances) {
  for_each_strategy([]<class Kind>(std::type_identity<Kind>) {
    for (int n : {3, 4}) {
      std::string w;
      const auto adam = AdamW{.lr = 1e-2f};
      const auto sgd = SGD{.lr = 0.1f, .momentum = 0.9f};
      double d = versus_ddp<Kind, 1, Precision<bf16>>(n, adam, 3, w);
      BOOST_TEST(d <= 1e-5, Kind::name << " bf16 n=" << n << ": " << d << " at " << w);
      d = versus_ddp<Kind, 2, Precision<fp16>>(n, adam, 3, w);
      BOOST_TEST(d <= 1e-5, Kind::name << " fp16 n=" << n << ": " << d << " at " << w);
      d = versus_ddp<Kind, 4, Precision<bf16, bf16>>(n, adam, 3, w);
      BOOST_TEST(d <= 5e-3, Kind::name << " bf16/bf16 A=4 n=" << n << ": " << d << " at " << w);
      d = versus_ddp<Kind, 4, Precision<fp16, fp16>>(n, sgd, 3, w);
      BOOST_TEST(d <= 5e-5, Kind::name << " fp16/fp16 A=4 n=" << n << ": " << d << " at " << w);
    }
  });
}

// Clipping by the global norm under sharding: the norm sums every shard, so
// the clip coefficient and the update equal DDP's.
BOOST_AUTO_TEST_CASE(clipping_under_sharding_matches_ddp) {
  for_each_strategy([]<class Kind>(std::type_identity<Kind>) {
    TrainerOptions o{.seed = 9};
    o.clip.max_norm = 0.05f;
    for (int n : {3, 4}) {
      std::string w;
      const double d = versus_ddp<Kind, 2, Precision<fp32>>(n, SGD{.lr = 0.1f, .momentum = 0.9f}, 3, w, o);
      BOOST_TEST(d <= 1e-5, Kind::name << " clip n=" << n << ": " << d << " at " << w);
    }
  });
}

// Under sharding, an fp16 overflow skips the step on every rank,
// leaves the parameters alone and halves the scale.
BOOST_AUTO_TEST_CASE(fp16_overflow_skips_under_sharding) {
  for_each_strategy([]<class Kind>(std::type_identity<Kind>) {
    run_ranks(3, [](World& w) {
      UnevenNet net;
      TrainerOptions o{.seed = 5};
      o.loss_scale = {.initial = 1e12f, .growth = 2.f, .backoff = 0.5f, .window = 3};
      Sharded<Kind, Precision<fp16>> t(w, net, AdamW{.lr = 1e-2f}, o);
      const auto before = t.parameters();
      auto st = t.step(micro_batches(0, w.rank(), {8}));
      require(st.skipped && st.loss_scale == 5e11f,
              std::string(Kind::name) + ": an fp16 overflow must skip the step and halve the scale");
      require(t.parameters() == before, std::string(Kind::name) + ": a skipped step changed parameters");
      int s = 1;
      while (st.skipped && s < 60) st = t.step(micro_batches(s++, w.rank(), {8}));
      require(!st.skipped && t.parameters() != before, std::string(Kind::name) + ": training never resumed");
    });
  });
}

// Under every strategy, Accumulate<4> with micro-batches of 5, 3,
// 8 and 2 rows equals one batch of 18.
BOOST_AUTO_TEST_CASE(accumulation_equals_the_whole_batch_under_sharding) {
  for_each_strategy([]<class Kind>(std::type_identity<Kind>) {
    Worst worst;
    run_ranks(3, [&](World& w) {
      UnevenNet a, b;
      TrainerOptions o{.seed = 7};
      Sharded<Kind, Accumulate<4>> ta(w, a, AdamW{.lr = 1e-2f}, o);
      Sharded<Kind> tb(w, b, AdamW{.lr = 1e-2f}, o);
      for (int s = 0; s < 3; ++s) {
        ta.step(micro_batches(s, w.rank(), {5, 3, 8, 2}));
        tb.step(micro_batches(s, w.rank(), {18}));
      }
      std::string at;
      worst.update(max_rel_diff(ta.parameters(), tb.parameters(), &at), at);
    });
    // as DDP's accumulation test: fp32 sums in another order, then AdamW
    BOOST_TEST(worst.diff <= 5e-4, Kind::name << ": " << worst.diff << " at " << worst.where);
  });
}

// Under sharding, frozen parameters never change and get no
// gradient or optimizer memory (the gradient and state shards cover the
// trainable segments only).
BOOST_AUTO_TEST_CASE(frozen_parameters_under_sharding) {
  for_each_strategy([]<class Kind>(std::type_identity<Kind>) {
    run_ranks(2, [](World& w) {
      UnevenNet net;
      Sharded<Kind> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 1});
      const auto before = t.parameters();
      for (int s = 0; s < 3; ++s) t.step(micro_batches(s, w.rank(), {4}));
      const auto after = t.parameters();
      const std::string name(Kind::name);
      require(after.at("3.weight") == before.at("3.weight") && after.at("3.bias") == before.at("3.bias"),
              name + ": frozen parameters changed");
      require(after.at("0.weight") != before.at("0.weight"), name + ": trainable parameters did not change");
      const std::size_t owned = t.strategy().owned().size;
      require(owned == t.layout().trainable_flat_size() / t.layout().shards(),
              name + ": the owned flat is not the trainable shard");
      require(t.memory().optimizer == 2 * sizeof(float) * owned, name + ": optimizer state beyond the trainable shard");
    });
  });
}

// Uneven data (docs/reliability.md): rank r has 2 + 2r steps of batches; once
// out, it steps with empty micro-batches (x [0, F]). Every rank runs the same
// number of steps, the first step with no sample anywhere reports
// samples == 0 on every rank and changes nothing, and the parameters equal
// one rank trained on the rows the ranks still had at each step.
BOOST_AUTO_TEST_CASE(ranks_that_run_out_of_data_join_with_empty_batches) {
  constexpr int n = 3;
  const auto has_data = [](int rank, int step) { return step < 2 + 2 * rank; };
  const auto check = []<class Kind>(std::type_identity<Kind>, auto has) {
    std::vector<Params> joined(n);
    std::vector<int> calls(n);
    run_ranks(n, [&](World& w) {
      UnevenNet net;
      Sharded<Kind, Accumulate<2>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 7});
      for (int s = 0;; ++s) {
        const bool mine = has(w.rank(), s);
        const auto mb = micro_batches(s, w.rank(), {mine ? 5 : 0, mine ? 3 : 0});
        const auto before = t.parameters();
        const std::int64_t step_before = t.steps_taken();
        const StepStats st = t.step(mb);
        calls[static_cast<std::size_t>(w.rank())] = s + 1;
        if (st.samples > 0) continue;
        require(t.parameters() == before && st.step == step_before, "the step without data changed the model");
        break;
      }
      joined[static_cast<std::size_t>(w.rank())] = t.parameters();
    });
    // The same rows on one rank: the ranks that still had data at step s hold
    // rows [8 r, 8 r + 8) of its global batch, from the lowest such r up.
    Params alone;
    run_ranks(1, [&](World& w) {
      UnevenNet net;
      Sharded<Kind> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 7});
      for (int s = 0; s < 2 + 2 * (n - 1); ++s) {
        int first = 0;
        while (!has(first, s)) ++first;
        t.step(std::vector<Batch>{rows_of(s, 8 * first, 8 * (n - first))});
      }
      alone = t.parameters();
    });
    for (int r = 0; r < n; ++r) {
      BOOST_TEST(calls[static_cast<std::size_t>(r)] == 2 + 2 * (n - 1) + 1, Kind::name << " rank " << r);
      BOOST_TEST((joined[static_cast<std::size_t>(r)] == joined[0]), Kind::name << ": ranks disagree");
    }
    std::string at;
    const double d = max_rel_diff(joined[0], alone, &at);
    // fp32 sums over other micro-batch splits and orders, then AdamW (as the
    // accumulation test above)
    BOOST_TEST(d <= 5e-4, Kind::name << ": " << d << " at " << at);
  };
  check(std::type_identity<DDP>{}, has_data);
  for_each_strategy([&]<class Kind>(std::type_identity<Kind> k) { check(k, has_data); });
}

// In the replicated sharded modes, ranks holding the same shard
// hold bit-identical master weights after every step.
BOOST_AUTO_TEST_CASE(replicated_shards_stay_identical) {
  auto check = []<class Kind>(std::type_identity<Kind>, int n, int group) {
    std::vector<std::vector<float>> master(static_cast<std::size_t>(n));
    std::vector<int> shard(static_cast<std::size_t>(n));
    run_ranks(n, [&](World& w) {
      UnevenNet net;
      TrainerOptions o{.seed = 3};
      Sharded<Kind> t(w, net, AdamW{.lr = 1e-2f}, o, kind_options<Kind>(group));
      for (int s = 0; s < 3; ++s) t.step(micro_batches(s, w.rank(), {5}));
      const auto owned = t.strategy().owned();
      master[static_cast<std::size_t>(w.rank())].assign(owned.master, owned.master + owned.size);
      shard[static_cast<std::size_t>(w.rank())] = t.strategy().groups().rank();
    });
    for (int r = 0; r < n; ++r)
      for (int q = r + 1; q < n; ++q)
        if (shard[static_cast<std::size_t>(r)] == shard[static_cast<std::size_t>(q)])
          BOOST_TEST((master[static_cast<std::size_t>(r)] == master[static_cast<std::size_t>(q)]),
                     Kind::name << ": ranks " << r << " and " << q << " hold different copies of shard "
                                << shard[static_cast<std::size_t>(r)]);
  };
  check(std::type_identity<FSDP<HybridShard>>{}, 4, 2);
  check(std::type_identity<FSDP<HybridShard>>{}, 3, 1);
  check(std::type_identity<FSDP<NoShard>>{}, 3, 0);
}

// Which flat ranges each rank holds and writes: the writers together cover
// every parameter element exactly once, for every strategy.
BOOST_AUTO_TEST_CASE(ownership_covers_every_element_once) {
  auto check = [](auto tag, int n, int group) {
    using Kind = typename decltype(tag)::type;
    std::vector<Ownership> all(static_cast<std::size_t>(n));
    std::vector<std::pair<std::size_t, std::size_t>> sizes;  // per unit: trainable, frozen
    run_ranks(n, [&](World& w) {
      UnevenNet net;
      TrainerOptions o{.seed = 3};
      Trainer<UnevenNet, Device<Host>, Strategy<Kind>> t(w, net, SGD{.lr = 0.1f}, o, kind_options<Kind>(group));
      all[static_cast<std::size_t>(w.rank())] = t.strategy().ownership();
      if (w.rank() == 0)
        for (const auto& u : t.layout().units()) sizes.emplace_back(u.train_size, u.frozen_size);
    });
    for (std::size_t u = 0; u < sizes.size(); ++u)
      for (bool frozen : {false, true}) {
        std::vector<int> seen(frozen ? sizes[u].second : sizes[u].first, 0);
        for (const auto& o : all)
          for (const auto& r : frozen ? o.frozen : o.trainable)
            if (r.unit == u && r.writer)
              for (std::size_t i = r.begin; i < r.begin + r.count; ++i) ++seen.at(i);
        const bool once = std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; });
        BOOST_TEST(once, Kind::name << " n=" << n << ": unit " << u << (frozen ? " frozen" : " trainable")
                                    << " is not written exactly once");
      }
  };
  for (int n : {1, 3}) {
    check(std::type_identity<DDP>{}, n, 0);
    for_each_strategy([&](auto tag) { check(tag, n, n); });
  }
  check(std::type_identity<FSDP<HybridShard>>{}, 4, 2);
}

// FullShard gathers a unit for its forward and again for its backward (not
// the last unit, whose backward follows at once); ShardGradOp gathers once
// per step; both keep at most the bound of gathered units alive.
BOOST_AUTO_TEST_CASE(gathers_follow_the_mode_and_the_prefetch_bound) {
  constexpr std::size_t param_units = 5;  // l1, ln, frozen, l2, head
  for (int prefetch : {0, 1, 2}) {
    run_ranks(2, [&](World& w) {
      UnevenNet a, b;
      TrainerOptions o{.seed = 3};
      const FsdpOptions f{.prefetch = prefetch};
      Trainer<UnevenNet, Device<Host>, Strategy<FSDP<FullShard>>, Accumulate<2>> full(w, a, SGD{.lr = 0.1f}, o, f);
      Trainer<UnevenNet, Device<Host>, Strategy<FSDP<ShardGradOp>>, Accumulate<2>> keep(w, b, SGD{.lr = 0.1f}, o, f);
      for (int s = 0; s < 2; ++s) {
        full.step(micro_batches(s, w.rank(), {3, 4}));
        keep.step(micro_batches(s, w.rank(), {3, 4}));
      }
      const std::string p = " (prefetch " + std::to_string(prefetch) + ")";
      require(full.strategy().gathers_issued() == 2 * 2 * (2 * param_units - 1),
              "FullShard gathered " + std::to_string(full.strategy().gathers_issued()) + " times" + p);
      require(keep.strategy().gathers_issued() == 2 * param_units,
              "ShardGradOp gathered " + std::to_string(keep.strategy().gathers_issued()) + " times" + p);
      require(full.strategy().gathered_units_peak() == std::min<std::size_t>(prefetch + 1, param_units),
              "FullShard held " + std::to_string(full.strategy().gathered_units_peak()) + " units at once" + p);
      require(keep.strategy().gathered_units_peak() == param_units,
              "ShardGradOp held " + std::to_string(keep.strategy().gathered_units_peak()) + " units at once" + p);
    });
  }
}

// HybridShard's group must divide the world: a clear error on every rank.
BOOST_AUTO_TEST_CASE(hybrid_group_that_does_not_divide_the_world_is_an_error) {
  std::vector<std::string> errors(4);
  run_ranks(4, [&](World& w) {
    UnevenNet net;
    try {
      Sharded<FSDP<HybridShard>> t(w, net, SGD{.lr = 0.1f}, {}, FsdpOptions{.shard_group = 3});
    } catch (const config_error& e) {
      errors[static_cast<std::size_t>(w.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    BOOST_TEST_INFO(e);
    BOOST_TEST(e.find("a shard group of 3 ranks does not divide the world of 4 ranks") != std::string::npos);
    BOOST_TEST(e.find("shard_group") != std::string::npos);
  }
}

namespace {

// Rank 0's measured memory after one bf16 AdamW step of UnevenNet under
// strategy Kind at n ranks.
template <class Kind>
MemoryUsage measured(int n) {
  MemoryUsage out;
  run_ranks(n, [&](World& w) {
    UnevenNet net;
    Sharded<Kind, Precision<bf16>> t(w, net, AdamW{.lr = 1e-2f}, {.seed = 2});
    const auto st = t.step(micro_batches(0, w.rank(), {4}));
    if (w.rank() == 0) out = st.memory;
  });
  return out;
}

// `value` is `whole` split n ways plus at most `slack` (padding).
void require_share(std::size_t value, std::size_t whole, int n, std::size_t slack, const std::string& what) {
  const std::size_t share = whole / static_cast<std::size_t>(n);
  require(value >= share && value <= share + slack, what + ": " + std::to_string(value) + " bytes, expected " +
                                                        std::to_string(whole) + " / " + std::to_string(n) + " = " +
                                                        std::to_string(share) + " (+ up to " + std::to_string(slack) +
                                                        " of padding)");
}

}  // namespace

// Measured per-rank model-state memory against the world size. Per unit and
// rank, padding adds less than one element to each sharded buffer, hence the
// slack of (bytes per element) x (units with parameters).
BOOST_AUTO_TEST_CASE(memory_per_rank_falls_as_the_zero_paper_says) {
  constexpr std::size_t trainable = 15 * 7 + 15 + 15 + 15 + 17 * 16 + 17 + 5 * 17 + 5;  // l1, ln, l2, head
  constexpr std::size_t frozen = 16 * 15 + 16;
  constexpr std::size_t units = 5;
  const auto full1 = measured<FSDP<FullShard>>(1);
  const auto zero1_1 = measured<ZeRO1>(1);
  const auto ddp1 = measured<DDP>(1);
  // Mixed-precision AdamW under FullShard: 4 (fp32 master) + 4 (fp32 gradient)
  // + 8 (moments) bytes per trainable parameter, 2 per frozen one (bf16).
  BOOST_TEST(full1.master + full1.grads + full1.optimizer == 16 * trainable);
  BOOST_TEST(full1.params == 2 * frozen);
  for (int n : {2, 3, 4}) {
    const std::string at = " at " + std::to_string(n) + " ranks";
    for (const auto& [name, m] : {std::pair{"FullShard", measured<FSDP<FullShard>>(n)},
                                  std::pair{"ShardGradOp", measured<FSDP<ShardGradOp>>(n)}}) {
      require_share(m.master + m.grads + m.optimizer, 16 * trainable, n, 16 * units,
                    std::string(name) + " master+grads+optimizer" + at);
      require_share(m.params, 2 * frozen, n, 2 * units, std::string(name) + " frozen params" + at);
    }
    // ZeRO-2 keeps the whole model gathered from forward to backward; FullShard
    // only the units in flight.
    const auto keep = measured<FSDP<ShardGradOp>>(n), full = measured<FSDP<FullShard>>(n);
    require(keep.gathered >= 2 * (trainable + frozen), "ShardGradOp did not hold the gathered model" + at);
    // Both reduce the same gradients through the same turn-taking slots, so
    // the difference is the gathered parameters alone, whatever the timing.
    BOOST_TEST_MESSAGE("gathered bytes" << at << ": FullShard " << full.gathered << ", ShardGradOp " << keep.gathered);
    require(full.gathered < keep.gathered, "FullShard held as much gathered memory as ShardGradOp" + at);
    // ZeRO-1: parameters and the gradient replicated, the K = 12 bytes of
    // optimizer state (fp32 master + moments) split.
    const auto z = measured<ZeRO1>(n);
    require_share(z.master + z.optimizer, 12 * trainable, n, 12 * units, "ZeRO1 master+optimizer" + at);
    require(z.params >= zero1_1.params && z.params <= zero1_1.params + 2 * units * n,
            "ZeRO1 params are not replicated" + at);
    require(z.grads < zero1_1.grads && z.grads >= 2 * trainable + 4 * trainable, "ZeRO1 gradients" + at);
    // DDP holds everything everywhere.
    const auto d = measured<DDP>(n);
    require(
        d.params == ddp1.params && d.master == ddp1.master && d.grads == ddp1.grads && d.optimizer == ddp1.optimizer,
        "DDP memory changed with the world size" + at);
  }
}
