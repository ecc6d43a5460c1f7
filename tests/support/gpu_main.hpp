#pragma once
// main() for GPU test executables: exits 77 (CTest's SKIP_RETURN_CODE) when no
// CUDA device is present, so a GPU test never passes silently on a CPU machine.
// Include in exactly one .cpp/.cu of the executable, instead of BOOST_TEST_MODULE.

#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <cstdio>

#if DTRAIN_HAS_CUDA
#include <cuda_runtime.h>
#endif

inline bool init_unit_test() { return true; }

int main(int argc, char* argv[]) {
#if DTRAIN_HAS_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::puts("no CUDA device: GPU test skipped (exit 77)");
    return 77;
  }
#else
  std::puts("built without CUDA: GPU test skipped (exit 77)");
  return 77;
#endif
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
