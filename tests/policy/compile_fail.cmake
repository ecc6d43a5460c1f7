# A compile-fail test: SOURCE must compile with -DDTRAIN_CONTROL (proving the
# snippet is otherwise sound) and fail without it, with exactly one error whose
# text contains the snippet's "// expect: <message>" comment (continued on the
# "// " lines right below it, joined by one space, as clang-format wraps it).
#   cmake -DCOMPILER=... -DSTD_FLAG=... -DINCLUDE_DIR=... -DSOURCE=... -P compile_fail.cmake
# file(READ), not file(STRINGS): a message may contain ';', which a list would split.
file(READ "${SOURCE}" _text)
string(REGEX MATCH "// expect: [^\n]*(\n// [^\n]*)*" _line "${_text}")
string(REPLACE "\n// " " " _line "${_line}")
string(REGEX REPLACE "^// expect: " "" _expect "${_line}")
if(_expect STREQUAL "")
  message(FATAL_ERROR "${SOURCE} has no '// expect: <message>' line")
endif()
# Declarations only (DTRAIN_SEPARATE_COMPILATION): the checks are in templates,
# the same in both modes, and the front end then skips dtrain's .ipp code.
set(_cmd "${COMPILER}" "${STD_FLAG}" -fsyntax-only -fdiagnostics-color=never -DDTRAIN_SEPARATE_COMPILATION=1
         "-I${INCLUDE_DIR}" "${SOURCE}")

execute_process(COMMAND ${_cmd} -DDTRAIN_CONTROL RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "the control variant (-DDTRAIN_CONTROL) must compile but did not:\n${_out}")
endif()

execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(_rc EQUAL 0)
  message(FATAL_ERROR "compiled, but must fail with: ${_expect}")
endif()
string(FIND "${_out}" "${_expect}" _at)
if(_at EQUAL -1)
  message(FATAL_ERROR "failed, but without the expected message: ${_expect}\n${_out}")
endif()
string(REGEX MATCHALL "error:" _errors "${_out}")
list(LENGTH _errors _n)
if(NOT _n EQUAL 1)
  message(FATAL_ERROR "expected exactly one error, got ${_n}:\n${_out}")
endif()
message(STATUS "failed as expected with: ${_expect}")
