# Which GPUs dtrain's own build (examples, tools, tests, benchmarks and
# dtrain::runtime's CUDA part) compiles CUDA code for.
#
#   DTRAIN_CUDA_ARCHITECTURES  a list of compute capabilities without the dot
#                              (80;86;89;90), or `native`; default: the GPUs
#                              this machine has (nvidia-smi), else 80;86;89;90.
#
# 80;86;89;90 is machine code for Ampere (A100 and A30: 8.0; A10, A40 and RTX
# 30xx: 8.6), Ada (L4, L40, RTX 40xx: 8.9) and Hopper (H100, H200: 9.0), so a
# build made on a machine without a GPU (a login node, CI) runs on all of them.
#
# The device code is compiled once, for the lowest architecture of the list
# (one cicc pass per translation unit, the expensive part), and ptxas turns
# that PTX into machine code for every architecture of the list (under a second
# each); the PTX is embedded too, so a newer GPU (Blackwell) compiles it at
# its first launch. dtrain's kernels use nothing newer than compute
# capability 8.0, so nothing is lost by compiling them for the lowest.
#
# Setting CMAKE_CUDA_ARCHITECTURES (or the CUDAARCHS environment variable)
# instead gives CMake's own behaviour: one compile per listed architecture.
#
# DTRAIN_CUDA_CHECK_ONLY=ON (off unless asked: CI asks for it, through
# scripts/setup.sh's environment variable of the same name) compiles the CUDA
# code only to check it:
# machine code for the lowest architecture of the list and no PTX, the host
# code at -O0 and the kernels unoptimised (cicc and ptxas at -O0), since
# nothing runs it on that machine. Every CUDA source still goes through
# nvcc, cicc and ptxas; it takes about 40% less time (train_mlp's CUDA
# translation unit 36 -> 22 s). Its binaries are not for GPUs: configure
# with OFF on the machine that runs them, or for binaries to copy there.
#
# dtrain_cuda_architectures() runs before enable_language(CUDA) and sets
# CMAKE_CUDA_ARCHITECTURES (OFF when dtrain passes the flags itself) and
# DTRAIN_CUDA_ARCH_FLAGS (the --generate-code options, empty otherwise);
# dtrain_cuda_check_only() then applies DTRAIN_CUDA_CHECK_ONLY's levels.

