# dtrain_read_version(<header> <out_var>): sets <out_var> to "MAJOR.MINOR.PATCH"
# read from include/dtrain/version.hpp, the one place the version is written.
# Included before project(), so it uses nothing project() would define.
function(dtrain_read_version header out_var)
  file(STRINGS "${header}" _lines REGEX "^#define DTRAIN_VERSION_(MAJOR|MINOR|PATCH) [0-9]+$")
  set(_parts)
  foreach(_part MAJOR MINOR PATCH)
    set(_value)
    foreach(_line IN LISTS _lines)
      if(_line MATCHES "^#define DTRAIN_VERSION_${_part} ([0-9]+)$")
        set(_value ${CMAKE_MATCH_1})
      endif()
    endforeach()
    if(_value STREQUAL "")
      message(FATAL_ERROR "dtrain: ${header} has no line '#define DTRAIN_VERSION_${_part} <number>'; "
                          "restore it (the build reads the version from there)")
    endif()
    list(APPEND _parts ${_value})
  endforeach()
  list(JOIN _parts "." _version)
  set(${out_var} ${_version} PARENT_SCOPE)
  # Editing the header re-runs the configure step, so the version never goes stale.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${header}")
endfunction()
