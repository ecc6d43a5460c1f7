# dtrain as a vcpkg overlay port, built from the checkout this folder lives in
# (ports/dtrain/ of the dtrain repository):
#
#   vcpkg install dtrain --overlay-ports=<dtrain>/ports
#
# vcpkg hashes only the files of this folder, not the sources it points at:
# after changing dtrain, `vcpkg remove dtrain` (and bypass a binary cache that
# may hold the old build) before installing again. docs/packaging.md.
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)

# The library is header-only; only the optional tools are compiled, and one
# release build of them is all a consumer needs.
set(VCPKG_BUILD_TYPE release)

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
  FEATURES
    tools DTRAIN_BUILD_TOOLS
    cuda  DTRAIN_CUDA
)

# The install CI checks (tests/packaging/run_vcpkg_layout.sh uses these same
# options): headers, and the package config written straight to share/dtrain.
vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    ${FEATURE_OPTIONS}
    -DDTRAIN_BUILD_TESTS=OFF
    -DDTRAIN_BUILD_EXAMPLES=OFF
    -DDTRAIN_BUILD_BENCH=OFF
    -DDTRAIN_TORCH=OFF
    -DDTRAIN_INSTALL_CMAKEDIR=share/dtrain
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME dtrain CONFIG_PATH share/dtrain)

if("tools" IN_LIST FEATURES)
  vcpkg_copy_tools(TOOL_NAMES dtrain-run dtrain-doctor dtrain-estimate AUTO_CLEAN)
endif()

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
# vcpkg wants the licence as share/dtrain/copyright; the copy CMake installs
# to share/doc/dtrain would be a second one.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/doc")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
