// Every strategy on the GPU against the host and against GPU DDP in fp32
// (strategies_cuda.hpp).
#include "strategy/strategies_cuda.hpp"
#include <boost/test/unit_test.hpp>

using namespace dtrain;
using namespace dtrain::testing;

BOOST_AUTO_TEST_SUITE(on_gpu_fp32)

// World size 1: NCCL, as a one-GPU job runs.
BOOST_AUTO_TEST_CASE(world_1_nccl) { every_strategy_and_accumulation<Precision<fp32>>(1); }
// Several ranks on the one GPU: the sharded logic with Cuda compute.
BOOST_AUTO_TEST_CASE(world_2_one_gpu) { every_strategy_and_accumulation<Precision<fp32>>(2); }
BOOST_AUTO_TEST_CASE(world_3_one_gpu) { every_strategy_and_accumulation<Precision<fp32>>(3); }

// Offloaded states on the GPU path (pinned host memory, the copy stream)
// against the host trainer with the same offload, which is bit-identical to
// the host trainer without.
BOOST_AUTO_TEST_CASE(offload) {
  for (const int n : {1, 2, 3}) {
    check<DDP, Precision<fp32>, 2>(n, offload_kind::optimizer);
    check<FSDP<FullShard>, Precision<fp32>, 1>(n, offload_kind::optimizer);
  }
}

// One stored weight read by two units: its gradient spliced on the device.
BOOST_AUTO_TEST_CASE(tied_parameters) {
  for (const int n : {1, 2, 3}) {
    check<DDP, Precision<fp32>, 1, TiedNet>(n);
    check<ZeRO1, Precision<fp32>, 2, TiedNet>(n);
  }
}

BOOST_AUTO_TEST_SUITE_END()
