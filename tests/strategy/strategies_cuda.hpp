#pragma once
// Shared by the strategies_cuda_test sources (one per precision, so 16 cores
// compile them side by side): the Trainer on Device<Cuda> against the same
// Trainer on Device<Host> and against DDP on the GPU, at world size 1 over
// NCCL and at world sizes 2 and 3 on one GPU (each rank a thread with its own
// Cuda device: stream and cuBLAS handle; collectives over the host transport,
// CommOptions::gpu = host).

#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "strategy/common.hpp"
#include "support/strategy_options.hpp"
#include <boost/test/unit_test.hpp>

#include <dtrain/trainer.hpp>

namespace dtrain::testing {

// Tolerances, relative to max(1, |host value|), for parameters after a few
// SGD steps. fp32: cuBLAS and OpenBLAS sum in other orders and the GPU fuses
// multiply-adds, differences of a few ulps in each gradient that SGD passes
// on scaled by the learning rate. bf16 compute: intermediates rounded to
// 2^-8 on both sides from differently ordered fp32 sums. fp16: rounds 8x
// finer than bf16 (2^-11). SGD keeps update differences proportional to
// gradient differences (Adam would turn sign flips of tiny gradients into
// lr-sized steps).
template <class Prec>
constexpr double tolerance = std::is_same_v<typename Prec::param_type, float>  ? 1e-6
                             : std::is_same_v<typename Prec::param_type, bf16> ? 1e-2
                                                                               : 2e-3;

inline const SGD sgd{.lr = 0.1f, .momentum = 0.9f};

// HybridShard's group for n ranks: replicated pairs at 2, one group at 3.
inline int hybrid_group(int n) { return n == 3 ? 3 : 1; }

// x -> Linear(W) -> ReLU -> Linear(W tied) -> ReLU -> head: W read by two units.
struct TiedNet {
  nn::Linear in{features, features};
  nn::ReLU r1;
  nn::Linear mid{features, features, {.tie_weight = "0.weight"}};
  nn::ReLU r2;
  nn::Linear head{features, classes};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(in, r1, mid, r2, head); }
};

// Rank 0's parameters after `steps` steps of Kind at world n on Dev (ranks
// as threads, the GPU's collectives over the host transport when n > 1);
// every rank must read the same parameters.
template <class Dev, class Kind, class Prec, int A, class Net = UnevenNet>
Params train(int n, offload_kind offload = offload_kind::none, int steps = 3) {
  const std::vector<std::int64_t> sizes = A == 1 ? std::vector<std::int64_t>{6} : std::vector<std::int64_t>{5, 3};
  std::vector<Params> last(static_cast<std::size_t>(n));
  const CommOptions comm{.gpu = gpu_transport::host};
  run_ranks(
      n,
      [&](World& w) {
        Net net;
        TrainerOptions o{.seed = 42};
        o.offload = offload;
        Trainer<Net, Device<Dev>, Strategy<Kind>, Prec, Accumulate<A>> t(w, net, sgd, o,
                                                                         kind_options<Kind, Dev>(hybrid_group(n)));
        for (int s = 0; s < steps; ++s) t.step(micro_batches(s, w.rank(), sizes));
        last[static_cast<std::size_t>(w.rank())] = t.parameters();
      },
      n == 1 ? CommOptions{} : comm);
  for (int r = 1; r < n; ++r)
    BOOST_TEST((last[static_cast<std::size_t>(r)] == last[0]), "rank " << r << " reads other parameters than rank 0");
  return last[0];
}

// Kind on the GPU against the Host trainer and against DDP on the GPU, at
// world size n, with the given offload.
template <class Kind, class Prec, int A, class Net = UnevenNet>
void check(int n, offload_kind offload = offload_kind::none) {
  const std::string what = std::string(Kind::name) + " " + std::string(dtype_traits<typename Prec::param_type>::name) +
                           " A=" + std::to_string(A) + " world " + std::to_string(n) +
                           " offload=" + std::string(offload_name(offload));
  const Params host = train<Host, Kind, Prec, A, Net>(n, offload);
  const Params gpu = train<Cuda, Kind, Prec, A, Net>(n, offload);
  std::string at;
  const double vs_host = max_rel_diff(gpu, host, &at);
  BOOST_TEST(vs_host <= tolerance<Prec>, what << ": GPU vs host " << vs_host << " at " << at);
  double vs_ddp = 0;
  if constexpr (!std::is_same_v<Kind, DDP>) {
    const Params ddp = train<Cuda, DDP, Prec, A, Net>(n);
    vs_ddp = max_rel_diff(gpu, ddp, &at);
    BOOST_TEST(vs_ddp <= tolerance<Prec>, what << ": GPU vs GPU DDP " << vs_ddp << " at " << at);
  }
  std::printf("%-58s vs host %.2e, vs GPU DDP %.2e\n", what.c_str(), vs_host, vs_ddp);
}

template <class Prec, int A>
void every_strategy(int n) {
  check<DDP, Prec, A>(n);
  check<FSDP<FullShard>, Prec, A>(n);
  check<FSDP<ShardGradOp>, Prec, A>(n);
  check<FSDP<NoShard>, Prec, A>(n);
  check<FSDP<HybridShard>, Prec, A>(n);
  check<ZeRO1, Prec, A>(n);
}

template <class Prec>
void every_strategy_and_accumulation(int n) {
  every_strategy<Prec, 1>(n);
  every_strategy<Prec, 2>(n);
}

}  // namespace dtrain::testing
