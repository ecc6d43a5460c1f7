// The Trainer on Device<Cuda> (cuBLAS, kernels, NCCL at world size 1)
// against the same Trainer on Device<Host>, for every strategy, precision and
// accumulation; and with offloaded states (pinned host memory, the copy
// stream) against the same GPU run without. Exits 77 without a GPU.
#include <support/gpu_main.hpp>

#include <dtrain/trainer.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

using namespace dtrain;

namespace {
struct Net {
  nn::Linear l1{7, 15};
  nn::LayerNorm ln{15};
  nn::GELU act;
  nn::Linear frozen{15, 16, {.bias = true, .trainable = false}};
  nn::Linear head{16, 5};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, ln, act, frozen, head); }
};

Batch batch(int step, std::int64_t rows) {
  struct {
    std::vector<float> x;
    std::vector<std::int32_t> y;
  } b;
  for (std::int64_t i = 0; i < rows * 7; ++i) b.x.push_back(std::sin(0.37f * static_cast<float>(i + 13 * step)) + 0.1f);
  for (std::int64_t r = 0; r < rows; ++r) b.y.push_back(static_cast<std::int32_t>((r + step) % 5));
  return Batch::table(b.x, b.y, rows, 7);
}

template <class Dev, class Kind, class Prec, int A>
std::map<std::string, std::vector<float>> train(World& w, offload_kind offload = offload_kind::none) {
  Net net;
  TrainerOptions o{.seed = 4};
  o.offload = offload;
  Trainer<Net, Device<Dev>, Strategy<Kind>, Prec, Accumulate<A>> t(w, net, SGD{.lr = 0.1f, .momentum = 0.9f}, o);
  for (int s = 0; s < 4; ++s) {
    std::vector<Batch> micro;
    for (int k = 0; k < A; ++k) micro.push_back(batch(s * A + k, 16 - 3 * k));  // uneven micro-batches
    t.step(micro);
  }
  return t.parameters();
}

template <class Prec, class Kind = DDP, int A = 1>
void compare(double tol) {
  BOOST_TEST_CONTEXT(Kind::name << " Accumulate<" << A << ">") {
  auto worlds = make_local_worlds(1);
  const auto host = train<Host, Kind, Prec, A>(worlds[0]);
  const auto gpu = train<Cuda, Kind, Prec, A>(worlds[0]);
  for (const auto& [name, h] : host) {
    const auto& g = gpu.at(name);
    for (std::size_t i = 0; i < h.size(); ++i) {
      BOOST_TEST_INFO(name << "[" << i << "]");
      BOOST_TEST(std::abs(h[i] - g[i]) <= tol * std::max(1.f, std::abs(h[i])));
    }
  }
  }
}

// The host's optimizer pass rounds like the GPU's up to fused multiply-adds,
// so offloaded and device-resident runs agree to a few ulps per step.
template <class Prec, class Kind, int A>
void compare_offload(offload_kind offload, double tol) {
  BOOST_TEST_CONTEXT(Kind::name << " offload=" << offload_name(offload) << " Accumulate<" << A << ">") {
  auto worlds = make_local_worlds(1);
  const auto plain = train<Cuda, Kind, Prec, A>(worlds[0]);
  const auto off = train<Cuda, Kind, Prec, A>(worlds[0], offload);
  for (const auto& [name, p] : plain) {
    const auto& o = off.at(name);
    for (std::size_t i = 0; i < p.size(); ++i) {
      BOOST_TEST_INFO(name << "[" << i << "]");
      BOOST_TEST(std::abs(p[i] - o[i]) <= tol * std::max(1.f, std::abs(p[i])));
    }
  }
  }
}

template <class Prec, double Tol>
void every_strategy() {
  compare<Prec, FSDP<FullShard>, 1>(Tol);
  compare<Prec, FSDP<ShardGradOp>, 2>(Tol);
  compare<Prec, FSDP<NoShard>, 1>(Tol);
  compare<Prec, FSDP<HybridShard>, 2>(Tol);
  compare<Prec, ZeRO1, 2>(Tol);
}
}  // namespace

// SGD keeps update differences proportional to gradient differences (Adam
// would amplify sign flips of tiny gradients into lr-sized steps).
// fp32: cuBLAS and OpenBLAS sum in different orders; 4 steps stay within 1e-4.
BOOST_AUTO_TEST_CASE(cuda_trainer_matches_host_fp32) { compare<Precision<fp32>>(1e-4); }
// bf16 compute: intermediates rounded to bf16 (2^-8 relative) on both sides
// from differently ordered fp32 sums; 4 steps of lr 0.1 stay within 1e-2.
BOOST_AUTO_TEST_CASE(cuda_trainer_matches_host_bf16) { compare<Precision<bf16>>(1e-2); }
// bf16 reduced in bf16 (reduce_dtype same) over 2 micro-batches.
BOOST_AUTO_TEST_CASE(cuda_trainer_matches_host_bf16_reduce_bf16) { compare<Precision<bf16, bf16>, DDP, 2>(1e-2); }
// fp16 with dynamic loss scaling over 4 micro-batches: both devices see the
// same overflow-free scaled gradients, so the scale moves the same way, and
// fp16 rounds 8x finer than bf16 (2^-11 against 2^-8).
BOOST_AUTO_TEST_CASE(cuda_trainer_matches_host_fp16_accumulate_4) { compare<Precision<fp16>, DDP, 4>(2e-3); }
BOOST_AUTO_TEST_CASE(cuda_trainer_matches_host_fp32_accumulate_4) { compare<Precision<fp32>, DDP, 4>(1e-4); }

// The sharded strategies over the same Cuda kernels (at world size 1 every
// shard group has one rank: gathers are casts, reductions are copies).
BOOST_AUTO_TEST_CASE(cuda_sharded_strategies_match_host_fp32) { every_strategy<Precision<fp32>, 1e-4>(); }
BOOST_AUTO_TEST_CASE(cuda_sharded_strategies_match_host_bf16) { every_strategy<Precision<bf16>, 1e-2>(); }
BOOST_AUTO_TEST_CASE(cuda_sharded_strategies_match_host_fp16) { every_strategy<Precision<fp16>, 2e-3>(); }

// Offloaded states on the GPU path: every strategy with its largest offload.
BOOST_AUTO_TEST_CASE(cuda_offload_matches_the_device_resident_run) {
  compare_offload<Precision<fp32>, DDP, 2>(offload_kind::optimizer, 1e-5);
  compare_offload<Precision<bf16>, FSDP<FullShard>, 1>(offload_kind::params, 1e-2);
  compare_offload<Precision<fp32>, FSDP<ShardGradOp>, 2>(offload_kind::optimizer, 1e-5);
  compare_offload<Precision<bf16>, FSDP<HybridShard>, 1>(offload_kind::params, 1e-2);
  compare_offload<Precision<bf16>, ZeRO1, 2>(offload_kind::optimizer, 1e-2);
}
