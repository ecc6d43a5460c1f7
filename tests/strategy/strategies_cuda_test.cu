// The Trainer on Device<Cuda> against the same Trainer on Device<Host>
// (strategies_cuda.hpp): this file holds main() and the memory checks, the
// strategies_cuda_<precision>_test.cu files the strategy comparisons.
//  - world size 1 over NCCL, every strategy, precision and accumulation;
//  - world sizes 2 and 3 on the one GPU, every strategy x fp32/bf16/fp16 x
//    Accumulate 1 and 2, against the Host trainer at the same world size and
//    against Cuda DDP; offloaded states and tied parameters the same way;
//  - the allocator's figures against cudaMemGetInfo, and the offloaded
//    device/host split against the estimate.
// Exits 77 without a GPU.
#include "support/gpu_main.hpp"
// gpu_main.hpp first: it sets Boost.Test up for its own main() before anything includes Boost.Test.

#include <cmath>
#include <tuple>

#include "strategy/strategies_cuda.hpp"

#include <dtrain/train/estimate.hpp>

using namespace dtrain;
using namespace dtrain::testing;

namespace {

// Wide enough that the model states on the GPU are gigabytes even in bf16:
// cudaMalloc's rounding of each allocation (to 2 MiB pages) is then well
// under 2% of them.
struct WideNet {
  nn::Linear l1{4096, 8192};
  nn::GELU act;
  nn::Linear l2{8192, 8192};
  nn::GELU act2;
  nn::Linear l3{8192, 8192};
  nn::GELU act3;
  nn::Linear l4{8192, 4096};
  nn::Linear head{4096, 16};
  nn::SoftmaxCrossEntropy loss;
  auto units() { return std::tie(l1, act, l2, act2, l3, act3, l4, head); }
};

Batch wide_batch(std::int64_t rows) {
  std::vector<float> x(static_cast<std::size_t>(rows * 4096));
  std::vector<std::int32_t> y(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(r % 16);
  return Batch::table(x, y, rows, 4096);
}

std::size_t used_bytes() {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::size_t free = 0, total = 0;
  cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

double sum(const MemoryUsage& m) {
  return static_cast<double>(m.params + m.grads + m.optimizer + m.master + m.gathered + m.activations + m.other);
}

// What the GPU gives a trainer beyond what its allocator counts (cuBLAS's
// workspace for the trainer's handle, NCCL's buffers), measured on a tiny
// model: the same for any model, so it is subtracted below.
template <class Kind, class Prec>
double fixed_cost(World& w) {
  const std::size_t before = used_bytes();
  TiedNet net;
  Trainer<TiedNet, Device<Cuda>, Strategy<Kind>, Prec> t(w, net, AdamW{});
  t.step(micro_batches(0, 0, {4}));
  return static_cast<double>(used_bytes()) - static_cast<double>(before) - sum(t.device().memory_by_category());
}

// `check_total`: compare the allocator's total with cudaMemGetInfo (where
// the GPU holds gigabytes; with the parameters offloaded it holds a few
// hundred MiB, on which the per-allocation rounding alone exceeds 2%).
template <class Kind, class Prec>
void memory_is_what_the_allocator_reports(offload_kind offload, bool check_total) {
  run_ranks(1, [&](World& w) {
    fixed_cost<Kind, Prec>(w);  // the first absorbs one-time costs (kernel modules, the context)
    const double fixed = fixed_cost<Kind, Prec>(w);
    const std::size_t before = used_bytes();
    WideNet net;
    TrainerOptions o{.seed = 1};
    o.offload = offload;
    Trainer<WideNet, Device<Cuda>, Strategy<Kind>, Prec> t(w, net, AdamW{}, o);
    const Batch b = wide_batch(64);
    t.step(std::span(&b, 1));
    const double measured = static_cast<double>(used_bytes() - before) - fixed;
    const double reported = sum(t.device().memory_by_category());
    std::printf("%s %s offload=%s: cudaMemGetInfo %.1f MiB (less %.1f MiB fixed), allocator %.1f MiB (%+.2f%%)\n",
                std::string(Kind::name).c_str(), std::string(dtype_traits<typename Prec::param_type>::name).c_str(),
                std::string(offload_name(offload)).c_str(), measured / 1048576, fixed / 1048576, reported / 1048576,
                100 * (measured - reported) / reported);
    if (check_total)
      BOOST_TEST(std::abs(measured - reported) <= 0.02 * reported, "the allocator's total is within 2% of the GPU's");

    // The split between the GPU and the host is the estimate's.
    EstimateInputs in;
    in.units = declared_units(net);
    in.compute_bytes = sizeof(typename Prec::param_type);
    in.reduce_bytes = sizeof(typename Prec::reduce_type);
    in.strategy = std::string(Kind::name);
    in.world = 1;
    in.shard_group = 1;
    in.offload = offload;
    const MemorySplit e = estimate_memory_split(in);
    const MemoryUsage dev = t.memory(), host = t.host_memory();
    const std::tuple<const char*, std::size_t, std::size_t> rows[] = {
        {"device params", dev.params, e.device.params},
        {"device grads", dev.grads, e.device.grads},
        {"device optimizer", dev.optimizer, e.device.optimizer},
        {"device master", dev.master, e.device.master},
        {"host params", host.params, e.host.params},
        {"host grads", host.grads, e.host.grads},
        {"host optimizer", host.optimizer, e.host.optimizer},
        {"host master", host.master, e.host.master}};
    for (const auto& [name, got, want] : rows)
      BOOST_TEST(got == want, name << ": measured " << got << ", estimated " << want);
  });
}

}  // namespace

BOOST_AUTO_TEST_CASE(allocator_figures_match_cuda_mem_get_info) {
  memory_is_what_the_allocator_reports<DDP, Precision<fp32>>(offload_kind::none, true);
  memory_is_what_the_allocator_reports<FSDP<FullShard>, Precision<bf16>>(offload_kind::none, true);
  memory_is_what_the_allocator_reports<DDP, Precision<bf16>>(offload_kind::optimizer, true);
  memory_is_what_the_allocator_reports<FSDP<FullShard>, Precision<bf16>>(offload_kind::params, false);
}
