# Every public header must compile on its own: .hpp as plain C++ with
# -Wall -Wextra -Werror, .cuh with nvcc. One generated translation unit each.

# _dtrain_header_units(OUT EXT HEADERS...): a generated source with extension
# EXT that includes each header twice.
function(_dtrain_header_units out ext)
  set(_srcs)
  foreach(h IN LISTS ARGN)
    string(REPLACE "/" "__" _n "${h}")
    set(_f ${CMAKE_CURRENT_BINARY_DIR}/header_check/${_n}.${ext})
    file(CONFIGURE OUTPUT ${_f} CONTENT "#include <${h}>\n#include <${h}>\n")
    list(APPEND _srcs ${_f})
  endforeach()
  set(${out} ${_srcs} PARENT_SCOPE)
endfunction()

function(dtrain_add_header_check)
  file(GLOB_RECURSE _hpp CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include
       ${PROJECT_SOURCE_DIR}/include/dtrain/*.hpp)
  # dtrain/torch/ needs LibTorch's headers: dtrain_torch_header_check below,
  # where LibTorch is found (dtrain::torch, cmake/DtrainTorch.cmake).
  list(FILTER _hpp EXCLUDE REGEX "^dtrain/torch/")
  file(GLOB_RECURSE _cuh CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include
       ${PROJECT_SOURCE_DIR}/include/dtrain/*.cuh)
  _dtrain_header_units(_srcs cpp ${_hpp})
  if(DTRAIN_WITH_CUDA)
    _dtrain_header_units(_cu cu ${_cuh})
    list(APPEND _srcs ${_cu})
  endif()
  add_library(dtrain_header_check OBJECT ${_srcs})
  target_link_libraries(dtrain_header_check PRIVATE dtrain::dtrain dtrain_warnings)
  if(DTRAIN_WITH_TORCH)
    file(GLOB _torch CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include
         ${PROJECT_SOURCE_DIR}/include/dtrain/torch/*.hpp)
    _dtrain_header_units(_tsrcs cpp ${_torch})
    add_library(dtrain_torch_header_check OBJECT ${_tsrcs})
    target_link_libraries(dtrain_torch_header_check PRIVATE dtrain::torch dtrain_warnings)
  endif()
endfunction()
