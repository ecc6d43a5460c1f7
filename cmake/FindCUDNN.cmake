# FindCUDNN: the headers of cuDNN 9 (cudnn.h, beside the CUDA toolkit or in
# PyTorch's nvidia-cudnn wheel) and of cudnn-frontend (cudnn_frontend.h, from
# the nvidia-cudnn-frontend wheel that scripts/setup.sh unpacks into the
# build folder). Nothing is linked: the frontend loads libcudnn.so.9 when a
# program first uses fused attention (dynamic loading), so programs start on
# machines without cuDNN or a GPU driver, and only the attention needs them.
# Hints: CUDNN_ROOT, CUDNN_FRONTEND_ROOT (variables or environment). Defines
# CUDNN::CUDNN (headers and libdl), CUDNN_FOUND and CUDNN_VERSION.
find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
  PATH_SUFFIXES include)
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
  HINTS ${CUDNN_FRONTEND_ROOT} $ENV{CUDNN_FRONTEND_ROOT} ${CMAKE_BINARY_DIR}/deps/cudnn-frontend
  PATH_SUFFIXES include)
set(CUDNN_VERSION "")
foreach(_h cudnn_version.h cudnn.h)
  if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/${_h}" AND NOT CUDNN_VERSION)
    file(STRINGS "${CUDNN_INCLUDE_DIR}/${_h}" _v REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
    if(_v)
      string(REGEX REPLACE ".*CUDNN_MAJOR +([0-9]+).*" "\\1" _maj "${_v}")
      string(REGEX REPLACE ".*CUDNN_MINOR +([0-9]+).*" "\\1" _min "${_v}")
      string(REGEX REPLACE ".*CUDNN_PATCHLEVEL +([0-9]+).*" "\\1" _pat "${_v}")
      set(CUDNN_VERSION "${_maj}.${_min}.${_pat}")
    endif()
  endif()
endforeach()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_INCLUDE_DIR CUDNN_FRONTEND_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)
if(CUDNN_FOUND AND CUDNN_VERSION VERSION_LESS 9)
  message(STATUS "cuDNN ${CUDNN_VERSION} found, but fused attention needs cuDNN 9: not using it")
  set(CUDNN_FOUND FALSE)
endif()
if(CUDNN_FOUND AND NOT TARGET CUDNN::CUDNN)
  add_library(CUDNN::CUDNN INTERFACE IMPORTED)
  set_target_properties(CUDNN::CUDNN PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR};${CUDNN_FRONTEND_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
    INTERFACE_LINK_LIBRARIES "${CMAKE_DL_LIBS}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_FRONTEND_INCLUDE_DIR)
