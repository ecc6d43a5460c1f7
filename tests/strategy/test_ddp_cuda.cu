// The Trainer on Device<Cuda> (cuBLAS, kernels, NCCL at world size 1)
// against the same Trainer on Device<Host>. Exits 77 without a GPU.
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
  nn::Linear head{15, 5};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, ln, act, head); }
};

Batch batch(int step, std::int64_t rows) {
  Batch b;
  b.rows = rows;
  b.features = 7;
  for (std::int64_t i = 0; i < rows * 7; ++i) b.x.push_back(std::sin(0.37f * static_cast<float>(i + 13 * step)) + 0.1f);
  for (std::int64_t r = 0; r < rows; ++r) b.y.push_back(static_cast<std::int32_t>((r + step) % 5));
  return b;
}

template <class Dev, class Prec>
std::map<std::string, std::vector<float>> train(World& w) {
  Net net;
  Trainer<Net, Device<Dev>, Prec> t(w, net, SGD{.lr = 0.1f, .momentum = 0.9f}, {.seed = 4});
  for (int s = 0; s < 4; ++s) t.step(std::vector<Batch>{batch(s, 16)});
  return t.parameters();
}

template <class Prec>
void compare(double tol) {
  auto worlds = make_local_worlds(1);
  const auto host = train<Host, Prec>(worlds[0]);
  const auto gpu = train<Cuda, Prec>(worlds[0]);
  for (const auto& [name, h] : host) {
    const auto& g = gpu.at(name);
    for (std::size_t i = 0; i < h.size(); ++i) {
      BOOST_TEST_INFO(name << "[" << i << "]");
      BOOST_TEST(std::abs(h[i] - g[i]) <= tol * std::max(1.f, std::abs(h[i])));
    }
  }
}
}  // namespace

// SGD keeps update differences proportional to gradient differences (Adam
// would amplify sign flips of tiny gradients into lr-sized steps).
// fp32: cuBLAS and OpenBLAS sum in different orders; 4 steps stay within 1e-4.
BOOST_AUTO_TEST_CASE(cuda_trainer_matches_host_fp32) { compare<Precision<fp32>>(1e-4); }
// bf16 compute: intermediates rounded to bf16 (2^-8 relative) on both sides
// from differently ordered fp32 sums; 4 steps of lr 0.1 stay within 1e-2.
BOOST_AUTO_TEST_CASE(cuda_trainer_matches_host_bf16) { compare<Precision<bf16>>(1e-2); }
