#pragma once
// dtrain's built-in templates, as the few lists a backend applies to its
// device (backend/<name>/train_instances.hpp), gathered from the list each
// template's header keeps beside the template:
//
//   DTRAIN_BUILTIN_PRECISION_TEMPLATES(X, Dev, T, R)  per built-in precision (DTRAIN_FOR_EACH_PRECISION)
//   DTRAIN_BUILTIN_DTYPE_TEMPLATES(X, Dev, T)         per compute dtype (DTRAIN_FOR_EACH_DTYPE)
//   DTRAIN_BUILTIN_DEVICE_TEMPLATES(X, Dev)           once per device
//   DTRAIN_BUILTIN_OPTIMIZER_TEMPLATES(X, Dev, Opt)   per built-in optimizer (DTRAIN_FOR_EACH_OPTIMIZER)
//   DTRAIN_BUILTIN_FUNCTORS(EACH, SUM, T)             the functors whose host loops are compiled once
//
// X(declaration) is called once per template with the declaration an
// explicit instantiation names (DTRAIN_INSTANTIATE, DTRAIN_INSTANTIATE_CUDA:
// core/macros.hpp). DTRAIN_BUILTIN_TEMPLATES(X, Dev) applies the four
// template lists to a device, each over its built-in types, e.g.
//
//   DTRAIN_BUILTIN_TEMPLATES(DTRAIN_INSTANTIATE, Host)
//     -> DTRAIN_INSTANTIATE(class DdpStrategy<Host, float, float>) ...
//
// A new built-in template goes into its header's list only; a new header
// with a list, into the list here it belongs to.

#include "dtrain/checkpoint/state_io.hpp"
#include "dtrain/kernels/convolution.hpp"
#include "dtrain/kernels/matrix.hpp"
#include "dtrain/kernels/reduce.hpp"
#include "dtrain/kernels/sequence.hpp"
#include "dtrain/nn/activation.hpp"
#include "dtrain/nn/attention.hpp"
#include "dtrain/nn/cross_entropy.hpp"
#include "dtrain/nn/dropout.hpp"
#include "dtrain/nn/layer_norm.hpp"
#include "dtrain/nn/rms_norm.hpp"
#include "dtrain/nn/rotary_attention.hpp"
#include "dtrain/offload/arena.hpp"
#include "dtrain/optim/flat_optimizer.hpp"
#include "dtrain/strategy/ddp.hpp"
#include "dtrain/strategy/fsdp.hpp"
#include "dtrain/strategy/sharded.hpp"
#include "dtrain/strategy/zero1.hpp"
#include "dtrain/train/placement.hpp"
#include "dtrain/train/step_guard.hpp"
#include "dtrain/train/ties.hpp"

#define DTRAIN_BUILTIN_PRECISION_TEMPLATES(X, Dev, T, R) \
  DTRAIN_DDP_TEMPLATES(X, Dev, T, R) DTRAIN_FSDP_TEMPLATES(X, Dev, T, R) DTRAIN_ZERO1_TEMPLATES(X, Dev, T, R)

// clang-format off: one list entry per line
#define DTRAIN_BUILTIN_DTYPE_TEMPLATES(X, Dev, T) \
  DTRAIN_DDP_PART_TEMPLATES(X, Dev, T)            \
  DTRAIN_SHARDED_TEMPLATES(X, Dev, T)             \
  DTRAIN_TIES_TEMPLATES(X, Dev, T)                \
  DTRAIN_PLACEMENT_TEMPLATES(X, Dev, T)           \
  DTRAIN_STEP_GUARD_TEMPLATES(X, Dev, T)          \
  DTRAIN_CHECKPOINT_IO_TEMPLATES(X, Dev, T)
// clang-format on

#define DTRAIN_BUILTIN_DEVICE_TEMPLATES(X, Dev) DTRAIN_SHARD_GROUPS_TEMPLATES(X, Dev) DTRAIN_OFFLOAD_TEMPLATES(X, Dev)

#define DTRAIN_BUILTIN_OPTIMIZER_TEMPLATES(X, Dev, Opt) DTRAIN_FLAT_OPTIMIZER_TEMPLATES(X, Dev, Opt)

#define DTRAIN_BUILTIN_TEMPLATES(X, Dev)                                \
  DTRAIN_FOR_EACH_PRECISION(DTRAIN_BUILTIN_PRECISION_TEMPLATES, X, Dev) \
  DTRAIN_FOR_EACH_DTYPE(DTRAIN_BUILTIN_DTYPE_TEMPLATES, X, Dev)         \
  DTRAIN_BUILTIN_DEVICE_TEMPLATES(X, Dev)                               \
  DTRAIN_FOR_EACH_OPTIMIZER(DTRAIN_BUILTIN_OPTIMIZER_TEMPLATES, X, Dev)

// clang-format off: one list entry per line
#define DTRAIN_BUILTIN_FUNCTORS(EACH, SUM, T)    \
  DTRAIN_ACTIVATION_FUNCTORS(EACH, SUM, T)       \
  DTRAIN_ATTENTION_FUNCTORS(EACH, SUM, T)        \
  DTRAIN_CROSS_ENTROPY_FUNCTORS(EACH, SUM, T)    \
  DTRAIN_DROPOUT_FUNCTORS(EACH, SUM, T)          \
  DTRAIN_LAYER_NORM_FUNCTORS(EACH, SUM, T)       \
  DTRAIN_RMS_NORM_FUNCTORS(EACH, SUM, T)         \
  DTRAIN_ROTARY_ATTENTION_FUNCTORS(EACH, SUM, T) \
  DTRAIN_MATRIX_FUNCTORS(EACH, SUM, T)           \
  DTRAIN_REDUCE_FUNCTORS(EACH, SUM, T)           \
  DTRAIN_SEQUENCE_FUNCTORS(EACH, SUM, T)         \
  DTRAIN_CONVOLUTION_FUNCTORS(EACH, SUM, T)
// clang-format on
