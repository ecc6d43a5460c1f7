// Checkpoints (DESIGN.md property 5): saved at N ranks under any strategy,
// loaded at M ranks under any strategy, training continues as if never
// interrupted; verification, model checks and pretrained weights. Ranks are
// threads of this process over real Gloo communicators, files are real.
#define BOOST_TEST_MODULE checkpoint
#include <boost/test/unit_test.hpp>

#include <strategy/common.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

using namespace dtrain;
using namespace dtrain::testing;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(DTRAIN_TEST_BINARY_DIR) / "scratch" / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

constexpr std::int64_t global_rows = 12;  // every step; split evenly over 1, 2, 3 or 4 ranks

// Step s's micro-batches for rank r of n: the same 12 global rows whatever n is.
std::vector<Batch> step_batches(int s, int rank, int n, int micro) {
  const std::int64_t per_rank = global_rows / n, per_micro = per_rank / micro;
  std::vector<Batch> out;
  for (int k = 0; k < micro; ++k) out.push_back(rows_of(s, rank * per_rank + k * per_micro, per_micro));
  return out;
}

// Every strategy, to save under and to load under.
using Kinds = std::tuple<DDP, FSDP<FullShard>, FSDP<ShardGradOp>, FSDP<NoShard>, FSDP<HybridShard>, ZeRO1>;

template <class Kind, class Opt, class... Ps>
using Net = Trainer<UnevenNet, Device<Host>, Strategy<Kind>, Ps...>;

TrainerOptions options_for(int n) {
  TrainerOptions o{.seed = 11};
  o.sharding.shard_group = n == 4 ? 2 : 0;
  return o;
}

// Trains `steps` steps from the start (or from `resume`), optionally saving
// after `save_after` steps into `save_dir`; returns rank 0's parameters.
template <class Kind, class Opt, class Prec = Precision<fp32>>
Params run(int n, Opt opt, int first_step, int last_step, const fs::path& resume = {}, int save_after = -1,
           const fs::path& save_dir = {}) {
  Params out;
  std::mutex mu;
  run_ranks(n, [&](World& w) {
    UnevenNet net;
    Trainer<UnevenNet, Device<Host>, Strategy<Kind>, Prec> t(w, net, opt, options_for(n));
    if (!resume.empty()) {
      const auto info = t.load(resume);
      require(info.step == first_step, "loaded step " + std::to_string(info.step));
      require(t.steps_taken() == first_step, "steps_taken after load");
    }
    for (int s = first_step; s < last_step; ++s) {
      t.step(step_batches(s, w.rank(), n, 1));
      if (s + 1 == save_after) t.save(save_dir);
    }
    auto p = t.parameters();
    std::lock_guard lock(mu);
    if (w.rank() == 0) out = std::move(p);
  });
  return out;
}

// f(std::type_identity<Kind>{}, index of Kind in Kinds) for every kind.
template <class F>
void for_each_kind(F&& f) {
  [&]<class... K>(std::type_identity<std::tuple<K...>>) {
    int i = 0;
    (f(std::type_identity<K>{}, i++), ...);
  }(std::type_identity<Kinds>{});
}

}  // namespace

// Same world size and strategy: resuming at step 2 and training to step 4 is
// bit-identical to training to step 4 at once, for every strategy.
BOOST_AUTO_TEST_CASE(resume_at_the_same_world_size_is_bit_identical) {
  for_each_kind([]<class Kind>(std::type_identity<Kind>, int) {
    for (int n : {1, 3}) {
      const auto dir = scratch(std::string("same_") + std::string(Kind::name) + "_" + std::to_string(n));
      const auto adam = AdamW{.lr = 1e-2f};
      const Params straight = run<Kind>(n, adam, 0, 4);
      run<Kind>(n, adam, 0, 2, {}, 2, dir);
      const Params resumed = run<Kind>(n, adam, 2, 4, dir);
      BOOST_TEST((resumed == straight), Kind::name << " at " << n << " ranks: resumed run differs");
    }
  });
}

// Property 5: saved at N ranks under strategy A, loaded at M ranks under
// strategy B, training continues as the uninterrupted run at M ranks under B
// does (the same rows each step; fp32 sums in another order: 1e-5). Every
// (strategy, N, M) saves once and loads under a strategy that rotates with
// them, so each strategy saves and loads at every pair of world sizes.
BOOST_AUTO_TEST_CASE(saved_at_n_ranks_loads_at_m_ranks_under_any_strategy) {
  const auto sgd = SGD{.lr = 0.1f, .momentum = 0.9f};
  std::map<std::pair<int, int>, Params> straight;  // (load kind, m) -> uninterrupted run
  for_each_kind([&]<class Save>(std::type_identity<Save>, int save_index) {
    for (int n : {1, 2, 3}) {
      const auto dir = scratch(std::string("resave_") + std::string(Save::name) + "_" + std::to_string(n));
      run<Save>(n, sgd, 0, 2, {}, 2, dir);
      for (int m : {1, 2, 3})
        for_each_kind([&]<class Load>(std::type_identity<Load>, int load_index) {
          if ((save_index + n + m + load_index) % std::tuple_size_v<Kinds> != 0) return;
          auto& want = straight[{load_index, m}];
          if (want.empty()) want = run<Load>(m, sgd, 0, 4);
          const Params resumed = run<Load>(m, sgd, 2, 4, dir);
          std::string where;
          const double d = max_rel_diff(resumed, want, &where);
          BOOST_TEST(d <= 1e-5, Save::name << " at " << n << " -> " << Load::name << " at " << m << ": " << d
                                           << " at " << where);
        });
    }
  });
}
