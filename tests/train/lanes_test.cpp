// Lanes (activations that skip units: model/unit.hpp, nn/lanes.hpp) through
// the Trainer, against a float64 reference written here. The model
//   h1 = Linear(x); lane 0 = h1 (nn::WriteLane)
//   h2 = Linear(h1) + lane 0 (nn::AddLane)
//   h3 = Linear(h2); h4 = [h3 | lane 0] (nn::ConcatLane)
//   out = Linear(h4), MSE against y
// reads lane 0 twice, so the writer's input gradient sums three paths.
// Every parameter's gradient (one SGD step with lr = 1) within 2e-5 of the
// largest |parameter| + |gradient| (fp32): at 1 rank; at 2 ranks under DDP
// with Accumulate<2> and uneven micro-batches, under FSDP (FullShard), and
// with activation checkpointing (the writer recomputed); a model whose
// reader comes before the lane's writer, or whose lane has two writers, is
// refused by name; model_activation_bytes counts the lane and its gradient.
#define BOOST_TEST_MODULE lanes
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "support/ranks.hpp"
#include "train/step_check.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/nn/lanes.hpp>
#include <dtrain/trainer.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

constexpr std::int64_t F = 3, H = 4, E = 2, D = 2, N = 5;

struct LaneNet {
  nn::Linear l1{F, H};
  nn::WriteLane write{0};
  nn::Linear l2{H, H};
  nn::AddLane add{0};
  nn::Linear l3{H, E};
  nn::ConcatLane concat{0, H};
  nn::Linear l4{E + H, D};
  nn::MSELoss loss;
  auto units() { return std::tie(l1, write, l2, add, l3, concat, l4); }
};

using Values = std::map<std::string, std::vector<float>>;

// Samples [first, first + n) of a fixed set of N: x [n, F], y [n, D].
Batch samples(std::int64_t first, std::int64_t n) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> u(0.2f, 1.5f);
  std::vector<float> x(N * F), y(N * D);
  for (auto& v : x) v = (rng() % 2 ? 1.f : -1.f) * u(rng);
  for (auto& v : y) v = (rng() % 2 ? 1.f : -1.f) * u(rng);
  Batch b;
  b.set("x", HostTensor::of(std::vector<float>(x.begin() + first * F, x.begin() + (first + n) * F), {n, F}));
  b.set("y", HostTensor::of(std::vector<float>(y.begin() + first * D, y.begin() + (first + n) * D), {n, D}));
  return b;
}

using Vec = std::vector<double>;

// y = W x + b for one sample (W [out, in]).
Vec affine(const Vec& W, const Vec& b, const Vec& x) {
  Vec y(b);
  for (std::size_t o = 0; o < b.size(); ++o)
    for (std::size_t i = 0; i < x.size(); ++i) y[o] += W[o * x.size() + i] * x[i];
  return y;
}

// dW += dy x^T, db += dy; returns W^T dy.
Vec affine_back(const Vec& W, const Vec& x, const Vec& dy, Vec& dW, Vec& db) {
  Vec dx(x.size(), 0.0);
  for (std::size_t o = 0; o < dy.size(); ++o) {
    db[o] += dy[o];
    for (std::size_t i = 0; i < x.size(); ++i) {
      dW[o * x.size() + i] += dy[o] * x[i];
      dx[i] += W[o * x.size() + i] * dy[o];
    }
  }
  return dx;
}

// The float64 gradient of the mean squared error over all N samples.
Values reference_grads(const Values& p) {
  const auto d = [&](const std::string& name) { return Vec(p.at(name).begin(), p.at(name).end()); };
  const Vec W1 = d("0.weight"), b1 = d("0.bias"), W2 = d("2.weight"), b2 = d("2.bias"), W3 = d("4.weight"),
            b3 = d("4.bias"), W4 = d("6.weight"), b4 = d("6.bias");
  Vec dW1(W1.size()), db1(b1.size()), dW2(W2.size()), db2(b2.size()), dW3(W3.size()), db3(b3.size()), dW4(W4.size()),
      db4(b4.size());
  const Batch all = samples(0, N);
  const auto xs = all.at("x").values<float>(), ys = all.at("y").values<float>();
  for (std::int64_t n = 0; n < N; ++n) {
    const Vec x(xs.begin() + n * F, xs.begin() + (n + 1) * F);
    const Vec h1 = affine(W1, b1, x);
    Vec h2 = affine(W2, b2, h1);
    for (std::int64_t i = 0; i < H; ++i) h2[i] += h1[i];
    const Vec h3 = affine(W3, b3, h2);
    Vec h4(h3);
    h4.insert(h4.end(), h1.begin(), h1.end());
    const Vec out = affine(W4, b4, h4);
    Vec dout(D);
    for (std::int64_t k = 0; k < D; ++k) dout[k] = 2 * (out[k] - ys[n * D + k]) / static_cast<double>(N * D);
    const Vec dh4 = affine_back(W4, h4, dout, dW4, db4);
    const Vec dh3(dh4.begin(), dh4.begin() + E);
    const Vec dh2 = affine_back(W3, h2, dh3, dW3, db3);
    Vec dh1 = affine_back(W2, h1, dh2, dW2, db2);
    for (std::int64_t i = 0; i < H; ++i) dh1[i] += dh2[i] + dh4[E + i];  // the AddLane and ConcatLane readers
    affine_back(W1, x, dh1, dW1, db1);
  }
  const auto f32 = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };
  return {{"0.weight", f32(dW1)}, {"0.bias", f32(db1)}, {"2.weight", f32(dW2)}, {"2.bias", f32(db2)},
          {"4.weight", f32(dW3)}, {"4.bias", f32(db3)}, {"6.weight", f32(dW4)}, {"6.bias", f32(db4)}};
}

