#pragma once
// main() for GPU test executables: exits 77 (CTest's SKIP_RETURN_CODE) when no
// CUDA device is present, so a GPU test never passes silently on a CPU machine.
// Include in exactly one .cpp/.cu of the executable, instead of BOOST_TEST_MODULE.
// A test that needs more than a GPU (a Python with CUDA PyTorch) declares
//   #define DTRAIN_GPU_TEST_NEEDS what_is_missing
// before including this header, with std::string what_is_missing() returning
// "" or why the test cannot run here; it then exits 77 with that reason.

#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <cstdio>
#include <string>

#include <boost/test/unit_test.hpp>

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
#ifdef DTRAIN_GPU_TEST_NEEDS
  if (const std::string why = DTRAIN_GPU_TEST_NEEDS(); !why.empty()) {
    std::printf("%s: GPU test skipped (exit 77)\n", why.c_str());
    return 77;
  }
#endif
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
