// dtrain::runtime's CUDA part (docs/building.md, separate compilation): the
// built-in templates on dtrain::Cuda (backend/cuda/train_instances.hpp), compiled
// once by nvcc, host code and kernels, for the programs whose translation
// units nvcc compiles against dtrain::runtime. Built when the project has
// enabled CUDA; the non-template code is dtrain_runtime.cpp's.
#define DTRAIN_RUNTIME_CUDA_SOURCE
#if !defined(DTRAIN_SEPARATE_COMPILATION)
#define DTRAIN_SEPARATE_COMPILATION 1
#endif
#if !DTRAIN_SEPARATE_COMPILATION
#error "dtrain_runtime_cuda.cu is compiled only with DTRAIN_SEPARATE_COMPILATION=1 (link dtrain::runtime)"
#endif
#if !defined(__CUDACC__)
#error "dtrain_runtime_cuda.cu is compiled by nvcc"
#endif
#include <dtrain/trainer.hpp>
