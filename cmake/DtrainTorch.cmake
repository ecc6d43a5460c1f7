# dtrain::torch: dtrain's LibTorch layer (include/dtrain/torch/), defined where
# LibTorch's CMake package (Torch) is found. DTRAIN_TORCH = ON | OFF | AUTO
# (default AUTO: when found). Which LibTorch: Debian's libtorch-dev, or the one
# inside PyPI's torch wheel, found through its package folder
#   -DCMAKE_PREFIX_PATH=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
# (torch.utils.cmake_prefix_path alone finds its config but lets CMake take a
# system libtorch.so before the wheel's). The wheel's CUDA builds link NCCL,
# cuDNN and the CUDA libraries of the nvidia-* wheels beside it: their folders
# go on the run path. Link dtrain::torch ahead of dtrain's other targets: the
# wheel's libtorch_cpu carries its own BLAS (MKL) under the standard names
# (sgemm_), and a library loaded before it (dtrain's OpenBLAS) would take
# LibTorch's GEMMs (dtrain_link_torch_first does it for a target).
# Sets DTRAIN_WITH_TORCH and, with it, DTRAIN_TORCH_VERSION.
function(dtrain_define_torch_target dtrain_target)
  if(NOT DEFINED DTRAIN_TORCH)
    set(DTRAIN_TORCH AUTO)
  endif()
  set(DTRAIN_WITH_TORCH OFF PARENT_SCOPE)
  if(DTRAIN_TORCH STREQUAL "OFF")
    return()
  endif()
  if(DTRAIN_TORCH STREQUAL "ON")
    find_package(Torch REQUIRED)
  else()
    find_package(Torch QUIET)
  endif()
  if(NOT Torch_FOUND)
    return()
  endif()
  set(_version "${Torch_VERSION}")
  if(_version AND _version VERSION_LESS 1.13)
    message(FATAL_ERROR "dtrain::torch needs LibTorch 1.13 or newer; found ${_version} at ${Torch_DIR}. Install "
                        "Debian's libtorch-dev (1.13) or PyPI's torch and point CMAKE_PREFIX_PATH at "
                        "torch.utils.cmake_prefix_path, or set DTRAIN_TORCH=OFF")
  endif()
  if(NOT TARGET dtrain_torch_)
    add_library(dtrain_torch_ INTERFACE IMPORTED GLOBAL)
    # TORCH_CXX_FLAGS carries the C++ ABI LibTorch was built with.
    separate_arguments(_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
    set_target_properties(dtrain_torch_ PROPERTIES
      INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES};${dtrain_target}"
      INTERFACE_COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CXX>:${_flags}>"
      INTERFACE_COMPILE_DEFINITIONS DTRAIN_HAS_TORCH=1)
    set(_links "")
    get_filename_component(_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
    if(TORCH_INSTALL_PREFIX AND IS_DIRECTORY "${_site}/nvidia")
      file(GLOB _nvidia LIST_DIRECTORIES true "${_site}/nvidia/*/lib")
      foreach(_dir IN LISTS _nvidia)
        list(APPEND _links "LINKER:-rpath-link,${_dir}" "LINKER:-rpath,${_dir}")
      endforeach()
    endif()
    set_property(TARGET dtrain_torch_ PROPERTY INTERFACE_LINK_OPTIONS "${_links}")
    add_library(dtrain::torch ALIAS dtrain_torch_)
  endif()
  set(DTRAIN_WITH_TORCH ON PARENT_SCOPE)
  set(DTRAIN_TORCH_VERSION "${_version}" PARENT_SCOPE)
endfunction()

# dtrain_link_torch_first(TARGET): dtrain::torch first among TARGET's
# libraries, so that LibTorch's own BLAS serves LibTorch's GEMMs.
function(dtrain_link_torch_first target)
  get_target_property(_libs ${target} LINK_LIBRARIES)
  if(NOT _libs)
    set(_libs "")
  endif()
  list(REMOVE_ITEM _libs dtrain::torch)
  set_property(TARGET ${target} PROPERTY LINK_LIBRARIES dtrain::torch ${_libs})
endfunction()
