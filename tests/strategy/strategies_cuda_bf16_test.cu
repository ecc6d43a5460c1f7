// Every strategy on the GPU against the host and against GPU DDP in bf16
// (strategies_cuda.hpp).
#include "strategy/strategies_cuda.hpp"
#include <boost/test/unit_test.hpp>

using namespace dtrain;
using namespace dtrain::testing;

BOOST_AUTO_TEST_SUITE(on_gpu_bf16)

// World size 1: NCCL, as a one-GPU job runs.
BOOST_AUTO_TEST_CASE(world_1_nccl) { every_strategy_and_accumulation<Precision<bf16>>(1); }
// Several ranks on the one GPU: the sharded logic with Cuda compute.
BOOST_AUTO_TEST_CASE(world_2_one_gpu) { every_strategy_and_accumulation<Precision<bf16>>(2); }
BOOST_AUTO_TEST_CASE(world_3_one_gpu) { every_strategy_and_accumulation<Precision<bf16>>(3); }

// Gradients reduced in bf16 (reduce dtype = compute dtype).
BOOST_AUTO_TEST_CASE(reduced_in_bf16) {
  for (const int n : {1, 2}) {
    check<DDP, Precision<bf16, bf16>, 2>(n);
    check<FSDP<FullShard>, Precision<bf16, bf16>, 1>(n);
  }
}

BOOST_AUTO_TEST_CASE(offload) {
  for (const int n : {1, 2, 3}) {
    check<ZeRO1, Precision<bf16>, 1>(n, offload_kind::optimizer);
    check<FSDP<FullShard>, Precision<bf16>, 2>(n, offload_kind::params);
    check<FSDP<HybridShard>, Precision<bf16>, 1>(n, offload_kind::params);
  }
}

BOOST_AUTO_TEST_CASE(tied_parameters) {
  for (const int n : {1, 2, 3}) check<FSDP<FullShard>, Precision<bf16>, 2, TiedNet>(n);
}

BOOST_AUTO_TEST_SUITE_END()
