// A strategy written the way a user writes one: in this file, outside
// include/, against the public extension point (a kind tag, a class that
// models dtrain::TrainingStrategy, a dtrain::strategy_impl specialisation)
// and trained with through Strategy<LocalSGD>, without touching a dtrain
// header.
//
// Local SGD (periodic model averaging): every rank takes optimizer steps on
// its own gradients, and every `period` steps the ranks average their
// weights. It trades some statistical efficiency for 1/period of DDP's
// communication. Checked against a float64 reference of the same algorithm,
// against DDP (period 1 with plain SGD is DDP's update), and for its options'
// validation.

#define BOOST_TEST_MODULE user_strategy
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "support/ranks.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/trainer.hpp>

namespace {

using namespace dtrain;
using dtrain::testing::require;
using dtrain::testing::run_ranks;

// ---- the user's strategy -----------------------------------------------------

// [snippet:user_strategy_kind]
// The kind tag: what Strategy<> takes, and the name checkpoints record.
struct LocalSGD {
  static constexpr std::string_view name = "local-sgd";
};

struct LocalSgdOptions {
  int period = 4;  // optimizer steps between two weight averages
};
// [/snippet:user_strategy_kind]

// Every rank holds the whole model in fp32. The gradient a rank steps on is
// its own micro-batches' (scaled by the world size, so with even batches it
// is the local mean; the Trainer normalises the loss by the global count).
template <class Dev, class T, class R>
class LocalSgdStrategy {
  static_assert(std::is_same_v<T, float>, "this LocalSGD computes in fp32: use Precision<fp32>");
  using binding = CommBinding<Dev>;
  template <class E>
  using buffer = typename Dev::template buffer<E>;

 public:
  using options = LocalSgdOptions;

  static std::size_t shard_count(const World&, const options& o) {
    if (o.period < 1)
      throw config_error("LocalSgdOptions::period = " + std::to_string(o.period), "average every 1 or more steps");
    return 1;  // nothing sharded: no padding
  }

  LocalSgdStrategy(const StrategyContext<Dev>& ctx, const options& o)
      : dev_(ctx.dev),
        layout_(ctx.layout),
        comm_(ctx.comm),
        world_(ctx.world.size()),
        rank_(ctx.world.rank()),
        period_(o.period) {
    const std::size_t n = layout_.trainable_flat_size();
    master_ = make_buffer<float>(dev_, n, memory_category::params);
    grad_ = make_buffer<float>(dev_, n, zero_init, memory_category::grads);
    micro_ = make_buffer<float>(dev_, n, zero_init, memory_category::grads);
    frozen_ = make_buffer<T>(dev_, layout_.frozen_flat_size(), memory_category::params);
    scalar_ = make_buffer<float>(dev_, 1);
    // DDP's initial values: every rank from the seed, then rank 0's broadcast.
    std::vector<float> train(n), frozen(layout_.frozen_flat_size());
    for (const auto& unit : layout_.units())
      init_unit_values(unit, ctx.seed, std::span(train).subspan(unit.train_offset, unit.train_padded),
                       std::span(frozen).subspan(unit.frozen_offset, unit.frozen_padded));
    dev_.copy_from_host(master_.data(), train.data(), n);
    dev_.copy_from_host(frozen_.data(), frozen.data(), frozen.size());
    auto w1 = binding::broadcast(comm_, dev_, master_.span(), 0);
    auto w2 = binding::broadcast(comm_, dev_, frozen_.span(), 0);
    binding::join(w1, dev_);
    binding::join(w2, dev_);
    // Each parameter a [shape[0], rest] matrix at its offset in its unit's segment.
    for (const auto& unit : layout_.units()) {
      auto& p = params_.emplace_back();
      auto& g = grads_.emplace_back();
      for (const auto& slot : unit.params) {
        const std::int64_t rows = slot.spec.shape[0], cols = slot.spec.numel() / rows;
        if (slot.spec.trainable) {
          p.push_back({master_.data() + slot.offset, rows, cols});
          g.push_back({micro_.data() + slot.offset, rows, cols});
        } else {
          p.push_back({frozen_.data() + slot.offset, rows, cols});
          g.push_back({});
        }
      }
    }
  }

