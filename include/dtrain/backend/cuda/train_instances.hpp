#pragma once
// The built-in templates on dtrain::Cuda that dtrain::runtime's CUDA part
// compiles once (DTRAIN_INSTANTIATE_CUDA, core/macros.hpp): the strategies
// and their parts for every built-in precision, checkpoint I/O, tied
// parameters, optimizer placement and the built-in optimizers' device
// passes. A translation unit that nvcc compiles against dtrain::runtime takes
// them as `extern template`s, so neither their host code nor their kernels
// are compiled again; header-only, this file declares nothing.

#include "dtrain/core/macros.hpp"

#if DTRAIN_HAS_CUDA && defined(__CUDACC__)

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtrain/checkpoint/state_io.hpp"
#include "dtrain/backend/cuda/comm_binding.hpp"
#include "dtrain/backend/cuda/device.hpp"
#include "dtrain/backend/cuda/offload.hpp"
#include "dtrain/optim/flat_optimizer.hpp"
#include "dtrain/optim/lion.hpp"
#include "dtrain/strategy/ddp.hpp"
#include "dtrain/strategy/fsdp.hpp"
#include "dtrain/strategy/sharded.hpp"
#include "dtrain/strategy/zero1.hpp"
#include "dtrain/train/placement.hpp"
#include "dtrain/train/ties.hpp"

namespace dtrain {

#define DTRAIN_CUDA_STRATEGY_INSTANCES(T, R)                              \
  DTRAIN_INSTANTIATE_CUDA(class DdpStrategy<Cuda, T, R>)                  \
  DTRAIN_INSTANTIATE_CUDA(class FsdpStrategy<FullShard, Cuda, T, R>)      \
  DTRAIN_INSTANTIATE_CUDA(class FsdpStrategy<ShardGradOp, Cuda, T, R>)    \
  DTRAIN_INSTANTIATE_CUDA(class FsdpStrategy<NoShard, Cuda, T, R>)        \
  DTRAIN_INSTANTIATE_CUDA(class FsdpStrategy<HybridShard, Cuda, T, R>)    \
  DTRAIN_INSTANTIATE_CUDA(class Zero1Strategy<Cuda, T, R>)
#define DTRAIN_CUDA_DTYPE_INSTANCES(T)                                    \
  DTRAIN_INSTANTIATE_CUDA(class GradReducer<Cuda, T>)                     \
  DTRAIN_INSTANTIATE_CUDA(class detail::FullGradients<Cuda, T>)           \
  DTRAIN_INSTANTIATE_CUDA(class ShardedParams<Cuda, T>)                   \
  DTRAIN_INSTANTIATE_CUDA(class ShardReducer<Cuda, T>)                    \
  DTRAIN_INSTANTIATE_CUDA(class TiedParams<Cuda, T>)                      \
  DTRAIN_INSTANTIATE_CUDA(class OptimizerPlacement<Cuda, T>)              \
  DTRAIN_INSTANTIATE_CUDA(class CheckpointIO<Cuda, T>)
#define DTRAIN_CUDA_OPTIMIZER_INSTANCES(Opt)                                                                   \
  DTRAIN_INSTANTIATE_CUDA(struct FlatOptimizer<Cuda>::Model<Opt>)                                             \
  DTRAIN_INSTANTIATE_CUDA(FlatOptimizer<Cuda>::FlatOptimizer(Cuda&, Opt, std::size_t, std::vector<GroupRate>, \
                                                             const std::vector<std::uint8_t>&, const StateAllocator&))

DTRAIN_FOR_EACH_PRECISION(DTRAIN_CUDA_STRATEGY_INSTANCES)
DTRAIN_FOR_EACH_DTYPE(DTRAIN_CUDA_DTYPE_INSTANCES)
DTRAIN_INSTANTIATE_CUDA(class ShardGroups<Cuda>)
DTRAIN_INSTANTIATE_CUDA(class OffloadArena<Cuda>)
DTRAIN_CUDA_OPTIMIZER_INSTANCES(AdamW)
DTRAIN_CUDA_OPTIMIZER_INSTANCES(SGD)
DTRAIN_CUDA_OPTIMIZER_INSTANCES(Lion)

#undef DTRAIN_CUDA_STRATEGY_INSTANCES
#undef DTRAIN_CUDA_DTYPE_INSTANCES
#undef DTRAIN_CUDA_OPTIMIZER_INSTANCES

}  // namespace dtrain

#endif  // DTRAIN_HAS_CUDA && __CUDACC__
