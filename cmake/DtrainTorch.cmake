# dtrain::torch: dtrain's LibTorch layer (include/dtrain/torch/), defined where
# LibTorch's CMake package (Torch) is found. DTRAIN_TORCH = ON | OFF | AUTO
# (default AUTO: when found). Which LibTorch: Debian's libtorch-dev, or the one
# inside PyPI's torch wheel, found through
#   -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
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
      INTERFACE_LINK_LIBRARIES "${dtrain_target};${TORCH_LIBRARIES}"
      INTERFACE_COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CXX>:${_flags}>"
      INTERFACE_COMPILE_DEFINITIONS DTRAIN_HAS_TORCH=1)
    add_library(dtrain::torch ALIAS dtrain_torch_)
  endif()
  set(DTRAIN_WITH_TORCH ON PARENT_SCOPE)
  set(DTRAIN_TORCH_VERSION "${_version}" PARENT_SCOPE)
endfunction()
