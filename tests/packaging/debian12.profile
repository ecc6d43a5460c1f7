# Conan profile for Debian 12 (bookworm): range-v3 and nlohmann_json are the
# Debian packages (librange-v3-dev, nlohmann-json3-dev), so nothing is fetched
# from ConanCenter. Used by run_conan.sh; see docs/packaging.md.
include(default)

[settings]
compiler.cppstd=20

[platform_requires]
range-v3/0.12.0
nlohmann_json/3.11.2
