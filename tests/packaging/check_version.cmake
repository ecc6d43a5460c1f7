# cmake -DSOURCE_DIR=<dtrain> -DCONFIG_DIR=<installed config dir> -P check_version.cmake
#
# include/dtrain/version.hpp is the one place the version is written: the vcpkg
# port and the changelog must name it, and the installed version file must
# accept exactly the requests SameMinorVersion promises.
cmake_minimum_required(VERSION 3.25)  # script mode sets no policies; the version file needs CMP0012
include(${SOURCE_DIR}/cmake/DtrainVersion.cmake)
dtrain_read_version(${SOURCE_DIR}/include/dtrain/version.hpp version)
string(REPLACE "." ";" parts ${version})
list(GET parts 0 major)
list(GET parts 1 minor)
message(STATUS "version.hpp says ${version}")

file(READ ${SOURCE_DIR}/ports/dtrain/vcpkg.json port)
string(JSON port_version GET "${port}" version)
if(NOT port_version STREQUAL version)
  message(FATAL_ERROR "ports/dtrain/vcpkg.json has version ${port_version}, version.hpp ${version}: "
                      "set \"version\" to ${version}")
endif()

file(READ ${SOURCE_DIR}/CHANGELOG.md changelog)
string(FIND "${changelog}" "\n## [${version}]" at)
if(at EQUAL -1)
  message(FATAL_ERROR "CHANGELOG.md has no '## [${version}]' section: add one for this version")
endif()

# Evaluates the installed dtrain-config-version.cmake as find_package(dtrain <request>) would.
function(expect_compatible request expected)
  string(REPLACE "." ";" req ${request})
  list(GET req 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET req 1 PACKAGE_FIND_VERSION_MINOR)
  set(PACKAGE_FIND_VERSION ${request})
  include(${CONFIG_DIR}/dtrain-config-version.cmake)
  if(NOT PACKAGE_VERSION STREQUAL version)
    message(FATAL_ERROR "the installed version file says ${PACKAGE_VERSION}, version.hpp ${version}")
  endif()
  if((PACKAGE_VERSION_COMPATIBLE AND NOT expected) OR (NOT PACKAGE_VERSION_COMPATIBLE AND expected))
    message(FATAL_ERROR "find_package(dtrain ${request}) on ${version}: compatible is "
                        "'${PACKAGE_VERSION_COMPATIBLE}', expected ${expected}")
  endif()
endfunction()

math(EXPR next_minor "${minor} + 1")
math(EXPR next_major "${major} + 1")
expect_compatible(${major}.${minor} TRUE)
expect_compatible(${version} TRUE)
expect_compatible(${major}.${next_minor} FALSE)
expect_compatible(${next_major}.0 FALSE)
if(minor GREATER 0)
  math(EXPR prev_minor "${minor} - 1")
  expect_compatible(${major}.${prev_minor} FALSE)
endif()
message(STATUS "vcpkg.json, CHANGELOG.md and the installed version file agree on ${version}")