  void before_forward(std::size_t, int) {}
  void after_forward(std::size_t, int) {}
  void before_backward(std::size_t, int) {}
  // Micro-batch k's gradient of unit u: the first one copied, later ones added.
  void after_backward(std::size_t u, int k) {
    const auto& unit = layout_.units()[u];
    if (unit.train_size == 0) return;
    float* dst = grad_.data() + unit.train_offset;
    const float* src = micro_.data() + unit.train_offset;
    if (k == 0)
      dev_.for_each(unit.train_size, Cast<float, float>{src, dst});
    else
      dev_.for_each(unit.train_size, AccumulateInto<float>{dst, src});
  }
  UnitParams<const T> params(std::size_t u) const { return params_[u]; }
  UnitParams<T> grads(std::size_t u) const { return grads_[u]; }

  void finish_gradients() {
    if (grad_.size()) dev_.for_each(grad_.size(), Scale<float>{grad_.data(), static_cast<float>(world_)});
  }
  // The norm of every rank's gradient together (one scalar all-reduce), so
  // clipping and fp16 skips decide alike on every rank.
  double grad_norm_squared() {
    const float mine =
        grad_.size() ? static_cast<float>(dev_.sum(grad_.size(), SquaredNorm<float>{grad_.data()})) : 0.f;
    dev_.copy_from_host(scalar_.data(), &mine, 1);
    auto w = binding::all_reduce(comm_, dev_, scalar_.span(), reduce_op::sum);
    binding::join(w, dev_);
    float all = 0.f;
    dev_.copy_to_host(&all, scalar_.data(), 1);
    return all;
  }
  OwnedFlat<T> owned() { return {master_.data(), grad_.data(), nullptr, master_.size()}; }
  // [snippet:user_strategy_average]
  void after_optimizer() {
    if (++steps_ % period_ != 0 || master_.size() == 0) return;
    auto w = binding::all_reduce(comm_, dev_, master_.span(), reduce_op::sum);
    binding::join(w, dev_);
    dev_.for_each(master_.size(), Scale<float>{master_.data(), 1.f / static_cast<float>(world_)});
  }
  // [/snippet:user_strategy_average]

  // This rank's replica (ranks differ between averages).
  void read_unit(std::size_t u, std::span<float> train, std::span<T> frozen) {
    const auto& unit = layout_.units()[u];
    dev_.copy_to_host(train.data(), master_.data() + unit.train_offset, unit.train_size);
    dev_.copy_to_host(frozen.data(), frozen_.data() + unit.frozen_offset, unit.frozen_size);
  }
  // Rank 0's replica is the one saved (save right after an average).
  Ownership ownership() const { return replicated_ownership(layout_, rank_); }
  std::span<T> frozen_storage() { return frozen_.span(); }
  void after_load() {}

  std::int64_t steps() const { return steps_; }

 private:
  Dev& dev_;
  const ModelLayout& layout_;
  typename binding::comm_type& comm_;
  int world_, rank_, period_;
  std::int64_t steps_ = 0;
  buffer<float> master_, grad_, micro_, scalar_;
  buffer<T> frozen_;
  std::vector<std::vector<MatView<const T>>> params_;
  std::vector<std::vector<MatView<T>>> grads_;
};

}  // namespace

// [snippet:user_strategy_impl]
// The one line that plugs the kind in.
template <class Dev, class T, class R>
struct dtrain::strategy_impl<LocalSGD, Dev, T, R> {
  using type = LocalSgdStrategy<Dev, T, R>;
};
// [/snippet:user_strategy_impl]

namespace {

// ---- the test ----------------------------------------------------------------

constexpr std::int64_t in_features = 5, out_features = 3, rows = 4;

struct Net {
  nn::Linear fc{in_features, out_features};
  nn::MSELoss loss;
  auto units() { return std::tie(fc); }
};

// Random non-zero inputs and targets, different for every (step, rank, micro-batch).
Batch batch(int step, int rank, int micro) {
  std::mt19937 gen(static_cast<std::uint32_t>(1000 * step + 10 * rank + micro + 1));
  std::uniform_real_distribution<float> u(0.25f, 1.f);
  std::bernoulli_distribution sign(0.5);
  auto draw = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = sign(gen) ? u(gen) : -u(gen);
    return v;
  };
  Batch b;
  b.set("x", HostTensor::of(draw(rows * in_features), {rows, in_features}));
  b.set("y", HostTensor::of(draw(rows * out_features), {rows, out_features}));
  return b;
}

