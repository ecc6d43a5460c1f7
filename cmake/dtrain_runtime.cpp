// The one translation unit of dtrain::runtime, the separate-compilation mode
// (docs/building.md): it compiles every definition the headers leave to
// their .ipp files, once, for programs built with
// DTRAIN_SEPARATE_COMPILATION=1. dtrain's build compiles it into the
// dtrain_runtime library; an installed package compiles it in the project
// that links dtrain::runtime. CMake checks that it includes every header
// that has an .ipp.
#define DTRAIN_RUNTIME_SOURCE
#if !defined(DTRAIN_SEPARATE_COMPILATION)
#define DTRAIN_SEPARATE_COMPILATION 1
#endif
#if !DTRAIN_SEPARATE_COMPILATION
#error "dtrain_runtime.cpp is compiled only with DTRAIN_SEPARATE_COMPILATION=1 (link dtrain::runtime)"
#endif
#include <dtrain/backend/host/comm.hpp>
#include <dtrain/backend/host/comm_gloo.hpp>
#include <dtrain/backend/host/comm_shm.hpp>
#include <dtrain/backend/host/device.hpp>
#include <dtrain/backend/host/device_isa.hpp>
#include <dtrain/checkpoint/checkpoint.hpp>
#include <dtrain/comm/auth.hpp>
#include <dtrain/comm/store.hpp>
#include <dtrain/comm/tracker.hpp>
#include <dtrain/comm/world.hpp>
#include <dtrain/core/element.hpp>
#include <dtrain/core/error.hpp>
#include <dtrain/core/fault.hpp>
#include <dtrain/core/host_env.hpp>
#include <dtrain/core/tensor.hpp>
#include <dtrain/data/dataset.hpp>
#include <dtrain/data/loader.hpp>
#include <dtrain/data/preference.hpp>
#include <dtrain/data/sampler.hpp>
#include <dtrain/diffusion/data.hpp>
#include <dtrain/diffusion/lora.hpp>
#include <dtrain/diffusion/pixart.hpp>
#include <dtrain/diffusion/schedule.hpp>
#include <dtrain/diffusion/unet.hpp>
#include <dtrain/hf/checkpoint.hpp>
#include <dtrain/hf/config.hpp>
#include <dtrain/hf/llava.hpp>
#include <dtrain/hf/lora.hpp>
#include <dtrain/hf/model.hpp>
#include <dtrain/hf/vision.hpp>
#include <dtrain/io/crc32c.hpp>
#include <dtrain/io/files.hpp>
#include <dtrain/io/npy.hpp>
#include <dtrain/io/pattern.hpp>
#include <dtrain/io/safetensors.hpp>
#include <dtrain/launch/env.hpp>
#include <dtrain/launch/init.hpp>
#include <dtrain/lerobot/act.hpp>
#include <dtrain/metrics/metric.hpp>
#include <dtrain/metrics/tensorboard.hpp>
#include <dtrain/model/layout.hpp>
#include <dtrain/models/causal_lm.hpp>
#include <dtrain/models/gpt.hpp>
#include <dtrain/models/run_config.hpp>
#include <dtrain/nn/attention.hpp>
#include <dtrain/nn/checks.hpp>
#include <dtrain/nn/convolution.hpp>
#include <dtrain/nn/drop_tokens.hpp>
#include <dtrain/nn/dropout.hpp>
#include <dtrain/nn/embedding.hpp>
#include <dtrain/nn/image_merge.hpp>
#include <dtrain/nn/layer_norm.hpp>
#include <dtrain/nn/linear.hpp>
#include <dtrain/nn/lora.hpp>
#include <dtrain/nn/patch_embedding.hpp>
#include <dtrain/nn/rms_norm.hpp>
#include <dtrain/nn/rotary_attention.hpp>
#include <dtrain/optim/param_groups.hpp>
#include <dtrain/run/fit.hpp>
#include <dtrain/run/fit_checkpointer.hpp>
#include <dtrain/run/fit_evaluation.hpp>
#include <dtrain/run/fit_finish.hpp>
#include <dtrain/run/fit_options.hpp>
#include <dtrain/run/fit_progress.hpp>
#include <dtrain/run/fit_reporter.hpp>
#include <dtrain/run/fit_resume.hpp>
#include <dtrain/run/fit_rollback.hpp>
#include <dtrain/run/preemption.hpp>
#include <dtrain/train/evaluator.hpp>
#include <dtrain/train/model_check.hpp>
#include <dtrain/train/recompute.hpp>
#include <dtrain/train/step_guard.hpp>
#include <dtrain/trainer.hpp>
// The CUDA backend's non-template code: host code, which g++ compiles
// against the CUDA runtime and NCCL.
#if DTRAIN_HAS_CUDA
#include <dtrain/backend/cuda/comm_binding.hpp>
#include <dtrain/backend/cuda/comm_host_transport.hpp>
#include <dtrain/backend/cuda/comm_nccl.hpp>
#include <dtrain/backend/cuda/comm_nccl_transport.hpp>
#include <dtrain/backend/cuda/device.hpp>
#include <dtrain/backend/cuda/offload.hpp>
#endif
