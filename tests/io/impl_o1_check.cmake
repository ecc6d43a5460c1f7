# Header-only builds compile dtrain's .ipp code and nlohmann/json at -O1
# (DTRAIN_IMPL_O1, core/macros.hpp; io/json.hpp). Checks, with the project's
# compiler:
#  1. when the macro is on: optimised header-only GCC builds only, never at
#     -O0, under separate compilation or when the user sets it to 0;
#  2. io/json.hpp opens every standard header nlohmann/json uses before its
#     -O1 region, so the region never gives a user's standard code -O1.
#   cmake -DCOMPILER=... -DSTD_FLAG=... -DINCLUDE_DIR=... -DWORK=... -P impl_o1_check.cmake
file(MAKE_DIRECTORY "${WORK}")
set(_src "${WORK}/impl_o1_check.cpp")

# 1. The macro's value for each kind of build.
foreach(_case "1|-O2" "1|-O3" "0|-O0" "0|-O2 -DDTRAIN_SEPARATE_COMPILATION=1" "0|-O2 -DDTRAIN_IMPL_O1=0")
  string(REPLACE "|" ";" _parts "${_case}")
  list(GET _parts 0 _expect)
  list(GET _parts 1 _flags)
  separate_arguments(_flags)
  file(WRITE "${_src}" "#include <dtrain/core/macros.hpp>\nstatic_assert(DTRAIN_IMPL_O1 == ${_expect});\n")
  execute_process(COMMAND "${COMPILER}" "${STD_FLAG}" ${_flags} -fsyntax-only "-I${INCLUDE_DIR}" "${_src}"
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "DTRAIN_IMPL_O1 is not ${_expect} with ${_flags}:\n${_out}")
  endif()
endforeach()

# 2. No standard header opened for the first time after nlohmann/json.hpp.
file(WRITE "${_src}" "#include <dtrain/io/json.hpp>\n")
execute_process(COMMAND "${COMPILER}" "${STD_FLAG}" -H -fsyntax-only "-I${INCLUDE_DIR}" "${_src}"
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "dtrain/io/json.hpp does not compile:\n${_out}")
endif()
string(REPLACE "\n" ";" _lines "${_out}")
set(_before)
set(_inside OFF)
set(_late)
set(_seen_json OFF)
foreach(_l IN LISTS _lines)
  if(NOT _l MATCHES "^\\.+ (.+)$")
    continue()
  endif()
  set(_path "${CMAKE_MATCH_1}")
  if(_path MATCHES "nlohmann/json\\.hpp$")
    set(_inside ON)
    set(_seen_json ON)
  endif()
  if(NOT _path MATCHES "/c\\+\\+/[0-9]+/")
    continue()
  endif()
  if(_inside)
    list(FIND _before "${_path}" _at)
    if(_at EQUAL -1)
      list(APPEND _late "${_path}")
    endif()
  else()
    list(APPEND _before "${_path}")
  endif()
endforeach()
if(NOT _seen_json)
  message(FATAL_ERROR "the compiler's -H output names no nlohmann/json.hpp:\n${_out}")
endif()
if(_late)
  list(REMOVE_DUPLICATES _late)
  message(FATAL_ERROR "nlohmann/json opens these standard headers first, inside dtrain's -O1 region: "
                      "${_late}; include them above it in include/dtrain/io/json.hpp")
endif()
message(STATUS "DTRAIN_IMPL_O1 as documented; io/json.hpp opens every standard header before its region")