std::vector<Batch> micro_batches(int step, int rank, int accumulate) {
  std::vector<Batch> out;
  for (int k = 0; k < accumulate; ++k) out.push_back(batch(step, rank, k));
  return out;
}

// Local SGD in float64 over the same batches: W [out, in], b [out].
struct Reference {
  std::vector<std::vector<double>> w, b;  // per rank

  void step(int s, int world, int accumulate, double lr, int period, int taken) {
    const double count = static_cast<double>(world) * accumulate * rows * out_features;  // MSE's global normaliser
    for (int r = 0; r < world; ++r) {
      auto& W = w[static_cast<std::size_t>(r)];
      auto& B = b[static_cast<std::size_t>(r)];
      std::vector<double> gw(W.size(), 0.0), gb(B.size(), 0.0);
      for (int k = 0; k < accumulate; ++k) {
        const Batch mb = batch(s, r, k);
        const auto x = mb.at("x").values<float>();
        const auto y = mb.at("y").values<float>();
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t o = 0; o < out_features; ++o) {
            double pred = B[static_cast<std::size_t>(o)];
            for (std::int64_t j = 0; j < in_features; ++j)
              pred +=
                  W[static_cast<std::size_t>(o * in_features + j)] * x[static_cast<std::size_t>(i * in_features + j)];
            const double d = 2.0 * (pred - y[static_cast<std::size_t>(i * out_features + o)]) / count * world;
            gb[static_cast<std::size_t>(o)] += d;
            for (std::int64_t j = 0; j < in_features; ++j)
              gw[static_cast<std::size_t>(o * in_features + j)] += d * x[static_cast<std::size_t>(i * in_features + j)];
          }
      }
      for (std::size_t i = 0; i < W.size(); ++i) W[i] -= lr * gw[i];
      for (std::size_t i = 0; i < B.size(); ++i) B[i] -= lr * gb[i];
    }
    if (taken % period != 0) return;
    for (auto* v : {&w, &b})
      for (std::size_t i = 0; i < (*v)[0].size(); ++i) {
        double sum = 0;
        for (const auto& rank : *v) sum += rank[i];
        for (auto& rank : *v) rank[i] = sum / world;
      }
  }
};