function(dtrain_gpus_of_this_machine out)
  set(archs "")
  find_program(DTRAIN_NVIDIA_SMI nvidia-smi)
  mark_as_advanced(DTRAIN_NVIDIA_SMI)
  if(DTRAIN_NVIDIA_SMI)
    execute_process(COMMAND "${DTRAIN_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 30)
    if(rc EQUAL 0)
      string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${caps}")
      foreach(cap IN LISTS caps)
        string(REPLACE "." "" arch "${cap}")
        list(APPEND archs ${arch})
      endforeach()
      list(REMOVE_DUPLICATES archs)
      list(SORT archs COMPARE NATURAL)
    endif()
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# --generate-code for `archs` (sorted, numbers): PTX for the lowest, machine
# code for each.
function(dtrain_cuda_arch_flags archs out)
  list(GET archs 0 lowest)
  set(codes "")
  foreach(arch IN LISTS archs)
    list(APPEND codes "sm_${arch}")
  endforeach()
  list(APPEND codes "compute_${lowest}")
  list(JOIN codes "," codes)
  set(${out} "--generate-code=arch=compute_${lowest},code=[${codes}]" PARENT_SCOPE)
endfunction()

macro(dtrain_cuda_architectures)
  option(DTRAIN_CUDA_CHECK_ONLY
         "Compile CUDA code only to check it (lowest architecture, unoptimised): for machines without a GPU" OFF)
  set(DTRAIN_CUDA_ARCH_FLAGS "")
  if(DEFINED CMAKE_CUDA_ARCHITECTURES OR DEFINED ENV{CUDAARCHS})
    message(STATUS "dtrain: CUDA architectures from CMAKE_CUDA_ARCHITECTURES/CUDAARCHS (CMake's own flags)")
  else()
    set(DTRAIN_CUDA_ARCHITECTURES "" CACHE STRING
        "GPUs to compile for: compute capabilities (80;86;89;90) or native; empty: this machine's GPUs, else 80;86;89;90")
    set(_dtrain_archs "${DTRAIN_CUDA_ARCHITECTURES}")
    set(_dtrain_why "DTRAIN_CUDA_ARCHITECTURES")
    if(_dtrain_archs STREQUAL "" OR _dtrain_archs STREQUAL "native")
      dtrain_gpus_of_this_machine(_dtrain_archs)
      set(_dtrain_why "this machine's GPUs")
      if(_dtrain_archs STREQUAL "")
        if(DTRAIN_CUDA_ARCHITECTURES STREQUAL "native")
          message(FATAL_ERROR "DTRAIN_CUDA_ARCHITECTURES=native but nvidia-smi shows no GPU here: "
                              "name the GPUs' compute capabilities instead (e.g. -DDTRAIN_CUDA_ARCHITECTURES=80;90)")
        endif()
        set(_dtrain_archs 80 86 89 90)
        set(_dtrain_why "no GPU visible here: Ampere, Ada and Hopper, with PTX for newer GPUs")
      endif()
    endif()
    foreach(_dtrain_arch IN LISTS _dtrain_archs)
      if(NOT _dtrain_arch MATCHES "^[0-9]+$")
        message(FATAL_ERROR "DTRAIN_CUDA_ARCHITECTURES: '${_dtrain_arch}' is not a compute capability: "
                            "give numbers without the dot (e.g. 80;90), or native")
      endif()
    endforeach()
    list(SORT _dtrain_archs COMPARE NATURAL)
    if(DTRAIN_CUDA_CHECK_ONLY)
      list(GET _dtrain_archs 0 _dtrain_archs)
      set(_dtrain_why "DTRAIN_CUDA_CHECK_ONLY: compiled unoptimised to be checked, not run; OFF for GPU binaries")
    endif()
    dtrain_cuda_arch_flags("${_dtrain_archs}" DTRAIN_CUDA_ARCH_FLAGS)
    if(DTRAIN_CUDA_CHECK_ONLY)
      set(DTRAIN_CUDA_ARCH_FLAGS "--generate-code=arch=compute_${_dtrain_archs},code=[sm_${_dtrain_archs}]")
    endif()
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    set(DTRAIN_CUDA_ARCH_LIST "${_dtrain_archs}")
    message(STATUS "dtrain: CUDA code for compute capability ${_dtrain_archs} (${_dtrain_why}); "
                   "-DDTRAIN_CUDA_ARCHITECTURES=... chooses")
  endif()
endmacro()

# dtrain_cuda_host_level(LEVEL): nvcc's host optimisation level (-O0, -O1)
# for the CUDA targets of this directory and below. nvcc puts the
# configuration's -O after any -Xcompiler flag, so the level in
# CMAKE_CUDA_FLAGS_<CONFIG> is replaced. DTRAIN_CUDA_UNOPTIMISED_DEVICE: the
# compile options that run cicc and ptxas at -O0.
set(DTRAIN_CUDA_UNOPTIMISED_DEVICE "$<$<COMPILE_LANGUAGE:CUDA>:SHELL:-Xcicc -O0>"
    "$<$<COMPILE_LANGUAGE:CUDA>:SHELL:-Xptxas -O0>")
macro(dtrain_cuda_host_level level)
  foreach(_dtrain_config IN ITEMS RELEASE RELWITHDEBINFO MINSIZEREL)
    string(REGEX REPLACE "(^| )-O[0-9s]( |$)" "\\1${level}\\2" CMAKE_CUDA_FLAGS_${_dtrain_config}
                         "${CMAKE_CUDA_FLAGS_${_dtrain_config}}")
  endforeach()
endmacro()

# DTRAIN_CUDA_CHECK_ONLY's levels for the CUDA targets defined from here on
# (and `target`, defined before): host code, cicc and ptxas at -O0.
macro(dtrain_cuda_check_only target)
  if(DTRAIN_CUDA_CHECK_ONLY)
    dtrain_cuda_host_level(-O0)
    add_compile_options(${DTRAIN_CUDA_UNOPTIMISED_DEVICE})
    target_compile_options(${target} PRIVATE ${DTRAIN_CUDA_UNOPTIMISED_DEVICE})
  endif()
endmacro()