// One step at `ranks` ranks of Trainer<LaneNet, Policies...>; rank r takes
// the micro-batches parts(r).
template <class... Policies, class Parts>
void check_run(int ranks, Parts parts, const TrainerOptions& options, const std::string& what) {
  Values before, after;
  run_ranks(ranks, [&](World& w) {
    LaneNet net;
    Trainer<LaneNet, Policies...> t(w, net, SGD{.lr = 1.f}, options);
    const Values p0 = t.parameters();
    t.step(parts(w.rank()));
    const Values p1 = t.parameters();
    if (w.rank() == 0) before = p0, after = p1;
  });
  check_sgd_step(before, after, reference_grads(before), 2e-5, what);
}

}  // namespace

BOOST_AUTO_TEST_CASE(lanes_train_as_the_float64_reference) {
  const TrainerOptions plain{.seed = 3};
  check_run(
      1, [](int) { return std::vector<Batch>{samples(0, N)}; }, plain, "1 rank");
  // Rank 0 takes samples 0-1 and 2, rank 1 samples 3 and 4.
  const auto uneven = [](int rank) {
    return rank == 0 ? std::vector<Batch>{samples(0, 2), samples(2, 1)}
                     : std::vector<Batch>{samples(3, 1), samples(4, 1)};
  };
  check_run<Strategy<DDP>, Accumulate<2>>(2, uneven, plain, "DDP, 2 ranks, Accumulate<2>");
  const auto halves = [](int rank) { return std::vector<Batch>{rank == 0 ? samples(0, 3) : samples(3, 2)}; };
  check_run<Strategy<FSDP<FullShard>>>(2, halves, plain, "FSDP FullShard, 2 ranks");
  const TrainerOptions recompute{.seed = 3, .activation_checkpointing = true};
  check_run<Strategy<DDP>>(2, halves, recompute, "DDP, 2 ranks, activation checkpointing");
}

namespace {

struct ReadFirst {
  nn::Linear l1{F, H};
  nn::AddLane add{0};
  nn::WriteLane write{0};
  nn::Linear l2{H, D};
  nn::MSELoss loss;
  auto units() { return std::tie(l1, add, write, l2); }
};

struct TwoWriters {
  nn::Linear l1{F, H};
  nn::WriteLane write{0};
  nn::WriteLane again{0};
  nn::Linear l2{H, D};
  nn::MSELoss loss;
  auto units() { return std::tie(l1, write, again, l2); }
};

template <class Net>
std::string refusal() {
  std::string message;
  run_ranks(1, [&](World& w) {
    Net net;
    Trainer<Net> t(w, net, SGD{.lr = 1.f});
    try {
      t.step(std::vector<Batch>{samples(0, 2)});
    } catch (const config_error& e) {
      message = e.what();
    }
  });
  return message;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_lane_read_before_it_is_written_or_written_twice_is_refused) {
  const std::string early = refusal<ReadFirst>(), twice = refusal<TwoWriters>();
  BOOST_TEST(early.find("unit 1 reads lane 0, which no earlier unit writes") != std::string::npos, early);
  BOOST_TEST(twice.find("unit 2 writes lane 0, which unit 1 writes too") != std::string::npos, twice);
}

BOOST_AUTO_TEST_CASE(activation_bytes_count_the_lanes) {
  LaneNet net;
  const std::int64_t B = N;
  // x, then each unit's output: l1 H, write H, l2 H, add H, l3 E, concat E + H, l4 D.
  const std::int64_t acts = B * (F + H + H + H + H + E + (E + H) + D);
  const std::int64_t grads = 2 * B * (E + H);  // the largest activation
  std::int64_t saved = 0;
  dtrain::detail::for_each_unit(net.units(), [&](std::size_t, auto& u) {
    saved += saved_size_of(u, {B, 1}, 8);  // (no unit of these keeps anything)
  });
  const std::int64_t lane = 2 * B * H;  // lane 0 and its gradient
  BOOST_TEST(saved == 0);
  BOOST_TEST(model_activation_bytes(net, {B, 1}, F, 0, 4, false) ==
             static_cast<std::size_t>((acts + grads + lane) * 4));
}
