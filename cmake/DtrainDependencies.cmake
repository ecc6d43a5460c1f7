# Dependency discovery shared by dtrain's own build and its installed package
# config, so a consumer finds exactly what dtrain was built against.
include(CMakeFindDependencyMacro)
find_package(Threads REQUIRED)
find_package(range-v3 REQUIRED)
find_package(Gloo REQUIRED)
# Gloo's own config (Debian) exports a bare `gloo` target; vcpkg's FindGloo.cmake
# sets only Gloo_INCLUDE_DIRS and Gloo_LIBRARIES, so give that form the same name.
if(NOT TARGET gloo)
  add_library(gloo INTERFACE IMPORTED)
  set_target_properties(gloo PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${Gloo_INCLUDE_DIRS}"
                                        INTERFACE_LINK_LIBRARIES "${Gloo_LIBRARIES}")
endif()
# dtrain::Host sizes BLAS threads with openblas_set_num_threads: an OpenBLAS
# pool per rank, each with a thread per core, would oversubscribe the cores.
if(NOT DEFINED BLA_VENDOR)
  set(BLA_VENDOR OpenBLAS)
endif()
find_package(BLAS REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
# HMAC-SHA256 for the job token's challenge-response (comm/auth.hpp).
find_package(OpenSSL 1.1.1 REQUIRED COMPONENTS Crypto)

if(NOT DEFINED DTRAIN_CUDA)
  set(DTRAIN_CUDA AUTO)
endif()
# The oldest CUDA toolkit and NCCL dtrain's CUDA code compiles with
# (docs/building.md#cuda-toolkit-versions says how that was checked).
set(DTRAIN_MIN_CUDA_VERSION 12.4)
set(DTRAIN_MIN_NCCL_VERSION 2.14)
set(DTRAIN_WITH_CUDA OFF)
set(DTRAIN_NO_CUDA_WHY "")
if(DTRAIN_CUDA STREQUAL "OFF")
  set(DTRAIN_NO_CUDA_WHY "DTRAIN_CUDA=OFF")
else()
  if(DTRAIN_CUDA STREQUAL "ON")
    find_package(CUDAToolkit REQUIRED)
  else()
    find_package(CUDAToolkit QUIET)
  endif()
  if(CUDAToolkit_FOUND AND CUDAToolkit_VERSION VERSION_LESS DTRAIN_MIN_CUDA_VERSION)
    set(_dtrain_old_cuda "the CUDA toolkit at ${CUDAToolkit_BIN_DIR} is ${CUDAToolkit_VERSION}, older than the "
                         "${DTRAIN_MIN_CUDA_VERSION} dtrain needs: install CUDA ${DTRAIN_MIN_CUDA_VERSION} or newer")
    if(DTRAIN_CUDA STREQUAL "ON")
      message(FATAL_ERROR "dtrain: ${_dtrain_old_cuda}")
    endif()
    set(DTRAIN_NO_CUDA_WHY "${_dtrain_old_cuda}")
    set(CUDAToolkit_FOUND OFF)
  elseif(NOT CUDAToolkit_FOUND)
    set(DTRAIN_NO_CUDA_WHY "no CUDA toolkit found (nvcc on PATH or in /usr/local/cuda, or CUDAToolkit_ROOT)")
  endif()
  if(CUDAToolkit_FOUND)
    if(DTRAIN_CUDA STREQUAL "ON")
      find_package(NCCL REQUIRED)
    else()
      find_package(NCCL QUIET)
    endif()
  endif()
  if(NCCL_FOUND AND NCCL_VERSION VERSION_LESS DTRAIN_MIN_NCCL_VERSION)
    set(_dtrain_old_nccl "the NCCL at ${NCCL_INCLUDE_DIR} is ${NCCL_VERSION}, older than the ${DTRAIN_MIN_NCCL_VERSION} "
                         "dtrain needs (ncclCommInitRankConfig, ncclCommFinalize): install a newer NCCL or set "
                         "NCCL_ROOT to one")
    if(DTRAIN_CUDA STREQUAL "ON")
      message(FATAL_ERROR "dtrain: ${_dtrain_old_nccl}")
    endif()
    message(WARNING "dtrain: ${_dtrain_old_nccl}; building for CPU ranks only")
    set(DTRAIN_NO_CUDA_WHY "${_dtrain_old_nccl}")
    set(NCCL_FOUND OFF)
  endif()
  if(CUDAToolkit_FOUND AND NCCL_FOUND)
    set(DTRAIN_WITH_CUDA ON)
  elseif(CUDAToolkit_FOUND AND NOT DTRAIN_NO_CUDA_WHY)
    set(DTRAIN_NO_CUDA_WHY "the CUDA toolkit (${CUDAToolkit_BIN_DIR}) is here but NCCL is not")
    message(WARNING "dtrain: the CUDA toolkit (${CUDAToolkit_BIN_DIR}) is here but NCCL is not: building for CPU "
                    "ranks only. For GPU training install NCCL (apt-get install libnccl2 libnccl-dev from NVIDIA's "
                    "CUDA repository, or PyPI's nvidia-nccl-cu${CUDAToolkit_VERSION_MAJOR} wheel's nvidia/nccl folder) "
                    "and set NCCL_ROOT to it; -DDTRAIN_CUDA=OFF silences this.")
  endif()
endif()

# cuDNN 9 and the cudnn-frontend headers, for fused attention on GPUs
# (DTRAIN_ATTENTION=cudnn): ON, OFF or AUTO (when found, with CUDA).
if(NOT DEFINED DTRAIN_CUDNN)
  set(DTRAIN_CUDNN AUTO)
endif()
set(DTRAIN_WITH_CUDNN OFF)
if(DTRAIN_WITH_CUDA AND NOT DTRAIN_CUDNN STREQUAL "OFF")
  if(DTRAIN_CUDNN STREQUAL "ON")
    find_package(CUDNN REQUIRED)
  else()
    find_package(CUDNN QUIET)
  endif()
  if(CUDNN_FOUND)
    set(DTRAIN_WITH_CUDNN ON)
  endif()
endif()

function(dtrain_link_dependencies target)
  # Gloo's Debian package exports a bare `gloo` target.
  # dlopen (oneDNN's GEMM, cuDNN) lives in libdl before glibc 2.34.
  target_link_libraries(${target} INTERFACE Threads::Threads range-v3::range-v3 gloo BLAS::BLAS
                        nlohmann_json::nlohmann_json OpenSSL::Crypto ${CMAKE_DL_LIBS})
  if(DTRAIN_WITH_CUDA)
    target_link_libraries(${target} INTERFACE CUDA::cudart CUDA::cublas NCCL::NCCL)
    target_compile_definitions(${target} INTERFACE DTRAIN_HAS_CUDA=1)
  endif()
endfunction()
