#pragma once
// dtrain's umbrella header: every public piece a training program uses, the
// Trainer among them (train/trainer.hpp), and the backends
// (backend/backends.hpp). It holds no code of its own; include the piece's
// own header and the backend you train on instead to compile less.
//
//   auto world = dtrain::init();
//   dtrain::Trainer<MyModel, dtrain::Precision<dtrain::bf16>, dtrain::Accumulate<4>>
//       trainer{world, model, dtrain::AdamW{.lr = 3e-4f}};
//   auto stats = trainer.step(micro_batches);   // exactly Accumulate<N> batches
//
// Strategy<DDP | FSDP<FullShard | ShardGradOp | NoShard | HybridShard> | ZeRO1 | your own kind>
// picks where parameters, gradients and optimizer state live; the Trainer
// drives any of them through the TrainingStrategy hooks.

#include "dtrain/checkpoint/checkpoint.hpp"
#include "dtrain/checkpoint/state_io.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/fault.hpp"
#include "dtrain/data/loader.hpp"
#include "dtrain/data/sampler.hpp"
#include "dtrain/hf/checkpoint.hpp"
#include "dtrain/hf/config.hpp"
#include "dtrain/hf/model.hpp"
#include "dtrain/io/safetensors.hpp"
#include "dtrain/kernels/elementwise.hpp"
#include "dtrain/kernels/optimizer.hpp"
#include "dtrain/kernels/reduce.hpp"
#include "dtrain/launch/init.hpp"
#include "dtrain/model/init.hpp"
#include "dtrain/model/layout.hpp"
#include "dtrain/model/unit.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/any_unit.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/convolution.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/dropout.hpp"
#include "dtrain/nn/embedding.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/linear.hpp"
#include "dtrain/nn/patch_embedding.hpp"
#include "dtrain/nn/regression_loss.hpp"
#include "dtrain/nn/rms_norm.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/nn/transformer.hpp"
#include "dtrain/optim/config.hpp"
#include "dtrain/optim/flat_optimizer.hpp"
#include "dtrain/optim/lion.hpp"
#include "dtrain/optim/param_groups.hpp"
#include "dtrain/optim/schedule.hpp"
#include "dtrain/policy/policies.hpp"
#include "dtrain/strategy/any_strategy.hpp"
#include "dtrain/strategy/ddp.hpp"
#include "dtrain/strategy/fsdp.hpp"
#include "dtrain/strategy/strategy.hpp"
#include "dtrain/strategy/zero1.hpp"
#include "dtrain/train/options.hpp"
#include "dtrain/train/trainer.hpp"
#include "dtrain/version.hpp"
// Last: the backends (Host, and Cuda where CUDA is found) with their
// instance lists, which name the templates above.
#include "dtrain/backend/backends.hpp"