std::vector<float> ending(const std::map<std::string, std::vector<float>>& params, std::string_view suffix) {
  for (const auto& [name, v] : params)
    if (name.ends_with(suffix)) return v;
  BOOST_FAIL("no parameter named *" << suffix);
  return {};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(user_strategy)

// Against the float64 reference: 7 steps at world 2 and 3, period 3 (two
// averages and a tail of diverged replicas), with and without accumulation.
// fp32 against float64 over 7 small steps: stated tolerance 1e-5 absolute.
BOOST_AUTO_TEST_CASE(local_sgd_matches_its_float64_reference) {
  constexpr int period = 3, steps = 7;
  constexpr double lr = 0.05;
  for (int world : {2, 3})
    for (int accumulate : {1, 2}) {
      std::vector<std::map<std::string, std::vector<float>>> initial(static_cast<std::size_t>(world)),
          final(static_cast<std::size_t>(world));
      std::vector<std::int64_t> averages(static_cast<std::size_t>(world));
      run_ranks(world, [&](World& w) {
        Net net;
        // [snippet:user_strategy_runtime]
        TrainerCore<Net, Host, Precision<fp32>> trainer(
            w, net, SGD{.lr = static_cast<float>(lr)}, {.seed = 17}, accumulate,
            strategy_factory<LocalSGD, Host, float, float>({.period = period}));
        // [/snippet:user_strategy_runtime]
        const auto r = static_cast<std::size_t>(w.rank());
        initial[r] = trainer.parameters();
        for (int s = 0; s < steps; ++s) trainer.step(micro_batches(s, w.rank(), accumulate));
        final[r] = trainer.parameters();
        // Boost.Test's assertions are not thread-safe (their checkpoint is
        // shared): rank bodies use require, which run_ranks rethrows.
        require(trainer.strategy_name() == "local-sgd", "strategy_name() is not local-sgd");
      });
      Reference ref;
      for (int r = 0; r < world; ++r) {
        const auto w0 = ending(initial[0], ".weight"), b0 = ending(initial[0], ".bias");
        ref.w.emplace_back(w0.begin(), w0.end());
        ref.b.emplace_back(b0.begin(), b0.end());
        BOOST_TEST((initial[static_cast<std::size_t>(r)] == initial[0]), "rank " << r << " started elsewhere");
      }
      for (int s = 0; s < steps; ++s) ref.step(s, world, accumulate, lr, period, s + 1);
      double worst = 0;
      for (int r = 0; r < world; ++r) {
        const auto W = ending(final[static_cast<std::size_t>(r)], ".weight");
        const auto B = ending(final[static_cast<std::size_t>(r)], ".bias");
        for (std::size_t i = 0; i < W.size(); ++i)
          worst = std::max(worst, std::abs(W[i] - ref.w[static_cast<std::size_t>(r)][i]));
        for (std::size_t i = 0; i < B.size(); ++i)
          worst = std::max(worst, std::abs(B[i] - ref.b[static_cast<std::size_t>(r)][i]));
      }
      BOOST_TEST(worst <= 1e-5, "world " << world << ", accumulate " << accumulate << ": " << worst);
      // Step 7 is past the last average (step 6): the replicas differ again.
      BOOST_TEST((final[1] != final[0]), "replicas should have diverged after the last average");
    }
}

// Period 1 with plain SGD averages the weights after every step, which is
// DDP's update of the averaged gradient: equal up to fp32 rounding (stated
// tolerance 1e-6 relative), through the compile-time Trainer this time.
BOOST_AUTO_TEST_CASE(period_one_is_ddp) {
  std::vector<float> local, ddp;
  run_ranks(2, [&](World& w) {
    Net a, b;
    // [snippet:user_strategy_use]
    Trainer<Net, Device<Host>, Strategy<LocalSGD>, Accumulate<2>> sgd(w, a, SGD{.lr = 0.1f}, {.seed = 3},
                                                                      {.period = 1});
    // [/snippet:user_strategy_use]
    Trainer<Net, Device<Host>, Strategy<DDP>, Accumulate<2>> reference(w, b, SGD{.lr = 0.1f}, {.seed = 3});
    static_assert(std::is_same_v<decltype(sgd)::strategy_options, LocalSgdOptions>);
    for (int s = 0; s < 5; ++s) {
      sgd.step(micro_batches(s, w.rank(), 2));
      reference.step(micro_batches(s, w.rank(), 2));
    }
    require(sgd.strategy().steps() == 5, "steps() != 5");  // the strategy object itself, with its own accessors
    if (w.rank() == 0) {
      local = ending(sgd.parameters(), ".weight");
      ddp = ending(reference.parameters(), ".weight");
    }
  });
  BOOST_REQUIRE(local.size() == ddp.size());
  for (std::size_t i = 0; i < local.size(); ++i)
    BOOST_TEST(std::abs(local[i] - ddp[i]) <= 1e-6 * std::max(1.f, std::abs(ddp[i])), "element " << i);
}

// The strategy's own options are validated by its shard_count, before
// anything is allocated, on every rank.
BOOST_AUTO_TEST_CASE(bad_options_are_a_config_error) {
  run_ranks(2, [](World& w) {
    Net net;
    using T = Trainer<Net, Device<Host>, Strategy<LocalSGD>>;
    try {
      T trainer(w, net, SGD{.lr = 0.1f}, {}, {.period = 0});
    } catch (const config_error& e) {
      require(std::string(e.what()).find("LocalSgdOptions::period = 0") != std::string::npos,
              std::string("unexpected message: ") + e.what());
      return;
    }
    require(false, "period = 0 did not throw config_error");
  });
}

// A checkpoint records the user kind's name like any other.
BOOST_AUTO_TEST_CASE(checkpoints_record_the_kind) {
  const auto dir = std::filesystem::temp_directory_path() / ("dtrain_user_strategy_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  run_ranks(2, [&](World& w) {
    Net net;
    Trainer<Net, Device<Host>, Strategy<LocalSGD>> t(w, net, SGD{.lr = 0.1f}, {.seed = 5}, {.period = 1});
    t.step(micro_batches(0, w.rank(), 1));
    t.save(dir / "step-1");
  });
  BOOST_TEST(checkpoint_info(dir / "step-1").strategy == "local-sgd");
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
