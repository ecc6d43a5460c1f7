// The CUDA half of the consumer, compiled by nvcc: the same Model, with the
// consumer's own Affine unit, instantiated on dtrain::Cuda (its functors
// become CUDA kernels here). Only <dtrain/...> headers that nvcc digests are
// reached from consumer.hpp.

#include <cuda_runtime.h>

#include "consumer.hpp"

consumer::Losses consumer::train_cuda(dtrain::World& world, const dtrain::Dataset& data, std::int64_t steps) {
  return train<dtrain::Cuda>(world, data, steps);
}

// No driver or no GPU is an error status here, not an exception: it means
// "train on the host".
int consumer::cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
