// Every strategy on the GPU against the host and against GPU DDP in fp16
// (strategies_cuda.hpp).
#include "strategy/strategies_cuda.hpp"
#include <boost/test/unit_test.hpp>

using namespace dtrain;
using namespace dtrain::testing;

BOOST_AUTO_TEST_SUITE(on_gpu_fp16)

// World size 1: NCCL, as a one-GPU job runs.
BOOST_AUTO_TEST_CASE(world_1_nccl) { every_strategy_and_accumulation<Precision<fp16>>(1); }
// Several ranks on the one GPU: the sharded logic with Cuda compute.
BOOST_AUTO_TEST_CASE(world_2_one_gpu) { every_strategy_and_accumulation<Precision<fp16>>(2); }
BOOST_AUTO_TEST_CASE(world_3_one_gpu) { every_strategy_and_accumulation<Precision<fp16>>(3); }

BOOST_AUTO_TEST_CASE(offload) {
  for (const int n : {1, 2, 3}) check<FSDP<ShardGradOp>, Precision<fp16>, 2>(n, offload_kind::params);
}

BOOST_AUTO_TEST_SUITE_END()
